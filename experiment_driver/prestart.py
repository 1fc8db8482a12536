"""Driver runs forked from a Python that has imported the driver already.

Each point of a sweep is `python run_experiment.py ...` in a process of its
own, so that a crash, a leak or a hung run is that point's alone. Each such
process spends ~10 s importing TensorFlow, TFF and what TFF pulls in before
it reads its first flag: at the smoke scale more than its rounds, and over
the local reproductions (~1,700 runs) hours. A `Prestarter` keeps a server
process that has done those imports, and forks it for each run. The run is
still a process of its own, with its own pid, exit code, log files and
signals; it starts at its first flag instead of from nothing.

What the server imports: TensorFlow through `fl_common.tf_environment`
(Keras 2, a quiet terminal, oneDNN), TFF, and every module
`run_experiment.py` imports (`driver_imports`), so that a run starts at its
first flag. None of them runs a TensorFlow op, so TensorFlow's runtime (its
thread pools) starts in each run, as it does in a fresh process. Importing
TFF starts one thread, the event loop of its default context; a forked
child has only the thread that forked it, so the server drops that context
and ends the thread first (`default_context.end_import_thread`), as each
driver run drops it on starting.

One server per oneDNN setting: TensorFlow reads `TF_ENABLE_ONEDNN_OPTS`
when it is imported, and the driver chooses it by task
(`tf_environment.ONEDNN_OFF_TASKS`). And one per environment, for what the
imports read of it; a run's child then takes the caller's environment as
its own (`os.environ`), so that what the run reads later is the caller's.
Variables that change from call to call and that nothing reads at import
(`PER_CALL_ENVIRONMENT`: pytest's name of the running test) start no new
server: with them, every test's first driver run paid the imports again.

The server also generates the Synthetic tasks' data at their default
settings (`tasks.generate_common_data`: NumPy only, no TensorFlow op), which
each run of those tasks would otherwise generate first; the runs inherit it.

A command this cannot run as a fresh process would (not this Python's
`run_experiment.py`, or asking for library output with `--verbosity`, which
`tf_environment` reads at import) runs as a plain subprocess: `run` takes
any command.

A run reseeds Python's and NumPy's global generators from the OS, as a
fresh process is seeded; every other seed is the run's own flag. `ps` and
`pgrep -f` show a forked run with the server's command line (`python -m
experiment_driver.prestart`), not `run_experiment.py`: its log files and run
directory name it.

Below Python's public API, in the forked child only: `threading._shutdown`
joins the run's non-daemon threads before its `atexit` handlers run, as a
Python process does at exit (and as `multiprocessing` does in its children).
"""

import ast
import atexit
import importlib
import json
import os
import random
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Optional

from fl_common import tf_environment

_REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(_REPO_DIR, 'run_experiment.py')


def driver_imports() -> list[str]:
  """The modules `run_experiment.py` imports at its top level."""
  with open(DRIVER) as f:
    tree = ast.parse(f.read(), DRIVER)
  names = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names += [f'{node.module}.{alias.name}' for alias in node.names]
  return names


# Set anew for each call by the caller's framework, read by no import.
PER_CALL_ENVIRONMENT = ('PYTEST_CURRENT_TEST',)


def onednn_key(command: Sequence[str],
               env: Mapping[str, str]) -> Optional[str]:
  """The server a command runs in: `'off'` or `'default'` for a run of
  this Python's driver, None for one that must run as a fresh process."""
  if len(command) < 2 or command[0] != sys.executable or (
      os.path.abspath(command[1]) != DRIVER):
    return None
  if (env.get(tf_environment.VERBOSE, '') not in ('', '0')
      or tf_environment.verbose(['', *command[2:]])):
    return None
  if tf_environment.ONEDNN in env:
    return 'default'  # the user's setting, the same for every run
  task = tf_environment.flag_value(['', *command[2:]], 'task')
  return 'off' if task in tf_environment.ONEDNN_OFF_TASKS else 'default'


