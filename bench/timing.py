"""Side-by-side timing: warm-up, then interleaved timed calls.

Absolute times on a shared machine move with the load, so every figure the
benchmark reports is a ratio of calls timed in one process, interleaved (call
A, call B, call A, call B, ...) so that a burst of load hits all of them
alike. Per function: the minimum wall time over the timed calls (BENCH.md),
and the mean CPU time they used in this process and its children (the TFF
`worker_binary` computes in a child): CPU time barely moves with the load, so
its ratio is a second, steadier reading of the overhead.
"""

import dataclasses
import time
from collections.abc import Callable, Mapping

import psutil

WORKER_PROCESS_NAME = 'worker_binary'


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall and CPU time of one function's timed calls.

  Attributes:
    wall_seconds: The fastest call's wall time.
    cpu_seconds: The mean CPU time (user + system) of a call, over this
      process and its child processes.
    wall_samples: Every timed call's wall time, in order.
  """

  wall_seconds: float
  cpu_seconds: float
  wall_samples: tuple[float, ...]


def _cpu_seconds_with_children() -> float:
  """CPU time used so far by this process and its live children."""
  process = psutil.Process()
  total = sum(process.cpu_times()[:2])
  for child in process.children(recursive=True):
    try:
      total += sum(child.cpu_times()[:2])
    except psutil.NoSuchProcess:
      pass
  return total


def worker_pid(address: str) -> int:
  """The process id of this process's TFF `worker_binary` serving `address`.

  Args:
    address: The `host:port` that `fl_engine.runtime.local_runtime()`
      yields.

  Raises:
    RuntimeError: If no child `worker_binary` serves that port.
  """
  port_flag = '--port=' + address.rpartition(':')[2]
  for child in psutil.Process().children():
    try:
      if child.name() == WORKER_PROCESS_NAME and port_flag in child.cmdline():
        return child.pid
    except psutil.NoSuchProcess:
      continue
  raise RuntimeError(f'This process has no {WORKER_PROCESS_NAME} child '
                     f'serving {address}.')


# Warm-up calls: tracing, compilation, worker-side caches, and the
# in-process runtime's plan of a round (built at its second call,
# `fl_engine.runtime.in_process.PLAN_AFTER_CALLS`), which would
# otherwise count in the first timed call's CPU time and budget.
WARMUP_CALLS = 2


def time_interleaved(functions: Mapping[str, Callable[[], object]],
                     repeats: int, budget_seconds: float = 0.0,
                     max_repeats: int = 30) -> dict[str, Timing]:
  """Times each function `repeats` times, after `WARMUP_CALLS` warm-up
  calls each.

  Round r calls every function once, in the order given, before round r+1.
  With `budget_seconds`, more rounds run (at most `max_repeats` in all) as
  long as they fit in that time at the first timed round's pace: cheap
  measurements (a small model's round takes milliseconds, and their fastest
  of 3 varied by ~20 % from run to run) take more samples at little cost.

  Raises:
    ValueError: If `repeats` is not positive or `max_repeats` < `repeats`.
  """
  if repeats < 1:
    raise ValueError(f'repeats must be positive, got {repeats}.')
  if max_repeats < repeats:
    raise ValueError(f'max_repeats={max_repeats} is below repeats={repeats}.')
  for _ in range(WARMUP_CALLS):
    for function in functions.values():
      function()
  walls = {name: [] for name in functions}
  cpus = {name: [] for name in functions}
  done = 0
  while done < repeats:
    for name, function in functions.items():
      cpu_started = _cpu_seconds_with_children()
      started = time.perf_counter()
      function()
      walls[name].append(time.perf_counter() - started)
      cpus[name].append(_cpu_seconds_with_children() - cpu_started)
    done += 1
    if done == 1 and budget_seconds > 0:
      round_seconds = sum(w[0] for w in walls.values())
      affordable = (int(budget_seconds / round_seconds) if round_seconds > 0
                    else max_repeats)
      repeats = max(repeats, min(max_repeats, affordable))
  return {
      name: Timing(wall_seconds=min(walls[name]),
                   cpu_seconds=sum(cpus[name]) / done,
                   wall_samples=tuple(walls[name]))
      for name in functions
  }
