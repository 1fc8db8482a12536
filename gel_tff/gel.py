"""The algorithms of Table 3 of Boukhari et al. 2024, with and without GeL.

| base     | default ClientOpt | + GeL ClientOpt             | ServerOpt |
|----------|-------------------|-----------------------------|-----------|
| fedavg   | SGD               | SGDM with guessed updates   | SGD       |
| fedavgcm | SGDM              | SGDM with guessed updates   | SGD       |
| fedprox  | proximal SGDM     | proximal SGDM with guesses  | SGD       |
| fednova  | SGDM              | SGDM with guessed updates   | SGD       |
| fedyogi  | SGD               | SGDM with guessed updates   | Yogi      |

FedNova replaces the weighted mean by normalized averaging
(`fl_common.fednova`); FedProx adds `mu/2 ||x - x^(t,0)||^2` to the local loss
(mu = 0.01, Appendix E.3). Server SGD runs at rate 1 (Section 4.1); Yogi uses
beta_1 = 0.9, beta_2 = 0.99, epsilon = 1e-3 (Appendix E.1) and rate 10^-2
(Table 6, FEMNIST).

Each builder returns a `tff.learning.templates.LearningProcess` composed by
the library's one composer (`fl_engine.compose.build_process`) from the GeL
client (`gel_tff.client_work.client_program`), a TFF aggregator (FedNova's
normalized averaging around it for `fednova`) and TFF's apply-optimizer
finalizer; `execution=` says how its clients run (`fl_engine.execution`).
Client step budgets come with the data (`gel_tff.budgets`): the process
trains on every batch it is given.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from fl_engine import client_program as client_program_lib
from fl_engine import compose
from fl_engine import execution as fl_execution
from gel_tff import client_work as client_work_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]

BASES = ('fedavg', 'fedavgcm', 'fedprox', 'fednova', 'fedyogi')
# Bases whose default client optimizer is plain SGD (Table 3).
_SGD_CLIENT_BASES = ('fedavg', 'fedyogi')
_SERVER_SGD_LEARNING_RATE = 1.0
_SERVER_YOGI_LEARNING_RATE = 1e-2
DEFAULT_CLIENT_LEARNING_RATE = 0.02  # FedAvgCM on FEMNIST, Table 5.
DEFAULT_MOMENTUM = 0.9
DEFAULT_PROXIMAL_STRENGTH = 0.01
DEFAULT_EXPECTED_STEPS = 25  # b + 5 for FEMNIST's budgets [4, 20].


def _check_base(base: str) -> None:
  if base not in BASES:
    raise ValueError(f'Unknown base {base!r}; expected one of {BASES}.')


def paper_server_learning_rate(base: str) -> float:
  """Table 3's server rate `eta`: 10^-2 for `fedyogi`'s Yogi, 1 for SGD."""
  _check_base(base)
  return (_SERVER_YOGI_LEARNING_RATE if base == 'fedyogi' else
          _SERVER_SGD_LEARNING_RATE)


def build_server_optimizer(
    base: str,
    learning_rate: Optional[float] = None) -> tff.learning.optimizers.Optimizer:
  """Table 3's server optimizer: Yogi for `fedyogi`, SGD otherwise.

  Args:
    base: One of `BASES`.
    learning_rate: The server rate `eta`; `None` takes the paper's (1 for
      SGD, 10^-2 for Yogi).
  """
  if learning_rate is None:
    learning_rate = paper_server_learning_rate(base)
  if base == 'fedyogi':
    return tff.learning.optimizers.build_yogi(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)


def _build(
    model_fn: ModelFn,
    *,
    base: str,
    client_learning_rate: float,
    client_momentum: float,
    expected_steps: int,
    guessed_steps: client_work_lib.GuessedSteps,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer],
    proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory],
    metrics_aggregator: Optional[tff.learning.metrics.MetricsAggregatorType],
    execution: fl_execution.Execution,
) -> tff.learning.templates.LearningProcess:
  """One row of Table 3: its client, composed by `fl_engine.compose`."""
  _check_base(base)
  if server_optimizer is None:
    server_optimizer = build_server_optimizer(base)
  is_fednova = base == 'fednova'
  proximal_strength = proximal_strength if base == 'fedprox' else 0.0
  client_work_lib.validate_client_work_args(
      learning_rate=client_learning_rate, momentum=client_momentum,
      expected_steps=expected_steps, guessed_steps=guessed_steps,
      proximal_strength=proximal_strength, client_weighting=client_weighting)
  optimizer = client_work_lib.client_optimizer(client_learning_rate,
                                               client_momentum)
  client = compose.Client(
      client_work_lib.client_program(
          optimizer, proximal_strength=proximal_strength,
          expected_steps=expected_steps, guessed_steps=guessed_steps,
          client_weighting=client_weighting, report_normalizer=is_fednova),
      client_program_lib.optimizer_hparams_fn(optimizer),
      measurements_fn=client_work_lib.client_measurements,
      # An unweighted aggregator averages the updates uniformly.
      weighted=not isinstance(model_aggregator,
                              tff.aggregators.UnweightedAggregationFactory),
      normalizer=is_fednova)
  return compose.build_process(
      model_fn, client, server_optimizer=server_optimizer,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, execution=execution)


def build_gel(
    model_fn: ModelFn,
    *,
    base: str = 'fedavgcm',
    client_learning_rate: float = DEFAULT_CLIENT_LEARNING_RATE,
    momentum: float = DEFAULT_MOMENTUM,
    expected_steps: int = DEFAULT_EXPECTED_STEPS,
    guessed_steps: client_work_lib.GuessedSteps = client_work_lib.REMAINING,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    proximal_strength: float = DEFAULT_PROXIMAL_STRENGTH,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> tff.learning.templates.LearningProcess:
  """Builds `<base> + GeL` (Table 3, right column; Algorithm 1).

  Every client runs SGDM (`momentum`) on the `tau_i` batches it receives, then
  guesses `tau'` steps along its momentum (eq. (5)). `guessed_steps=0` gives
  the base with SGDM clients, e.g. exactly FedAvgCM for `base='fedavgcm'`.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`
      built from scratch on each call.
    base: One of `BASES`.
    client_learning_rate: `eta_l` (default: FedAvgCM's on FEMNIST, 0.02).
    momentum: The client momentum `alpha` in (0, 1).
    expected_steps: `tau`, the steps the server asks for (`budget_max + 5`).
    guessed_steps: `'remaining'` (`tau - tau_i`), `'infinite'` or a count.
    server_optimizer: The server optimizer; `None` takes Table 3's
      (`build_server_optimizer(base)`).
    proximal_strength: FedProx's `mu` (used only by `base='fedprox'`).
    client_weighting: `NUM_EXAMPLES` (examples trained on) or `UNIFORM`.
    model_aggregator: The factory averaging client deltas (for FedNova: the
      normalized deltas), weighted or unweighted (uniform); the mean when
      `None` (`fl_engine.compose.build_process` says which it takes for
      each `execution`).
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    execution: How the clients run (`fl_engine.execution`), each with its
      `tau_i` batches; the same state and metrics whichever.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: If `model_aggregator` is not one `execution` can run.
    ValueError: If an argument is out of range (e.g. `momentum=0`), or one
      `execution` cannot run.
  """
  if not 0.0 < momentum < 1.0:
    raise ValueError(f'GeL needs momentum in (0, 1), got {momentum}.')
  return _build(
      model_fn, base=base, client_learning_rate=client_learning_rate,
      client_momentum=momentum, expected_steps=expected_steps,
      guessed_steps=guessed_steps, server_optimizer=server_optimizer,
      proximal_strength=proximal_strength, client_weighting=client_weighting,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, execution=execution)


def build_budgeted_baseline(
    model_fn: ModelFn,
    *,
    base: str = 'fedavgcm',
    client_learning_rate: float = DEFAULT_CLIENT_LEARNING_RATE,
    momentum: float = DEFAULT_MOMENTUM,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    proximal_strength: float = DEFAULT_PROXIMAL_STRENGTH,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> tff.learning.templates.LearningProcess:
  """Builds `<base>` without guessing (Table 3, "Default" column).

  Clients run SGD for `fedavg` and `fedyogi` and SGDM (`momentum`) for
  `fedavgcm`, `fedprox` and `fednova`, on the `tau_i` batches they receive.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`
      built from scratch on each call.
    base: One of `BASES`.
    client_learning_rate: `eta_l` (default: FedAvgCM's on FEMNIST, 0.02).
    momentum: The client momentum of the SGDM bases, in [0, 1).
    server_optimizer: The server optimizer; `None` takes Table 3's.
    proximal_strength: FedProx's `mu` (used only by `base='fedprox'`).
    client_weighting: `NUM_EXAMPLES` (examples trained on) or `UNIFORM`.
    model_aggregator: As in `build_gel`.
    metrics_aggregator: As in `build_gel`.
    execution: As in `build_gel`.

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  _check_base(base)
  return _build(
      model_fn, base=base, client_learning_rate=client_learning_rate,
      client_momentum=0.0 if base in _SGD_CLIENT_BASES else momentum,
      expected_steps=DEFAULT_EXPECTED_STEPS, guessed_steps=0,
      server_optimizer=server_optimizer,
      proximal_strength=proximal_strength, client_weighting=client_weighting,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, execution=execution)
