"""GeL (Boukhari et al. 2024) for the driver: flags, task defaults, algorithms.

`ALGORITHMS` holds one entry per row of Table 3, with and without guessing:
`<base>_gel` (`gel_tff.gel.build_gel`) and `<base>_budgeted`
(`gel_tff.gel.build_budgeted_baseline`) for base in fedavg, fedavgcm, fedprox,
fednova, fedyogi. Both train under per-round client step budgets
`tau_i ~ U{budget_min..budget_max}` (`gel_tff.budgets`), which the driver gets
as `client_datasets_fn`; `round_metrics_fn` adds each round's gradient
computations and bytes down and up.

Defaults of the paper per task (`TASK_DEFAULTS`): budgets [4, 20] (FEMNIST,
here `emnist`), [10, 30] (Shakespeare: `leaf_shakespeare`, LEAF's, and
TFF's `shakespeare`), [4, 13] (Synthetic); `tau = b + 5`;
batch 20 / 20 / 5; 20 clients per round; target accuracy 76 / 54 / 85 %;
client rates of Table 5 (FedAvgCM's for every GeL combination, Section 4.1),
FedYogi's of Table 6; server rate 1 (SGD) or 10^-2 (Yogi). Learning-rate flags
left unset take these instead of the large-cohort tuned rates. Table 3 fixes
each row's optimizers (SGDM or SGD clients, SGD or Yogi server) and the step
budgets fix the local work, so the optimizer-choice flags, their
hyperparameters, the server learning-rate scaling and `--client_epochs` are
refused with these algorithms (`SHARED_FLAGS`). The paper does not clip
updates, so neither do these algorithms unless `--clipping` is given (the
other families clip by default). With the driver's aggregator
a round runs on shards of clients (`execution=OnShards(...)`, one shard per
core, `--clients_per_shard`), each client cut to its budget in the shard.
"""

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import flags
from absl import logging

from experiment_driver import algorithm_setup
from experiment_driver import release_managers
from experiment_driver import flag_groups
from fl_common import run_layout
from gel_tff import accounting
from gel_tff import budgets as budgets_lib
from gel_tff import client_work
from gel_tff import gel
import tasks

BUDGET_MIN = flags.DEFINE_integer(
    'budget_min', None,
    'GeL: smallest client step budget a (tau_i ~ U{a..b}, drawn every round);'
    ' default: the task\'s (emnist 4, leaf_shakespeare and shakespeare 10,'
    ' synthetic 4).',
    lower_bound=1)
BUDGET_MAX = flags.DEFINE_integer(
    'budget_max', None,
    'GeL: largest client step budget b; default: the task\'s (emnist 20,'
    ' leaf_shakespeare and shakespeare 30, synthetic 13).', lower_bound=1)
EXPECTED_STEPS = flags.DEFINE_integer(
    'expected_steps', None,
    'GeL: local steps tau the server asks for; default budget_max + 5.',
    lower_bound=1)
GUESSED_STEPS = flags.DEFINE_string(
    'guessed_steps', client_work.REMAINING,
    'GeL: guessed steps tau\' per client: "remaining" (tau - tau_i),'
    ' "infinite" (step factor alpha / (1 - alpha)) or a nonnegative integer.')
PROXIMAL_STRENGTH = flags.DEFINE_float(
    'proximal_strength', gel.DEFAULT_PROXIMAL_STRENGTH,
    'GeL: FedProx proximal term mu (fedprox_* algorithms only).',
    lower_bound=0.0)
TARGET_ACCURACY = flags.DEFINE_float(
    'target_accuracy', None,
    'GeL: accuracy whose first round is reported as rounds to target; default:'
    ' the task\'s (emnist 0.76, leaf_shakespeare and shakespeare 0.54,'
    ' synthetic 0.85).',
    lower_bound=0.0, upper_bound=1.0)
TARGET_METRIC = flags.DEFINE_enum(
    'target_metric', 'test/accuracy',
    ['test/accuracy', 'validation/accuracy', 'train/accuracy'],
    'GeL: the metrics.csv column compared with --target_accuracy.')
BASELINE_RUN_DIR = flags.DEFINE_string(
    'baseline_run_dir', None,
    'GeL: run directory of the baseline (e.g. fedavgcm_budgeted) to report'
    ' the speedup and network savings against; it must hold metrics.csv.')
