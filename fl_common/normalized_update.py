"""The normalized update (Charles et al. 2021, Section 5.4) as an aggregator.

`normalized_update_factory(inner)` lets `inner` (weighted or unweighted, with
clipping etc.) aggregate the client updates, then divides the aggregate by its
global L2 norm `‖Δ‖₂` over all model variables. Any server optimizer then
applies the normalized update: with server SGD at rate η_s, the paper's
normalized FedAvg `x ← x − η_s·Δ/‖Δ‖₂` (`large_cohort.build_normalized_fed_avg`);
the driver's `--normalize_server_update` puts it in any family's aggregator
slot. A zero aggregate (e.g. every client update zeroed) is returned
unchanged instead of dividing by 0. TFF's aggregate is `x − x̄` (TFF's client
update is the initial minus the trained model), so normalizing it normalizes
`Δ` up to the sign TFF's server optimizer already accounts for.
"""

import collections

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
