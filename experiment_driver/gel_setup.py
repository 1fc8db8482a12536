"""GeL (Boukhari et al. 2024) for the driver: flags, task defaults, algorithms.

`ALGORITHMS` holds one entry per row of Table 3, with and without guessing:
`<base>_gel` (`gel_tff.gel.build_gel`) and `<base>_budgeted`
(`gel_tff.gel.build_budgeted_baseline`) for base in fedavg, fedavgcm, fedprox,
fednova, fedyogi. Both train under per-round client step budgets
`tau_i ~ U{budget_min..budget_max}` (`gel_tff.budgets`), which the driver gets
as `client_datasets_fn`; `round_metrics_fn` adds each round's gradient
computations and bytes down and up.

Defaults of the paper per task (`TASK_DEFAULTS`): budgets [4, 20] (FEMNIST,
here `emnist`), [10, 30] (Shakespeare), [4, 13] (Synthetic); `tau = b + 5`;
batch 20 / 20 / 5; 20 clients per round; target accuracy 76 / 54 / 85 %;
client rates of Table 5 (FedAvgCM's for every GeL combination, Section 4.1),
FedYogi's of Table 6; server rate 1 (SGD) or 10^-2 (Yogi). Learning-rate flags
left unset take these instead of the large-cohort tuned rates. The paper does
not clip updates: pass `--noclipping` to reproduce it.
"""

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence

from absl import flags
from absl import logging
import tensorflow_federated as tff

from experiment_driver import algorithm_setup
from experiment_driver import flag_groups
from gel_tff import accounting
from gel_tff import budgets as budgets_lib
from gel_tff import client_work
from gel_tff import gel
import tasks

BUDGET_MIN = flags.DEFINE_integer(
    'budget_min', None,
    'GeL: smallest client step budget a (tau_i ~ U{a..b}, drawn every round);'
    ' default: the task\'s (emnist 4, shakespeare 10, synthetic 4).',
    lower_bound=1)
BUDGET_MAX = flags.DEFINE_integer(
    'budget_max', None,
    'GeL: largest client step budget b; default: the task\'s (emnist 20,'
    ' shakespeare 30, synthetic 13).', lower_bound=1)
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
    ' the task\'s (emnist 0.76, shakespeare 0.54, synthetic 0.85).',
    lower_bound=0.0, upper_bound=1.0)
TARGET_METRIC = flags.DEFINE_string(
    'target_metric', 'test/accuracy',
    'GeL: the metrics.csv column compared with --target_accuracy.')
BASELINE_RUN_DIR = flags.DEFINE_string(
    'baseline_run_dir', None,
    'GeL: run directory of the baseline (e.g. fedavgcm_budgeted) to report'
    ' the speedup and network savings against.')


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
    'shakespeare': GelTaskDefaults(
        budget_min=10, budget_max=30, batch_size=20, target_accuracy=0.54,
        client_learning_rate=0.3, sgd_client_learning_rate=0.8,
        yogi_client_learning_rate=0.3),
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


def _client_learning_rate(base: str, use_gel: bool, task_name: str) -> float:
  """`--client_learning_rate`, else the paper's tuned rate for the task."""
  if flag_groups.CLIENT_LEARNING_RATE.value is not None:
    return flag_groups.CLIENT_LEARNING_RATE.value
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
  batch_size = (flag_groups.TRAIN_BATCH_SIZE.value or
                tasks.DEFAULT_TRAIN_BATCH_SIZE.get(task_name))
  if defaults is not None and batch_size != defaults.batch_size:
    logging.warning('GeL experiments on %s use batch size %d; pass'
                    ' --train_batch_size=%d to match them.', task_name,
                    defaults.batch_size, defaults.batch_size)
  if clients_per_round != PAPER_CLIENTS_PER_ROUND:
    logging.warning('GeL experiments sample %d clients per round; this run'
                    ' samples %d.', PAPER_CLIENTS_PER_ROUND, clients_per_round)


