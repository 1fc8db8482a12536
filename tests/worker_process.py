"""What a running process (a TFF worker) was started with, read from /proc.

Not a test module: test modules import it (`from tests import
worker_process`).
"""


def environment(pid: int) -> dict[bytes, bytes]:
  """The environment process `pid` was started with."""
  with open(f'/proc/{pid}/environ', 'rb') as f:
    return dict(entry.split(b'=', 1)
                for entry in f.read().split(b'\0') if b'=' in entry)


def command_line(pid: int) -> list[str]:
  """The arguments process `pid` was started with."""
  with open(f'/proc/{pid}/cmdline', 'rb') as f:
    return [argument.decode() for argument in f.read().split(b'\0')
            if argument]