flags.register_validator(
    'baseline_run_dir',
    lambda path: path is None or os.path.isfile(
        os.path.join(os.path.expanduser(path), run_layout.METRICS_FILE)),
    message='--baseline_run_dir must be a run directory holding'
            f' {run_layout.METRICS_FILE}')


def parse_guessed_steps(text: str) -> client_work.GuessedSteps:
  """Parses `--guessed_steps`: 'remaining', 'infinite' or an integer >= 0."""
  if text in (client_work.REMAINING, client_work.INFINITE):
    return text
  try:
    steps = int(text)
  except ValueError:
    steps = -1
  if steps < 0:
    raise ValueError(
        f"--guessed_steps must be 'remaining', 'infinite' or an integer >= 0,"
        f' got {text!r}.')
  return steps


def _is_valid_guessed_steps(text: str) -> bool:
  try:
    parse_guessed_steps(text)
  except ValueError:
    return False
  return True


flags.register_validator(
    'guessed_steps', _is_valid_guessed_steps,
    message='--guessed_steps must be remaining, infinite or an integer >= 0.')


@dataclasses.dataclass(frozen=True)
class GelTaskDefaults:
  """The paper's setting for one task (Section 4.1, Appendices D-E)."""

  budget_min: int
  budget_max: int
  batch_size: int
  target_accuracy: float
  # Table 5: FedAvgCM's rate, used by every SGDM/GeL combination...
  client_learning_rate: float
  # ...FedAvg's (plain SGD clients) ...
  sgd_client_learning_rate: float
  # ... and FedYogi's (Table 6, FEMNIST only; FedAvgCM's elsewhere).
  yogi_client_learning_rate: float


TASK_DEFAULTS: Mapping[str, GelTaskDefaults] = {
    'emnist': GelTaskDefaults(
        budget_min=4, budget_max=20, batch_size=20, target_accuracy=0.76,
        client_learning_rate=0.02, sgd_client_learning_rate=0.06,
        yogi_client_learning_rate=10**-1.5),
    # GeL's Shakespeare is LEAF's (`leaf_shakespeare`); TFF's takes the same.
    **{name: GelTaskDefaults(
        budget_min=10, budget_max=30, batch_size=20, target_accuracy=0.54,
        client_learning_rate=0.3, sgd_client_learning_rate=0.8,
        yogi_client_learning_rate=0.3)
       for name in ('leaf_shakespeare', 'shakespeare')},
    'synthetic': GelTaskDefaults(
        budget_min=4, budget_max=13, batch_size=5, target_accuracy=0.85,
        client_learning_rate=0.01, sgd_client_learning_rate=0.1,
        yogi_client_learning_rate=0.01),
}
PAPER_CLIENTS_PER_ROUND = 20


def step_budgets(task_name: str, seed: int) -> budgets_lib.StepBudgets:
  """The budgets from `--budget_min/--budget_max`, else the task's."""
  budget_min, budget_max = BUDGET_MIN.value, BUDGET_MAX.value
  defaults = TASK_DEFAULTS.get(task_name)
  if defaults is not None:
    budget_min = budget_min or defaults.budget_min
    budget_max = budget_max or defaults.budget_max
  if budget_min is None or budget_max is None:
    raise ValueError(
        f'The paper gives no step budgets for task {task_name!r}; pass'
        ' --budget_min and --budget_max.')
  return budgets_lib.StepBudgets(budget_min, budget_max, seed=seed)


def paper_client_learning_rate(base: str, use_gel: bool,
                               task_name: str) -> float:
  """The paper's tuned client rate for a Table 3 row and task."""
  defaults = TASK_DEFAULTS.get(task_name)
  if defaults is None:
    return gel.DEFAULT_CLIENT_LEARNING_RATE
  if base == 'fedyogi':
    return defaults.yogi_client_learning_rate
  if base == 'fedavg' and not use_gel:
    return defaults.sgd_client_learning_rate
  return defaults.client_learning_rate


