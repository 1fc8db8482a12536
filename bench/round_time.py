"""The package's benchmark (`make bench`): TFF rounds against BENCH.md's limit.

    python -m bench.round_time                 # everything, ~30 min idle
    python -m bench.round_time --quick         # smaller, ~5 min idle
    python -m bench.round_time --sections=ratios --workloads=emnist_cnn \\
        --cohorts=10,50 --small_model_workloads= --repeats=3 \\
        --output=/tmp/bench.json

Sections, printed as tables in one run:

* `ratios` — round time of the limit (`bench.limit`: the faster of oneDNN
  on and off) and of four TFF
  FedAvg rounds (`bench.tff_rounds`: TFF's stock `build_weighted_fed_avg`,
  the package's FedAvg, the package's full round with the driver's
  aggregator and diagnostics, and that round on fused shards) for each
  workload (`bench.workloads`: EMNIST CNN and Stack Overflow LSTM at
  `--cohorts`; EMNIST's and Synthetic's logistic regressions at
  `--small_model_cohorts`) and cohort size, measured side by side in this
  process: the ratio of each TFF round to the limit, in wall time (the
  fastest of at least `--repeats` calls after a warm-up, more while they
  fit in `--budget_seconds`) and in CPU time of driver
  plus worker (steadier when other jobs share the machine). Then the same
  runs as time per client at each cohort size (linear scaling keeps it
  constant).
* `cores` — the speed-up of the limit and of the full round from one core
  to all cores (`bench.cores`: a process pinned to one core vs one with every
  core).
* `long_run` — the driver's resident memory over a 5,000-round Synthetic
  run at the driver's defaults (`bench.long_run`): flat after a warm-up,
  within `long_run.BOUND_MB`.
* `e2e` — a Synthetic driver run at `--e2e_clients` per round from the
  command line (`bench.e2e`): wall time, start-up, mean round, the
  projection to 1,500 rounds, and the mean round over the limit's time for
  the same clients' work.
* `eval` — the time of one evaluation of Synthetic's 1,000 test clients,
  scored per client and pooled (`--noper_client_eval`), from two driver
  runs as GeL's reproductions make them (`bench.evaluation`), and the final
  test accuracy and loss of each (the same: pooling changes only the time).
* `memory` — peak resident memory of the driver and its worker for FedAvg
  (stateless, one call per client and fused) and AdaBest (stateful clients,
  states in
  `fl_engine.client_state_store`) through the package's training loop, at
  each `--memory_clients` (`bench.memory`).

The TFF rounds of the ratios section run on TFF's worker
(`fl_engine.runtime.worker_runtime`, the server state kept on it
between rounds: `fl_engine.worker_state`), except `local`: the
`resident` round in this process's own TensorFlow
(`fl_engine.runtime.local_context`), the driver's default runtime.
The e2e section runs the driver with its default runtime (in-process).

`--output=FILE.json|FILE.csv` also writes every table to a file.
"""

import math
from collections.abc import Sequence


from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from bench import cores
from bench import e2e
from bench import evaluation
from bench import long_run
from bench import memory
from bench import ratios
from bench import report
from bench import tff_rounds
from bench import workloads
from fl_engine import runtime

SECTIONS = ('ratios', 'cores', 'memory', 'long_run', 'e2e', 'eval')

_SECTIONS = flags.DEFINE_list(
    'sections', list(SECTIONS), f'Which of {", ".join(SECTIONS)} to run.')
_WORKLOADS = flags.DEFINE_list(
    'workloads', ['emnist_cnn', 'stackoverflow_lstm'],
    f'Workloads of the ratios section, from {sorted(workloads.WORKLOADS)},'
    ' at --cohorts.')
_COHORTS = flags.DEFINE_list(
    'cohorts', ['10', '50', '200'], 'Clients per round in the ratios section.')
_SMALL_MODEL_WORKLOADS = flags.DEFINE_list(
    'small_model_workloads', ['emnist_linear', 'synthetic_lr'],
    'Workloads of the ratios section at --small_model_cohorts: models whose'
    ' rounds are mostly the runtime\'s per-client cost, the case of fused'
    ' shards.')
