"""Runs a command and records the peak memory of it and its child processes.

    python results/adabest/measure_peak_memory.py --output=peak.json -- \
        python run_experiment.py --task=synthetic_partitioned ...

Every `--interval` seconds, reads `VmHWM` (the kernel's resident-set
high-water mark) and `VmRSS` of the command and of every descendant (the
driver's `worker_binary`) from `/proc/<pid>/status`, and keeps, per process,
the largest `VmHWM` seen, plus the largest simultaneous sum of `VmRSS` over
the tree. `VmHWM` is monotone, so the last sample before a process exits is
its peak (up to what it allocates in the final `--interval`). Writes JSON with
the peaks in MiB and the command's exit code, and exits with that code.
"""

import argparse
import json
import subprocess
import sys
import time
from typing import Optional

import psutil


def _status_kib(pid: int, field: str) -> Optional[int]:
  """A `kB` field of `/proc/<pid>/status`, or None if the process is gone."""
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1])
  except (FileNotFoundError, ProcessLookupError):
    return None
  return None


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--output', required=True, help='JSON file to write.')
  parser.add_argument('--interval', type=float, default=1.0,
                      help='Seconds between samples.')
  parser.add_argument('command', nargs=argparse.REMAINDER,
                      help='The command, after --.')
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    parser.error('no command given after --')
  if args.interval <= 0:
    parser.error(f'--interval must be positive, got {args.interval}')
  process = subprocess.Popen(command)
  root = psutil.Process(process.pid)
  peaks: dict[int, dict] = {}
  peak_tree_rss_kib = 0
  while process.poll() is None:
    try:
      tree = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
      break
    tree_rss_kib = 0
    for proc in tree:
      hwm, rss = _status_kib(proc.pid, 'VmHWM'), _status_kib(proc.pid, 'VmRSS')
      if hwm is None or rss is None:
        continue
      tree_rss_kib += rss
      entry = peaks.setdefault(proc.pid, {'name': proc.name(), 'hwm_kib': 0})
      entry['hwm_kib'] = max(entry['hwm_kib'], hwm)
    peak_tree_rss_kib = max(peak_tree_rss_kib, tree_rss_kib)
    time.sleep(args.interval)
  exit_code = process.wait()
  result = {
      'command': command,
      'exit_code': exit_code,
      'processes': [
          {'pid': pid, 'name': p['name'], 'peak_rss_mib': p['hwm_kib'] / 1024}
          for pid, p in sorted(peaks.items())
      ],
      'peak_simultaneous_tree_rss_mib': peak_tree_rss_kib / 1024,
  }
  with open(args.output, 'w') as f:
    json.dump(result, f, indent=2)
  return exit_code


if __name__ == '__main__':
  sys.exit(main())
