"""Normalized FedAvg (Charles et al. 2021, Section 5.4).

The server steps along the unit-norm pseudo-gradient:
`x ← x − η_s·Δ/‖Δ‖₂`, where `‖Δ‖₂` is the global L2 norm over all model
variables. No hyperparameter is added to FedAvg.

It is built as an aggregator: `normalized_update_factory(inner)` lets `inner`
(weighted or unweighted, with clipping etc.) aggregate the client updates, then
divides the aggregate by its global L2 norm. Any server optimizer then applies
the normalized update; with server SGD at rate η_s this is exactly the
paper's rule. A zero aggregate (e.g. every client update zeroed) is returned
unchanged instead of dividing by 0. TFF's aggregate is `x − x̄` (TFF's client
update is the initial minus the trained model), so normalizing it normalizes
`Δ` up to the sign TFF's server optimizer already accounts for.

`build_normalized_fed_avg` is TFF's FedAvg with this aggregator and server SGD.
"""

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_common import aggregator_wrappers


def _build_normalize(value_type: tff.types.Type) -> tff.Computation:
  """`a -> <a/‖a‖₂ (a itself if ‖a‖₂ = 0), ‖a‖₂>` for the aggregate `a`."""

  @tff.tensorflow.computation(value_type)
  def normalize(aggregate):
    norm = aggregator_wrappers.global_norm(aggregate)
    divisor = tf.where(norm > 0.0, norm, tf.ones_like(norm))
    normalized = tf.nest.map_structure(
        lambda t: tf.cast(tf.cast(t, tf.float64) / divisor, t.dtype), aggregate)
    return normalized, tf.cast(norm, tf.float32)

  return normalize


def _build_server_fn(value_type: tff.types.Type):
  """The inner output at the server -> the normalized output."""
  normalize = _build_normalize(value_type)

  def server_fn(inner_output):
    normalized, norm = tff.federated_map(normalize, inner_output.result)
    measurements = collections.OrderedDict(
        unnormalized_update_norm=norm,
        inner_aggregator=inner_output.measurements)
    return tff.templates.MeasuredProcessOutput(
        state=inner_output.state,
        result=normalized,
        measurements=tff.federated_zip(measurements))

  return server_fn


def normalized_update_factory(
    inner_factory: aggregator_wrappers.AggregationFactory
) -> aggregator_wrappers.AggregationFactory:
  """Wraps `inner_factory` so its aggregate is divided by its global L2 norm.

  Measurements: `unnormalized_update_norm` (`‖Δ‖₂` before normalization) and
  the inner factory's under `inner_aggregator`.

  Args:
    inner_factory: A weighted or unweighted `tff.aggregators` factory; the
      result has its weightedness.

  Raises:
    ValueError: If `inner_factory` is not a `tff.aggregators` factory.
  """
  return aggregator_wrappers.wrap_server_side('normalized_update_factory',
                                              inner_factory, _build_server_fn)


def build_normalized_fed_avg(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_learning_rate: float = 1.0,
    model_aggregator: Optional[aggregator_wrappers.AggregationFactory] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds normalized FedAvg (Section 5.4): `x ← x − η_s·Δ/‖Δ‖₂`.

  TFF's FedAvg (`tff.learning.algorithms.build_weighted_fed_avg`, or the
  unweighted one for an unweighted aggregator) with server SGD at rate
  `server_learning_rate` and `normalized_update_factory(model_aggregator)` in
  the aggregator slot. The paper reuses FedAvg's tuned rates unchanged.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (SGD at η_c in the paper).
    server_learning_rate: η_s, the length of every server step (> 0).
    model_aggregator: The factory aggregating client updates before
      normalization (e.g. adaptive clipping); `tff.aggregators.MeanFactory()`
      (example-weighted mean) when `None`.

  Raises:
    ValueError: If `server_learning_rate` is not positive.
  """
  if server_learning_rate <= 0.0:
    raise ValueError(
        f'server_learning_rate must be > 0, got {server_learning_rate}.')
  aggregator = normalized_update_factory(
      model_aggregator or tff.aggregators.MeanFactory())
  server_optimizer = tff.learning.optimizers.build_sgdm(server_learning_rate)
  if isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer, server_optimizer,
        model_aggregator=aggregator)
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer, server_optimizer,
      model_aggregator=aggregator)