_SMALL_MODEL_COHORTS = flags.DEFINE_list(
    'small_model_cohorts', ['20', '100', '1000'],
    'Clients per round of --small_model_workloads.')
_REPEATS = flags.DEFINE_integer(
    'repeats', 3, 'Timed calls per measurement (after the warm-up calls); the '
    'fastest counts.', lower_bound=1)
_BUDGET_SECONDS = flags.DEFINE_float(
    'budget_seconds', 20.0, 'Ratios section: a cohort\'s rounds are timed '
    '--repeats times, or more (up to 30) while they fit in this many seconds '
    '(a small model\'s 20-client rounds take milliseconds; their fastest of 3 '
    'varied by ~20 % between runs); the table\'s "repeats" column says how '
    'many. 0: exactly --repeats.', lower_bound=0.0)
_SPEEDUP_WORKLOAD = flags.DEFINE_string(
    'speedup_workload', 'emnist_cnn', 'Workload of the cores section.')
_SPEEDUP_CLIENTS = flags.DEFINE_integer(
    'speedup_clients', 50, 'Clients per round in the cores section.',
    lower_bound=1)
_MEMORY_WORKLOAD = flags.DEFINE_string(
    'memory_workload', 'emnist_linear', 'Workload of the memory section.')
_MEMORY_CLIENTS = flags.DEFINE_list(
    'memory_clients', ['100', '1000'],
    'Population sizes of the memory section; every client takes part in '
    'every round.')
_MAX_CLIENTS_PER_CALL = flags.DEFINE_integer(
    'max_clients_per_call', 50,
    'The local runtime runs a cohort in slices of at most this many clients '
    '(fl_engine.runtime.local_runtime): the worker holds several '
    'model-sized values per client of a call, ~23 GB for 200 clients of the '
    'Stack Overflow LSTM. The memory section measures with and without '
    'slices.', lower_bound=1)
_E2E_CLIENTS = flags.DEFINE_integer(
    'e2e_clients', 800, 'Clients per round of the e2e section.',
    lower_bound=1)
_E2E_ROUNDS = flags.DEFINE_integer(
    'e2e_rounds', 100, 'Rounds of the e2e section\'s driver run (projected '
    f'to {e2e.PROJECTED_ROUNDS}).', lower_bound=1)
_EVAL_ROUNDS = flags.DEFINE_integer(
    'eval_rounds', 20, 'Rounds of each driver run of the eval section, each'
    ' evaluated.', lower_bound=2)
_QUICK = flags.DEFINE_bool(
    'quick', False, 'Quicker settings: cohorts 10,50 (small models 20,100), 2'
    ' repeats, speed-up at '
    '10 clients, memory at 100 clients (overrides those flags).')
_OUTPUT = flags.DEFINE_string(
    'output', None, 'Also write every table to this .json or .csv file.')

_TFF_KINDS = tff_rounds.VARIANTS + (tff_rounds.FLOOR, ratios.LOCAL)
_RATIO_COLUMNS = [('workload', 'workload', 's'), ('clients', 'clients', 'd'),
                  ('repeats', 'repeats', 'd'), ('limit_s', 'limit s', '.3f'),
                  ('limit_onednn', 'oneDNN', 's')]
for _kind in _TFF_KINDS:
  _RATIO_COLUMNS += [(f'{_kind}_s', f'{_kind} s', '.3f'),
                     (f'{_kind}_ratio', 'x limit', '.2f'),
                     (f'{_kind}_cpu_ratio', 'cpu x', '.2f')]
_RATIO_COLUMNS.append(('local_onednn', 'local oneDNN', 's'))
_SCALING_COLUMNS = [('workload', 'workload', 's'), ('clients', 'clients', 'd')]
for _kind in (ratios.LIMIT, 'package'):
  _SCALING_COLUMNS += [(f'{_kind}_ms_per_client', f'{_kind} ms/client', '.1f'),
                       (f'{_kind}_vs_smallest', 'vs smallest', '.2f')]
_SPEEDUP_COLUMNS = [('workload', 'workload', 's'), ('clients', 'clients', 'd'),
                    ('kind', 'round', 's'), ('one_core_s', '1 core s', '.3f'),
                    ('all_cores_s', 'all cores s', '.3f'),
                    ('cores', 'cores', 'd'), ('speedup', 'speed-up', '.2f')]
