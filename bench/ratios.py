"""TFF round time against the limit, per workload and cohort size.

For each cohort size, the limit (`bench.limit`) and the TFF rounds of
`bench.tff_rounds` run on the same random client data, timed side by side in
this process (`bench.timing.time_interleaved`). The limit runs twice: here,
with TensorFlow's oneDNN rewrites as this process has them (`limit_here`),
and in a child process with them off (`limit_onednn_off`,
`bench.limit.LimitInChild`); the faster is the limit (`limit_s`,
`limit_cpu_s`; `limit_onednn` says which setting it ran with). With the
`resident` round, its floor runs too (`tff_rounds.FloorProcess`: the same
shards, no work). Each row
holds, per round kind, the fastest wall time (`<kind>_s`), the mean CPU time
of driver plus worker (`<kind>_cpu_s`), and for the TFF rounds their ratios
to the limit (`<kind>_ratio`, `<kind>_cpu_ratio`; NaN if the limit's time is
0).

With `local_context` (`fl_engine.runtime.local_context()`), the
`resident` round also runs in it, in this process's own TensorFlow: the
same process on the same shards, the driver's default runtime. Like the
limit, it runs here (`local_here`) and with oneDNN off in a child process
(`local_onednn_off`, `bench.limit.RoundInChild`); the faster is `local`
(`local_onednn` says which): the limit's choice, which the driver makes per
task (`fl_common.tf_environment.ONEDNN_OFF_TASKS`). The other rounds run
on the runtime installed around the call (the bench's: TFF's worker,
`fl_engine.runtime.worker_runtime()`).
"""

import contextlib
import math
from collections.abc import Sequence
from typing import Any

from bench import limit
from bench import tff_rounds
from bench import timing
from bench import workloads
from fl_engine import runtime

LIMIT = 'limit'
LIMIT_HERE = 'limit_here'
LIMIT_ONEDNN_OFF = 'limit_onednn_off'
LOCAL = 'local'
LOCAL_HERE = 'local_here'
LOCAL_ONEDNN_OFF = 'local_onednn_off'


class _InContext:
  """Calls `round_fn` with `context` installed."""

  def __init__(self, context: Any, round_fn: Any):
    self._context = context
    self._round_fn = round_fn

  def __call__(self) -> None:
    with runtime.install(self._context):
      self._round_fn()


def _ratio(numerator: float, denominator: float) -> float:
  """`numerator / denominator`; NaN for a zero denominator (a CPU time below
  the clock's 10 ms resolution)."""
  return numerator / denominator if denominator > 0 else math.nan


def measure_ratios(workload: workloads.Workload, cohorts: Sequence[int],
                   repeats: int,
                   variants: Sequence[str] = tff_rounds.VARIANTS,
                   limit_in_child: bool = True,
                   budget_seconds: float = 0.0,
                   local_context: Any = None) -> list[dict[str, Any]]:
  """One row per cohort size: the limit's and each variant's times, ratios.

  The learning processes are built once and reused for every cohort size.
  Each cohort size's rounds are timed `repeats` times, or more while they
  fit in `budget_seconds` (`timing.time_interleaved`); `repeats` in a row
  is how many.
  With `limit_in_child` (a registered workload: the child builds it by name),
  the limit also runs with oneDNN off in a child process, unless this
  process has it off already.

  Raises:
    ValueError: If a cohort size is not positive, `variants` is empty or
      holds an unknown variant, `repeats` is not positive, or
      `limit_in_child` is set for a workload that is not registered.
  """
  if not variants:
    raise ValueError('variants must not be empty.')
  for num_clients in cohorts:
    if num_clients < 1:
      raise ValueError(f'Cohort sizes must be positive, got {num_clients}.')
  here = limit.onednn_setting()
  in_child = limit_in_child and here != 'off'
  if in_child:
    workloads.get_workload(workload.name)
  processes = {v: tff_rounds.build_process(workload, v) for v in variants
               if v not in tff_rounds.PER_COHORT_VARIANTS}
  rows = []
  for num_clients in cohorts:
    arrays = workload.client_arrays(num_clients)
    with contextlib.ExitStack() as stack:
      rounds = {LIMIT_HERE: limit.LimitRound(workload, arrays)}
      if in_child:
        rounds[LIMIT_ONEDNN_OFF] = stack.enter_context(
            limit.LimitInChild(workload.name, num_clients))
      for variant in variants:
        process = processes.get(variant) or tff_rounds.build_process(
            workload, variant, arrays)
        rounds[variant] = tff_rounds.round_for(process, workload, arrays,
                                               variant)
      if 'resident' in rounds:
        rounds[tff_rounds.FLOOR] = tff_rounds.round_for(
            tff_rounds.FloorProcess(rounds['resident'].process), workload,
            arrays, tff_rounds.FLOOR)
        if local_context is not None:
          with runtime.install(local_context):
            local_round = tff_rounds.round_for(
                rounds['resident'].process, workload, arrays, 'resident')
          rounds[LOCAL_HERE] = _InContext(local_context, local_round)
          if in_child:
            rounds[LOCAL_ONEDNN_OFF] = stack.enter_context(
                limit.RoundInChild(limit.LOCAL, workload.name, num_clients))
      timings = timing.time_interleaved(rounds, repeats,
                                        budget_seconds=budget_seconds)
    limits = [k for k in (LIMIT_HERE, LIMIT_ONEDNN_OFF) if k in timings]
    fastest = min(limits, key=lambda k: timings[k].wall_seconds)
    row = {'workload': workload.name, 'clients': num_clients,
           'repeats': len(timings[fastest].wall_samples),
           'limit_onednn': here if fastest == LIMIT_HERE else 'off'}
    timings[LIMIT] = timings[fastest]
    locals_ = [k for k in (LOCAL_HERE, LOCAL_ONEDNN_OFF) if k in timings]
    if locals_:
      fastest_local = min(locals_, key=lambda k: timings[k].wall_seconds)
      timings[LOCAL] = timings[fastest_local]
      row['local_onednn'] = here if fastest_local == LOCAL_HERE else 'off'
    for name, t in timings.items():
      row[f'{name}_s'] = t.wall_seconds
      row[f'{name}_cpu_s'] = t.cpu_seconds
      if name not in (LIMIT, *limits, *locals_):
        row[f'{name}_ratio'] = _ratio(t.wall_seconds,
                                      timings[LIMIT].wall_seconds)
        row[f'{name}_cpu_ratio'] = _ratio(t.cpu_seconds,
                                          timings[LIMIT].cpu_seconds)
    rows.append(row)
  return rows


def per_client_rows(rows: Sequence[dict[str, Any]],
                    kinds: Sequence[str]) -> list[dict[str, Any]]:
  """Round time per client at each cohort size, and its drift.

  For each row of `measure_ratios` and each round kind in `kinds`:
  `<kind>_ms_per_client` (wall time / clients) and `<kind>_vs_smallest`
  (that per-client time over the same workload's at its smallest cohort): 1.0
  throughout when round time grows linearly with the cohort.
  """
  smallest = {}
  for row in sorted(rows, key=lambda r: r['clients']):
    smallest.setdefault(row['workload'], row)
  scaling = []
  for row in rows:
    base = smallest[row['workload']]
    out = {'workload': row['workload'], 'clients': row['clients']}
    for kind in kinds:
      per_client = row[f'{kind}_s'] / row['clients']
      out[f'{kind}_ms_per_client'] = 1000 * per_client
      out[f'{kind}_vs_smallest'] = per_client / (
          base[f'{kind}_s'] / base['clients'])
    scaling.append(out)
  return scaling