class Prestarter:
  """Runs commands; driver runs fork from a prestarted server.

  A server serves one environment and oneDNN setting (what TensorFlow read
  when the server imported it); another starts for another, and at most
  `max_idle` servers with no run are kept. Thread-safe: `run` may be called
  from several threads at once (the sweep's `--parallel`). `close` (or
  leaving the `with` block) stops the servers; a server also ends when this
  process does (end of its input).
  """

  def __init__(self, max_idle: int = 2):
    self._lock = threading.Lock()
    self._servers: dict[tuple, _Server] = {}  # least recently used first
    self._max_idle = max_idle

  def __enter__(self) -> 'Prestarter':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    with self._lock:
      servers, self._servers = list(self._servers.values()), {}
    for server in servers:
      server.close()

  def _server(self, key: str, env: Mapping[str, str]) -> '_Server':
    full_key = (key, tuple(sorted(
        (name, value) for name, value in env.items()
        if name not in PER_CALL_ENVIRONMENT)))
    retired = []
    with self._lock:
      server = self._servers.pop(full_key, None)
      if server is None or not server.alive():
        server = _Server(key, env)
      self._servers[full_key] = server  # now the most recently used
      idle = [k for k, s in self._servers.items() if s.idle()]
      for k in idle[:max(0, len(idle) - self._max_idle)]:
        retired.append(self._servers.pop(k))
    for old in retired:
      old.close()
    return server

  def run(self, command: Sequence[str], stdout_path: str, stderr_path: str,
          cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
          timeout: Optional[float] = None) -> int:
    """Runs `command` to its end as `subprocess.run` would (stdin from
    /dev/null, stdout and stderr to the two files, truncated); returns its
    exit code (`-N` if signal N ended it).

    Raises:
      subprocess.TimeoutExpired: After `timeout` seconds; the run is killed.
      OSError: If the command cannot be started.
    """
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd or os.getcwd())
    key = onednn_key(command, env)
    if key is not None:
      code = self._server(key, env).run(list(command), stdout_path,
                                        stderr_path, cwd, timeout, env)
      if code is not None:
        return code
    with open(stdout_path, 'w') as out, open(stderr_path, 'w') as err:
      return subprocess.run(list(command), stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                            timeout=timeout, check=False).returncode


class _Server:
  """The client side of one server process: a request is one JSON line on
  its stdin; it answers with the run's pid, then with its exit code."""

  def __init__(self, key: str, env: Mapping[str, str]):
    env = dict(env)
    if key == 'off':
      env[tf_environment.ONEDNN] = '0'
    # From the repository, as a fresh driver's sys.path starts.
    self._process = subprocess.Popen(
        [sys.executable, '-m', 'experiment_driver.prestart'], cwd=_REPO_DIR,
        env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.DEVNULL)
    self._lock = threading.Lock()
    self._waiting: dict[int, dict] = {}
    self._next_id = 0
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def alive(self) -> bool:
    return self._process.poll() is None

  def idle(self) -> bool:
    with self._lock:
      return not self._waiting

  def _read(self) -> None:
    for line in self._process.stdout:
      answer = json.loads(line)
      with self._lock:
        slot = self._waiting.get(answer['id'])
        if slot is None:
          continue
        slot.update(answer)
        slot['started'].set()
        if 'exit' in answer:
          del self._waiting[answer['id']]
          slot['done'].set()
    with self._lock:  # the server is gone: nobody is answered any more
      waiting, self._waiting = self._waiting, {}
    for slot in waiting.values():
      slot['started'].set()
      slot['done'].set()

  def run(self, command, stdout_path, stderr_path, cwd, timeout,
          env) -> Optional[int]:
    """The run's exit code, or None if the server could not run it."""
    slot = {'started': threading.Event(), 'done': threading.Event()}
    with self._lock:
      request_id = self._next_id
      self._next_id += 1
      self._waiting[request_id] = slot
      try:
        self._process.stdin.write(json.dumps(
            {'id': request_id, 'argv': command[2:], 'cwd': cwd,
             'stdout': stdout_path, 'stderr': stderr_path,
             'env': dict(env)}) + '\n')
        self._process.stdin.flush()
      except (BrokenPipeError, ValueError):
        del self._waiting[request_id]
        return None
    if not slot['done'].wait(timeout):
      slot['started'].wait()  # the server may still be importing
      with self._lock:
        pid = slot.get('pid')
      if pid is not None and not slot['done'].is_set():
        os.kill(pid, signal.SIGKILL)
      slot['done'].wait()
      raise subprocess.TimeoutExpired(command, timeout)
    return slot.get('exit')

  def close(self) -> None:
    try:
      self._process.stdin.close()  # the server ends at the end of its input
    except BrokenPipeError:
      pass
    self._process.wait()