_E2E_COLUMNS = [('clients', 'clients', 'd'), ('rounds', 'rounds', 'd'),
                ('wall_s', 'wall s', '.1f'), ('startup_s', 'start-up s', '.1f'),
                ('first_round_s', 'to round 1 s', '.1f'),
                ('first_eval_s', 'first eval s', '.3f'),
                ('eval_s', 'eval s', '.3f'), ('round_s', 'round s', '.3f'),
                ('projected_s', f'{e2e.PROJECTED_ROUNDS} rounds s', '.0f'),
                ('limit_round_s', 'limit round s', '.3f'),
                ('limit_onednn', 'oneDNN', 's'),
                ('ratio', 'x limit', '.2f')]
_EVAL_COLUMNS = [('evaluation', 'test clients scored', 's'),
                 ('rounds', 'rounds', 'd'),
                 ('eval_s', 'median eval s', '.4f'),
                 ('test_accuracy', 'final test accuracy', '.4f'),
                 ('test_loss', 'final test loss', '.4f'),
                 ('ratio', 'x per client', '.3f')]
_LONG_RUN_COLUMNS = [('round', 'round', 'd'),
                     ('rss_mb', 'driver RSS MB', '.0f'),
                     ('growth_mb', 'growth MB', '.1f'),
                     ('within_bound', 'within bound', 's')]
_MEMORY_COLUMNS = [('algorithm', 'algorithm', 's'),
                   ('workload', 'workload', 's'), ('clients', 'clients', 'd'),
                   ('clients_per_call', 'clients/call', 's'),
                   ('data_mb', 'data MB', '.0f'),
                   ('driver_start_mb', 'driver start MB', '.0f'),
                   ('driver_peak_mb', 'driver peak MB', '.0f'),
                   ('worker_peak_mb', 'worker peak MB', '.0f'),
                   ('worker_file_mb', 'of it mapped files MB', '.0f'),
                   ('skipped', 'skipped', 's')]