def _warn_if_not_paper_setting(task_name: str, clients_per_round: int) -> None:
  defaults = TASK_DEFAULTS.get(task_name)
  batch_size = flag_groups.TRAIN_BATCH_SIZE.value or (
      tasks.TASKS[task_name].train_batch_size if task_name in tasks.TASKS
      else None)
  if defaults is not None and batch_size != defaults.batch_size:
    logging.warning('GeL experiments on %s use batch size %d; pass'
                    ' --train_batch_size=%d to match them.', task_name,
                    defaults.batch_size, defaults.batch_size)
  if clients_per_round != PAPER_CLIENTS_PER_ROUND:
    logging.warning('GeL experiments sample %d clients per round; this run'
                    ' samples %d.', PAPER_CLIENTS_PER_ROUND, clients_per_round)


def _split(algorithm: str) -> tuple[str, bool]:
  """`'fedprox_gel'` -> `('fedprox', True)`."""
  base, _, kind = algorithm.rpartition('_')
  return base, kind == 'gel'


def _target_accuracy(task_name: str, values: Mapping[str, Any]):
  if values['target_accuracy'] is not None:
    return values['target_accuracy']
  defaults = TASK_DEFAULTS.get(task_name)
  return None if defaults is None else defaults.target_accuracy


def unused_own_flags(algorithm: str, values: Mapping[str, Any]
                     ) -> dict[str, str]:
  """Own flags that the other flags' values make moot."""
  del algorithm
  why_not = {}
  if _target_accuracy(values['task'], values) is None:
    why = (f'needs a target: --task={values["task"]} has no paper target'
           ' accuracy; pass --target_accuracy')
    why_not.update(target_metric=why, baseline_run_dir=why)
  return why_not


def effective_hparams(algorithm: str, values: Mapping[str, Any]
                      ) -> dict[str, Any]:
  """The rates, budgets, steps and target in use: the flags, else the
  paper's for the task."""
  base, use_gel = _split(algorithm)
  task_name = values['task']
  defaults = TASK_DEFAULTS.get(task_name)
  effective = {
      'client_learning_rate': (
          paper_client_learning_rate(base, use_gel, task_name)
          if values['client_learning_rate'] is None else
          values['client_learning_rate']),
      'server_learning_rate': (
          gel.paper_server_learning_rate(base)
          if values['server_learning_rate'] is None else
          values['server_learning_rate']),
  }
  for name in ('budget_min', 'budget_max'):
    if values[name] is None and defaults is not None:
      effective[name] = getattr(defaults, name)
  if use_gel and values['expected_steps'] is None:
    budget_max = effective.get('budget_max', values['budget_max'])
    if budget_max is not None:
      effective['expected_steps'] = budget_max + 5
  target = _target_accuracy(task_name, values)
  if target is not None:
    effective['target_accuracy'] = target
  return effective


def _build_setup(base: str, use_gel: bool,
                 ctx: algorithm_setup.BuildContext
                 ) -> algorithm_setup.ToBuild:
  """Builds one Table 3 algorithm and its budget and accounting hooks."""
  _warn_if_not_paper_setting(ctx.task_name, ctx.clients_per_round)
  if (_has_target(ctx.task_name) and
      TARGET_METRIC.value.startswith('validation/') and
      ctx.task.datasets.validation_data is None):
    raise ValueError(
        f'--target_metric={TARGET_METRIC.value}: this --task={ctx.task_name}'
        ' has no validation clients (see --validation_fraction); use'
        ' test/accuracy')
  budgets = step_budgets(ctx.task_name, ctx.seed)
  common = dict(
      base=base,
      client_learning_rate=ctx.client_learning_rate,
      server_optimizer=gel.build_server_optimizer(
          base, ctx.server_learning_rate),
      proximal_strength=PROXIMAL_STRENGTH.value,
      client_weighting=ctx.client_weighting,
      model_aggregator=ctx.model_aggregator,
  )
  if use_gel:
    build_fn = gel.build_gel
    common.update(
        expected_steps=EXPECTED_STEPS.value or budgets.budget_max + 5,
        guessed_steps=parse_guessed_steps(GUESSED_STEPS.value))
  else:
    build_fn = gel.build_budgeted_baseline

  def round_metrics_fn_of(process):
    sizes = []  # Read off the types when first needed.

    def round_metrics_fn(round_num: int, client_ids: Sequence[str],
                         metrics: Mapping[str, object]) -> dict[str, float]:
      del metrics  # Both counts follow from the budgets and the model size.
      if not sizes:
        weights_type = process.get_model_weights.type_signature.result
        sizes.append(accounting.client_bytes(
            weights_type, client_work.client_update_type(
                weights_type.trainable, report_normalizer=base == 'fednova')))
      per_client = sizes[0]
      return {
          accounting.GRADIENT_COMPUTATIONS: float(
              sum(budgets.draw(round_num, len(client_ids)))),
          accounting.BYTES_DOWN: float(len(client_ids) * per_client.down),
          accounting.BYTES_UP: float(len(client_ids) * per_client.up),
      }

    return round_metrics_fn

  return algorithm_setup.ToBuild(
      build_fn, common,
      # Each client's batches cut to its budget: in the shards, or in its
      # own dataset when the clients run one TFF client each.
      steps_fn=budgets.draw,
      per_client_datasets_fn=budgets_lib.build_client_datasets_fn(
          ctx.task.datasets.train_data, ctx.task.datasets.train_preprocess_fn,
          budgets),
      round_metrics_fn_of=round_metrics_fn_of,
      finish_fn=(functools.partial(write_run_summary, task_name=ctx.task_name)
                 if _has_target(ctx.task_name) else None))