# --- The server: `python -m experiment_driver.prestart`, fed by `_Server` ---


def _child(request: dict) -> None:
  """In the forked child: becomes `python run_experiment.py <argv>`."""
  code = 1
  try:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request['stdout'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                  0o644)
    err = os.open(request['stderr'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                  0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
      os.dup2(fd, target)
      os.close(fd)
    # New streams on the new descriptors (the server's hold its protocol).
    sys.stdin = open(0, closefd=False)  # pylint: disable=consider-using-with
    sys.stdout = open(1, 'w', closefd=False)  # pylint: disable=consider-using-with
    sys.stderr = open(2, 'w', buffering=1, errors='backslashreplace',  # pylint: disable=consider-using-with
                      closefd=False)
    os.chdir(request['cwd'])
    # The caller's environment (the server's differs at most in
    # `PER_CALL_ENVIRONMENT`), with the oneDNN setting TensorFlow was
    # imported with, which a fresh driver sets itself by task;
    # `os.environ` sets the C library's too.
    env = dict(request['env'])
    if tf_environment.ONEDNN in os.environ:
      env.setdefault(tf_environment.ONEDNN, os.environ[tf_environment.ONEDNN])
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [DRIVER, *request['argv']]
    # Seeded from the OS as a fresh process is, not with the server's state
    # (`portpicker` picks a worker's port with `random`: two runs forked
    # from one server would otherwise try the same ports in the same order).
    random.seed()
    if 'numpy' in sys.modules:
      sys.modules['numpy'].random.seed()
    try:
      runpy.run_path(DRIVER, run_name='__main__')
      code = 0
    except SystemExit as e:
      code = (e.code if isinstance(e.code, int) else
              0 if e.code is None else (print(e.code, file=sys.stderr) or 1))
    except KeyboardInterrupt:
      traceback.print_exc()
      code = -signal.SIGINT
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    if code < 0:  # ended by a signal, as a fresh Python would be
      signal.signal(-code, signal.SIG_DFL)
      os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)  # pylint: disable=protected-access


def _serve() -> None:
  """Reads requests until end of input; forks a child for each and answers
  with its exit code when it ends."""
  from fl_common import default_context  # pylint: disable=g-import-not-at-top
  default_context.end_import_thread()
  for name in driver_imports():
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:  # `from package import name`
      if e.name != name:  # a module it imports is missing: say so
        raise
      importlib.import_module(name.rsplit('.', 1)[0])
  # The Synthetic tasks' generated clients, in NumPy: every run inherits them.
  importlib.import_module('tasks').generate_common_data()
  # Ctrl-C reaches the runs (the same process group) and ends each as it
  # ends a fresh driver; the server goes when its client closes its input.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  lock = threading.Lock()

  def answer(request_id: int, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    with lock:
      print(json.dumps({'id': request_id,
                        'exit': os.waitstatus_to_exitcode(status)}),
            flush=True)

  for line in sys.stdin:
    request = json.loads(line)
    with lock:  # no answer is half-written when the child is forked
      pid = os.fork()
      if pid == 0:
        _child(request)
      print(json.dumps({'id': request['id'], 'pid': pid}), flush=True)
    threading.Thread(target=answer, args=(request['id'], pid),
                     daemon=True).start()
  # End of input: the client is gone. Runs still going finish on their own.


if __name__ == '__main__':
  _serve()
