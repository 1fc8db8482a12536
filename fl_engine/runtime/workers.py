"""The local `worker_binary` processes: start, stop, share the cores.

TFF's own `set_sync_local_cpp_execution_context` starts a `worker_binary`
subprocess that outlives Python and keeps the parent's stdout open, which
hangs pipes and CI. Here the package starts the executor service itself, so it
owns the process: the worker is started under `setpriv --pdeathsig KILL`, so
the kernel kills it when the Python process dies for any reason (even
`SIGKILL`), and an `atexit` hook stops anything still running.
"""

import atexit
import os
import shutil
import subprocess
from typing import Optional

import portpicker
import tensorflow_federated as tff

WORKER_BINARY_PATH = os.path.join(
    os.path.dirname(tff.__file__), 'data', 'worker_binary'
)
# `exec`) before it becomes `worker_binary`. Setting it in the child from a
# `preexec_fn` instead would make `subprocess` fork for real, which runs
# gRPC's fork handlers in the child: with a gRPC call in flight on another
# thread the child once deadlocked in them (`__run_postfork_handlers`),
# before its `exec`. Without a `preexec_fn`, CPython starts the child with
# `vfork`, which runs no fork handlers.
_DIE_WITH_PARENT = ('setpriv', '--pdeathsig', 'KILL')
# glibc malloc settings for a worker started here: large buffers (a round's
# model-sized values: the state parsed from the request, each client's
# variables and update, the result) come from a heap kept mapped instead of
# fresh `mmap`s whose every page faults in zeroed and is unmapped when freed.
# `perf` on the worker: page faults and page zeroing were ~20 % of its CPU in
# a 1-client EMNIST CNN round; with these, its CPU per round fell 35 %
# (46 -> 30 ms) and the round 10-20 %. The worker keeps its peak heap.
_WORKER_MALLOC_ENV = {
    'MALLOC_MMAP_THRESHOLD_': str(1 << 30),
    'MALLOC_TRIM_THRESHOLD_': str(1 << 32),
    'MALLOC_TOP_PAD_': str(1 << 28),
}
_started_workers: list[subprocess.Popen] = []


def cores_available() -> int:
  """How many cores this process (and a worker it starts) may run on."""
  return len(os.sched_getaffinity(0))


def worker_intra_op_threads(max_concurrent_clients: int) -> int:
  """The intra-op threads each of a worker's client computations gets.

  TensorFlow gives every session (one per client computation) a pool of one
  thread per core for its large ops, so `max_concurrent_clients` concurrent
  clients would run that many pools on the same cores. The worker instead
  gets `TF_NUM_INTRAOP_THREADS` = cores / concurrent clients (at least 1;
  1 with no limit), and parallelism comes from running clients side by side.
  Measured with `bench/` on 2 cores, 50 clients per round, two clients at
  once: a full driver round went from 1.27x to 1.03x the limit (EMNIST CNN)
  and from 1.36x to 1.26x (Stack Overflow LSTM); its CPU time fell 6-18 %.

  Args:
    max_concurrent_clients: As in `start_worker` (non-positive: no limit).
  """
  if max_concurrent_clients <= 0:
    return 1
  return max(1, cores_available() // max_concurrent_clients)


def start_worker(
    port: Optional[int] = None, max_concurrent_clients: Optional[int] = None
) -> tuple[subprocess.Popen, str]:
  """Starts one `worker_binary` on localhost; returns it and its address.

  Args:
    port: The port to serve on; a free one is picked when `None`.
    max_concurrent_clients: The worker's `--max_concurrent_computation_calls`:
      how many client computations run at once (non-positive: no limit).
      `None`: one per core (`cores_available()`), each with its share of
      the cores (`worker_intra_op_threads`). With no limit, every client of
      a round starts at once and they contend for the cores and memory (one
      TensorFlow session each): measured with `bench/` on the EMNIST CNN, 30
      clients per round on 1 core (`taskset -c 0`), one per core took 0.96x
      the limit's time and no limit 40x.

  Raises:
    RuntimeError: If `setpriv` (util-linux), which starts the worker, is
      missing.
  """
  if shutil.which(_DIE_WITH_PARENT[0]) is None:
    raise RuntimeError(
        f'`{_DIE_WITH_PARENT[0]}` (util-linux) is not on PATH; the TFF worker'
        ' is started through it so that it dies with this process. Install'
        ' util-linux (apt-get install util-linux).')
  if max_concurrent_clients is None:
    max_concurrent_clients = cores_available()
  threads = worker_intra_op_threads(max_concurrent_clients)
  port = port or portpicker.pick_unused_port()
  process = subprocess.Popen(
      [
          *_DIE_WITH_PARENT,
          WORKER_BINARY_PATH,
          f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_clients}',
      ],
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      env={**os.environ, **_WORKER_MALLOC_ENV,
           'TF_NUM_INTRAOP_THREADS': str(threads)},
  )
  _started_workers.append(process)
  return process, f'localhost:{port}'


def stop_worker(process: subprocess.Popen) -> None:
  """Stops a worker started by `start_worker` and reaps it."""
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
  if process in _started_workers:
    _started_workers.remove(process)


@atexit.register
def stop_all_workers() -> None:
  """Stops every worker this process started (also registered at exit)."""
  for process in list(_started_workers):
    stop_worker(process)