def _has_target(task_name: str) -> bool:
  return (TARGET_ACCURACY.value is not None or task_name in TASK_DEFAULTS)


def _algorithm(base: str, use_gel: bool) -> Callable[
    [algorithm_setup.BuildContext], algorithm_setup.ToBuild]:
  return lambda ctx: _build_setup(base, use_gel, ctx)


ALGORITHMS: dict[str, Callable[[algorithm_setup.BuildContext],
                               algorithm_setup.ToBuild]] = {}
for _base in gel.BASES:
  ALGORITHMS[f'{_base}_gel'] = _algorithm(_base, use_gel=True)
  ALGORITHMS[f'{_base}_budgeted'] = _algorithm(_base, use_gel=False)
SHARED_FLAGS = dict.fromkeys(ALGORITHMS, frozenset(
    {'client_learning_rate', 'server_learning_rate', 'uniform_weighting',
     'train_batch_size'} | flag_groups.AGGREGATOR_FLAGS))
WHY_NOT = dict.fromkeys(
    ALGORITHMS, 'Table 3 fixes its optimizers and the step budgets its local'
    ' work')
_GEL_ALGORITHMS = frozenset(a for a in ALGORITHMS if a.endswith('_gel'))
OWN_FLAGS = {
    **dict.fromkeys(('budget_min', 'budget_max', 'target_accuracy',
                     'target_metric', 'baseline_run_dir'),
                    frozenset(ALGORITHMS)),
    'expected_steps': _GEL_ALGORITHMS,
    'guessed_steps': _GEL_ALGORITHMS,
    'proximal_strength': frozenset(a for a in ALGORITHMS
                                   if a.startswith('fedprox_')),
}


def write_run_summary(run_dir: str, task_name: str) -> dict[str, float]:
  """Writes `<run_dir>/gel_summary.json`: rounds, gradients, bytes to target.

  Uses `--target_accuracy` (else the task's), `--target_metric` and, when
  set, `--baseline_run_dir` for the speedup and network savings.

  Raises:
    ValueError: If no target accuracy is known for the task.
  """
  target = _target_accuracy(task_name, {'target_accuracy':
                                        TARGET_ACCURACY.value})
  if target is None:
    raise ValueError(
        f'The paper gives no target accuracy for task {task_name!r}; pass'
        ' --target_accuracy.')
  summary = accounting.summarize_run(run_dir, TARGET_METRIC.value, target,
                                     BASELINE_RUN_DIR.value)
  # Atomically: a run killed while writing it leaves the previous summary
  # or none, never half a file.
  release_managers.write_atomically(
      os.path.join(run_dir, 'gel_summary.json'),
      json.dumps(dict(summary, target_accuracy=target), indent=2,
                 sort_keys=True))
  return summary


FAMILY = algorithm_setup.Family(
    algorithms=ALGORITHMS, shared_flags=SHARED_FLAGS, why_not=WHY_NOT,
    own_flags=OWN_FLAGS, unused_own_flags=unused_own_flags,
    effective_hparams=effective_hparams)