def _build_setup(base: str, use_gel: bool,
                 ctx: algorithm_setup.BuildContext
                 ) -> algorithm_setup.AlgorithmSetup:
  """Builds one Table 3 algorithm and its budget and accounting hooks."""
  _warn_if_not_paper_setting(ctx.task_name, ctx.clients_per_round)
  budgets = step_budgets(ctx.task_name, ctx.seed)
  model_aggregator = ctx.model_aggregator
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    model_aggregator = tff.aggregators.as_weighted_aggregator(model_aggregator)
  common = dict(
      base=base,
      client_learning_rate=_client_learning_rate(base, use_gel, ctx.task_name),
      server_optimizer_fn=gel.build_server_optimizer(
          base, flag_groups.SERVER_LEARNING_RATE.value),
      proximal_strength=PROXIMAL_STRENGTH.value,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM
                        if ctx.uniform_weighting else
                        tff.learning.ClientWeighting.NUM_EXAMPLES),
      model_aggregator=model_aggregator,
  )
  if use_gel:
    process = gel.build_gel(
        ctx.task.model_fn,
        expected_steps=EXPECTED_STEPS.value or budgets.budget_max + 5,
        guessed_steps=parse_guessed_steps(GUESSED_STEPS.value),
        **common)
  else:
    process = gel.build_budgeted_baseline(ctx.task.model_fn, **common)

  model_weights_type = process.get_model_weights.type_signature.result
  per_client = accounting.client_bytes(
      model_weights_type,
      client_work.client_update_type(model_weights_type.trainable,
                                     report_normalizer=base == 'fednova'))

  def round_metrics_fn(round_num: int, client_ids: Sequence[str],
                       metrics: Mapping[str, object]) -> dict[str, float]:
    del metrics  # Both counts follow from the budgets and the model size.
    return {
        accounting.GRADIENT_COMPUTATIONS: float(
            sum(budgets.draw(round_num, len(client_ids)))),
        accounting.BYTES_DOWN: float(len(client_ids) * per_client.down),
        accounting.BYTES_UP: float(len(client_ids) * per_client.up),
    }

  return algorithm_setup.AlgorithmSetup(
      process=process,
      client_datasets_fn=budgets_lib.build_client_datasets_fn(
          ctx.task.datasets.train_data, ctx.task.datasets.train_preprocess_fn,
          budgets),
      round_metrics_fn=round_metrics_fn,
      finish_fn=(functools.partial(write_run_summary, task_name=ctx.task_name)
                 if _has_target(ctx.task_name) else None),
  )


def _has_target(task_name: str) -> bool:
  return (TARGET_ACCURACY.value is not None or task_name in TASK_DEFAULTS)


def _algorithm(base: str, use_gel: bool) -> Callable[
    [algorithm_setup.BuildContext], algorithm_setup.AlgorithmSetup]:
  return lambda ctx: _build_setup(base, use_gel, ctx)


ALGORITHMS: dict[str, Callable[[algorithm_setup.BuildContext],
                               algorithm_setup.AlgorithmSetup]] = {}
for _base in gel.BASES:
  ALGORITHMS[f'{_base}_gel'] = _algorithm(_base, use_gel=True)
  ALGORITHMS[f'{_base}_budgeted'] = _algorithm(_base, use_gel=False)


def write_run_summary(run_dir: str, task_name: str) -> dict[str, float]:
  """Writes `<run_dir>/gel_summary.json`: rounds, gradients, bytes to target.

  Uses `--target_accuracy` (else the task's), `--target_metric` and, when
  set, `--baseline_run_dir` for the speedup and network savings.

  Raises:
    ValueError: If no target accuracy is known for the task.
  """
  target = TARGET_ACCURACY.value
  if target is None and task_name in TASK_DEFAULTS:
    target = TASK_DEFAULTS[task_name].target_accuracy
  if target is None:
    raise ValueError(
        f'The paper gives no target accuracy for task {task_name!r}; pass'
        ' --target_accuracy.')
  summary = accounting.summarize_run(run_dir, TARGET_METRIC.value, target,
                                     BASELINE_RUN_DIR.value)
  with open(os.path.join(run_dir, 'gel_summary.json'), 'w') as f:
    json.dump(dict(summary, target_accuracy=target), f, indent=2,
              sort_keys=True)
  return summary