_ints = report.positive_ints


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.ERROR)
  runtime.refuse_unmanaged_default_context()
  unknown = sorted(set(_SECTIONS.value) - set(SECTIONS))
  if unknown:
    raise app.UsageError(f'--sections has unknown {unknown}; choose from '
                         f'{list(SECTIONS)}.')
  quick = _QUICK.value
  if not math.isfinite(_BUDGET_SECONDS.value):
    raise app.UsageError(
        f'--budget_seconds must be finite, got {_BUDGET_SECONDS.value}.')
  if flags.FLAGS['budget_seconds'].present and (
      quick or 'ratios' not in _SECTIONS.value):
    raise app.UsageError('--budget_seconds only sets the ratios section\'s '
                         'timed calls; it does nothing with --quick or '
                         'without --sections=ratios.')
  if flags.FLAGS['eval_rounds'].present and (
      quick or 'eval' not in _SECTIONS.value):
    raise app.UsageError('--eval_rounds only sets the eval section\'s driver'
                         ' runs; it does nothing with --quick or without'
                         ' --sections=eval.')
  cohorts = [10, 50] if quick else _ints(_COHORTS.value, 'cohorts')
  small_cohorts = [20, 100] if quick else _ints(_SMALL_MODEL_COHORTS.value,
                                                'small_model_cohorts')
  repeats = 2 if quick else _REPEATS.value
  speedup_clients = 10 if quick else _SPEEDUP_CLIENTS.value
  memory_clients = [100] if quick else _ints(_MEMORY_CLIENTS.value,
                                             'memory_clients')
  try:
    workload_list = (
        [(workloads.get_workload(w), cohorts) for w in _WORKLOADS.value] +
        [(workloads.get_workload(w), small_cohorts)
         for w in _SMALL_MODEL_WORKLOADS.value])
    workloads.get_workload(_SPEEDUP_WORKLOAD.value)
    workloads.get_workload(_MEMORY_WORKLOAD.value)
    if _OUTPUT.value:
      report.check_output_path(_OUTPUT.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None

  tables = {}
  per_call = _MAX_CLIENTS_PER_CALL.value
  if 'ratios' in _SECTIONS.value:
    rows = []
    with runtime.local_context() as (local_context, _), \
        runtime.worker_runtime(max_clients_per_call=per_call,
                               keep_state_on_worker=True):
      for workload, workload_cohorts in workload_list:
        rows += ratios.measure_ratios(
            workload, workload_cohorts, repeats,
            budget_seconds=0.0 if quick else _BUDGET_SECONDS.value,
            local_context=local_context)
    tables['ratios'] = rows
    tables['scaling'] = ratios.per_client_rows(rows, (ratios.LIMIT, 'package'))
    print(report.format_table(
        f'Round time vs the limit (fastest of the timed calls, at least '
        f'{repeats}; x limit = wall-time '
        'ratio, cpu x = CPU-time ratio, driver + worker; cohorts in slices of '
        f'<= {per_call} clients)', rows, _RATIO_COLUMNS), flush=True)
    print(flush=True)
    print(report.format_table(
        'Scaling with cohort size (wall time per client; vs smallest = per-'
        'client time / that at the smallest cohort)', tables['scaling'],
        _SCALING_COLUMNS), flush=True)
    print(flush=True)
  if 'cores' in _SECTIONS.value:
    tables['cores'] = cores.measure_speedup(
        _SPEEDUP_WORKLOAD.value, speedup_clients, repeats,
        max_clients_per_call=per_call)
    print(report.format_table('Speed-up from 1 core to all cores',
                              tables['cores'], _SPEEDUP_COLUMNS), flush=True)
    print(flush=True)
  if 'memory' in _SECTIONS.value:
    tables['memory'] = [
        row for algorithm in memory.ALGORITHMS
        # Fused rounds have one TFF client per core: nothing to slice.
        for clients_per_call in ((None,) if algorithm in memory.ON_SHARDS else
                                 (None, per_call))
        for row in memory.measure_series(
            algorithm, _MEMORY_WORKLOAD.value, memory_clients,
            max_clients_per_call=clients_per_call)
    ]
    print(report.format_table(
        'Peak resident memory (2 rounds, every client in each round; '
        'clients/call: the runtime\'s cohort slices)', tables['memory'],
        _MEMORY_COLUMNS), flush=True)
  if 'long_run' in _SECTIONS.value:
    rounds = 1000 if quick else 5000
    tables['long_run'] = long_run.measure_long_run(rounds)
    print(report.format_table(
        'Driver resident memory over a long run: python run_experiment.py'
        f' --task=synthetic --clients_per_round=20 --total_rounds={rounds}'
        f' (growth after round 500; bound {long_run.BOUND_MB:.0f} MB)',
        tables['long_run'], _LONG_RUN_COLUMNS), flush=True)
    print(flush=True)
  if 'e2e' in _SECTIONS.value:
    rounds = 20 if quick else _E2E_ROUNDS.value
    tables['e2e'] = [e2e.measure_e2e(_E2E_CLIENTS.value, rounds,
                                     rounds_per_eval=50)]
    print(report.format_table(
        'End to end: python run_experiment.py --task=synthetic '
        f'--clients_per_round={_E2E_CLIENTS.value} --total_rounds={rounds} '
        '--rounds_per_eval=50 (fused shards), against the limit (plain TF, '
        'one thread) on the same clients\' work', tables['e2e'],
        _E2E_COLUMNS), flush=True)
  if 'eval' in _SECTIONS.value:
    rounds = 5 if quick else _EVAL_ROUNDS.value
    tables['eval'] = evaluation.measure_evaluation(rounds)
    print(flush=True)
    print(report.format_table(
        'Evaluation of all 1,000 Synthetic test clients every round, per'
        ' client vs pooled (--noper_client_eval): python run_experiment.py'
        ' --task=synthetic --algorithm=fedavgcm_gel --noclipping'
        f' --clients_per_round=20 --total_rounds={rounds} --rounds_per_eval=1'
        ' --max_eval_clients=0 --validation_fraction=0 --[no]per_client_eval',
        tables['eval'], _EVAL_COLUMNS), flush=True)
  if _OUTPUT.value:
    report.write_tables(_OUTPUT.value, tables)
    print(f'\nwrote {_OUTPUT.value}')


if __name__ == '__main__':
  runtime.refuse_unmanaged_default_context()  # before absl's flag errors
  app.run(main)
