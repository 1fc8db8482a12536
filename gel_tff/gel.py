"""The algorithms of Table 3 of Boukhari et al. 2024, with and without GeL.

| base     | default ClientOpt | + GeL ClientOpt             | ServerOpt |
|----------|-------------------|-----------------------------|-----------|
| fedavg   | SGD               | SGDM with guessed updates   | SGD       |
| fedavgcm | SGDM              | SGDM with guessed updates   | SGD       |
| fedprox  | proximal SGDM     | proximal SGDM with guesses  | SGD       |
| fednova  | SGDM              | SGDM with guessed updates   | SGD       |
| fedyogi  | SGD               | SGDM with guessed updates   | Yogi      |

FedNova replaces the weighted mean by normalized averaging
(`gel_tff.fednova`); FedProx adds `mu/2 ||x - x^(t,0)||^2` to the local loss
(mu = 0.01, Appendix E.3). Server SGD runs at rate 1 (Section 4.1); Yogi uses
beta_1 = 0.9, beta_2 = 0.99, epsilon = 1e-3 (Appendix E.1) and rate 10^-2
(Table 6, FEMNIST).

Each builder returns a `tff.learning.templates.LearningProcess` composed from
TFF's broadcast distributor, the GeL client work (`gel_tff.client_work`), a
TFF aggregator (or FedNova's) and TFF's apply-optimizer finalizer.
`build_fused_gel` and `build_fused_budgeted_baseline` build the same
processes on shards of clients (`gel_tff.fused`: one TFF client trains many
real clients in one graph), with the driver's aggregator. Client step
budgets come with the data (`gel_tff.budgets`): the process trains on every
batch it is given.
"""

from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow_federated as tff

from fl_common import execution as fl_execution
from gel_tff import client_work as client_work_lib
from gel_tff import fednova
from gel_tff import fused

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
  """Composes the four slots for one row of Table 3 (on shards of clients,
  `gel_tff.fused`, if `execution` says so)."""
  _check_base(base)
  if server_optimizer is None:
    server_optimizer = build_server_optimizer(base)
  is_fednova = base == 'fednova'
  if fl_execution.on_shards(execution):
    return fused.compose_fused(
        model_fn, client_learning_rate=client_learning_rate,
        client_momentum=client_momentum, expected_steps=expected_steps,
        guessed_steps=guessed_steps, server_optimizer=server_optimizer,
        proximal_strength=proximal_strength if base == 'fedprox' else 0.0,
        client_weighting=client_weighting, report_normalizer=is_fednova,
        model_aggregator=model_aggregator,
        metrics_aggregator=metrics_aggregator,
        resident_examples=execution.resident_examples, lanes=execution.lanes)
  if (model_aggregator is not None and not isinstance(
      model_aggregator, tff.aggregators.WeightedAggregationFactory)):
    raise TypeError(
        'model_aggregator must be a tff.aggregators.WeightedAggregationFactory'
        f' (wrap unweighted ones with tff.aggregators.as_weighted_aggregator),'
        f' got {type(model_aggregator).__name__}.')

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  model_weights_type = initial_model_weights_fn.type_signature.result
  client_work = client_work_lib.build_gel_client_work(
      model_fn,
      learning_rate=client_learning_rate,
      momentum=client_momentum,
      expected_steps=expected_steps,
      guessed_steps=guessed_steps,
      proximal_strength=proximal_strength if base == 'fedprox' else 0.0,
      client_weighting=client_weighting,
      report_normalizer=is_fednova,
      metrics_aggregator=metrics_aggregator,
  )
  if is_fednova:
    aggregator_factory = fednova.FedNovaAggregationFactory(model_aggregator)
  else:
    aggregator_factory = model_aggregator or tff.aggregators.MeanFactory()
  aggregator = aggregator_factory.create(
      client_work_lib.client_update_type(model_weights_type.trainable,
                                         report_normalizer=is_fednova),
      tff.TensorType(np.float32))
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(model_weights_type),
      client_work,
      aggregator,
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer, model_weights_type),
  )


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
    model_aggregator: The weighted factory averaging client deltas (for
      FedNova: the normalized deltas); `tff.aggregators.MeanFactory()` when
      `None`. On shards a `fl_common.diagnosed_mean.diagnosed_mean_factory`
      (weighted, or unweighted with `UNIFORM` weighting); `None` is then
      the weighted mean without clipping.
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    execution: How the clients run (`fl_common.execution`): `PER_CLIENT`
      (default), or `OnShards(lanes, resident_examples)`, a TFF client
      training a shard of clients (`gel_tff.fused`), each with its `tau_i`
      batches; the same state and metrics.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: On shards, if `model_aggregator` is not a diagnosed mean.
    ValueError: If an argument is out of range (e.g. `momentum=0`), or
      lanes with a model that does not vectorize.
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


def build_fused_gel(model_fn: ModelFn, *,
                    resident_examples: Optional[Any] = None, lanes: int = 1,
                    **kwargs) -> tff.learning.templates.LearningProcess:
  """`build_gel(model_fn, execution=OnShards(lanes, resident_examples),
  **kwargs)`: GeL on shards of clients, under its fused name."""
  return build_gel(model_fn, execution=fl_execution.OnShards(
      lanes=lanes, resident_examples=resident_examples), **kwargs)


def build_fused_budgeted_baseline(
    model_fn: ModelFn, *, resident_examples: Optional[Any] = None,
    lanes: int = 1, **kwargs) -> tff.learning.templates.LearningProcess:
  """`build_budgeted_baseline(model_fn, execution=OnShards(lanes,
  resident_examples), **kwargs)`, under its fused name."""
  return build_budgeted_baseline(model_fn, execution=fl_execution.OnShards(
      lanes=lanes, resident_examples=resident_examples), **kwargs)
