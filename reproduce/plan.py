"""What a grid asks of a cluster: its runs and their device-hours, estimated.

    python -m reproduce large_cohort fig_catastrophic --scale=paper --plan

Each run's training cost is estimated as (per-client round cost of its
model) x (clients per round) x (rounds), with the per-client cost taken from
the committed benchmark (`make bench`: `results/bench/bench.json`, its
"scaling" table, the package's in-process rounds at the largest cohort
measured, on the machine that ran it). Each task maps to the benchmark
workload that trains its model; a task whose model has no workload is
estimated with the nearest one and says so, and one with no near workload is
listed as not estimated. Evaluation rounds, start-up and data preparation
are not counted. The figures are that machine's (its CPUs, or its GPU when
the benchmark ran on one): what a user asks the cluster for scales with the
ratio of its devices' speed to the benchmark's.
"""

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Optional

from reproduce import sweep

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_FILE = os.path.join(_REPO, 'results', 'bench', 'bench.json')

# task -> (benchmark workload, whether it is the task's own model).
WORKLOAD_OF_TASK = {
    'emnist': ('emnist_cnn', True),
    'synthetic': ('synthetic_lr', True),
    'synthetic_partitioned': ('synthetic_lr', True),
    'stackoverflow': ('stackoverflow_lstm', True),
    # Nearest workloads: the same kind of model on similar inputs.
    'emnist_l': ('emnist_linear', False),  # AdaBest's MLP 2x100, dense
    'leaf_shakespeare': ('stackoverflow_lstm', False),  # a character LSTM
    'shakespeare': ('stackoverflow_lstm', False),
}
# The driver's default clients per round (`--clients_per_round` unset).
DEFAULT_CLIENTS_PER_ROUND = 10


@dataclasses.dataclass(frozen=True)
class Row:
  task: str
  workload: Optional[str]  # None: not estimated
  own_model: bool
  runs: int
  client_rounds: int  # sum over runs of clients per round x rounds
  hours: Optional[float]


def _flags(point: sweep.SweepPoint) -> dict[str, str]:
  return dict(a[2:].split('=', 1) for a in point.command
              if a.startswith('--') and '=' in a)


def per_client_ms(bench_path: str = BENCH_FILE) -> dict[str, tuple[float,
                                                                   int]]:
  """`{workload: (package ms per client, at that many clients)}` at the
  largest cohort each workload was measured at."""
  try:
    with open(bench_path) as f:
      rows = json.load(f).get('scaling', [])
  except (OSError, ValueError) as e:
    raise ValueError(f'no benchmark figures to plan with: {bench_path}'
                     f' ({getattr(e, "strerror", None) or e}); `make bench`'
                     ' writes them') from None
  costs = {}
  for row in rows:
    best = costs.get(row['workload'])
    if best is None or row['clients'] > best[1]:
      costs[row['workload']] = (float(row['package_ms_per_client']),
                                int(row['clients']))
  return costs


def estimate(points: Sequence[sweep.SweepPoint],
             bench_path: str = BENCH_FILE) -> list[Row]:
  """One row per task of the grid, in the order the tasks first appear."""
  costs = per_client_ms(bench_path)
  by_task: dict[str, list[int]] = {}
  for point in points:
    flags = _flags(point)
    clients = int(flags.get('clients_per_round', DEFAULT_CLIENTS_PER_ROUND))
    by_task.setdefault(flags.get('task', '?'), []).append(
        clients * point.total_rounds)
  rows = []
  for task, client_rounds in by_task.items():
    workload, own = WORKLOAD_OF_TASK.get(task, (None, False))
    if workload not in costs:
      workload = None
    hours = (costs[workload][0] * sum(client_rounds) / 3.6e6
             if workload else None)
    rows.append(Row(task, workload, own, len(client_rounds),
                    sum(client_rounds), hours))
  return rows


def lines(title: str, points: Sequence[sweep.SweepPoint],
          bench_path: str = BENCH_FILE) -> list[str]:
  """The plan as printed: one line per task, the total, the figures used."""
  rows = estimate(points, bench_path)
  costs = per_client_ms(bench_path)
  unfinished = sum(not sweep.is_finished(p) for p in points)
  out = [f'{title}: {len(points)} runs ({unfinished} not finished)']
  out.append(f'  {"task":22} {"workload":20} {"runs":>5} '
             f'{"client-rounds":>14} {"device-hours":>13}')
  for row in rows:
    workload = ('-' if row.workload is None else
                row.workload + ('' if row.own_model else '*'))
    hours = 'not estimated' if row.hours is None else f'{row.hours:,.1f}'
    out.append(f'  {row.task:22} {workload:20} {row.runs:>5} '
               f'{row.client_rounds:>14,} {hours:>13}')
  estimated = [r.hours for r in rows if r.hours is not None]
  out.append(f'  {"total":22} {"":20} {len(points):>5} '
             f'{sum(r.client_rounds for r in rows):>14,} '
             f'{sum(estimated):>13,.1f}'
             + ('' if len(estimated) == len(rows) else
                ' (tasks not estimated left out)'))
  used = sorted({r.workload for r in rows if r.workload})
  if used:
    out.append('  per-client round cost: ' + '; '.join(
        f'{w} {costs[w][0]:.1f} ms at {costs[w][1]} clients' for w in used)
               + f' ({os.path.relpath(bench_path, _REPO)}, "scaling",'
               ' the package\'s in-process rounds on the benchmark\'s'
               ' machine)')
  if any(r.workload and not r.own_model for r in rows):
    out.append('  * nearest workload: the task\'s own model is not'
               ' benchmarked')
  missing = [r.task for r in rows if r.workload is None]
  if missing:
    out.append(f'  not estimated: {", ".join(missing)} (no benchmark'
               ' workload trains a model like theirs)')
  out.append('  training rounds only: evaluation, start-up and data'
             ' preparation are not counted')
  return out
