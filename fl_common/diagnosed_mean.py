"""The mean, adaptive clipping and the paper's diagnostics in one pass
(Charles et al. 2021, SPEC.md §1).

`diagnosed_mean_factory(clipping=..., weighted=...)` computes what the
composition `diagnostics.diagnostics_factory(tff.learning.robust_aggregator(
zeroing=False, clipping=clipping, weighted=weighted))` computes: the same
result and the same measurements, with the same structure and names. It takes
one `federated_aggregate` per round, whose `accumulate` computes a client's
contribution and adds it to the running sums in one call on the worker, where
the composition takes four client computations and five sums (the screening, the
clipping, the quantile estimator's record and the mean's weighting; the unit
vectors, the estimator's record, the clipped count, the weighted values and
the weights), each a pass over or a sum of model-sized values per client.

* Client `k` computes the norm of its update once (`diagnostics.screen_norm`)
  and sends `c_k·w_k·Δ_k`, with `c_k = min(1, ρ/‖Δ_k‖₂)` the clipping factor
  (Andrew et al. 2019; 1 without clipping) and `w_k` its weight (1 when
  unweighted); the unit vector `Δ_k/‖Δ_k‖₂`; `w_k`; and int32 counts
  `(1, non-finite, has a direction, clipped)`.
* The server divides the sums for the mean (`Σ c_k w_k Δ_k / Σ w_k`, or over
  the cohort size unweighted, as TFF's `MeanFactory`/`UnweightedMeanFactory`),
  derives the diagnostics (`diagnostics.cohort_measurements`), and updates the
  clipping norm by SPEC.md §1 eq. (4), `ρ ← ρ·exp(−η_a·(b − q))`, with `b` the
  fraction of the cohort whose update has `‖Δ_k‖₂ ≤ ρ`: TFF's
  `PrivateQuantileEstimationProcess.no_noise` with the robust aggregator's
  `ρ_1 = 1`, `q = 0.8`, `η_a = 0.2` (the defaults here).

A NaN or Inf update is screened as `diagnostics` screens it: it is replaced by
zeros, its weight by 0, and it counts as unclipped (in the composition the
clipping sees the screened zeros).

The state is the clipping norm `ρ` (a float32 at the server; `()` without
clipping), where the composition keeps the quantile estimator's state.
Adaptive zeroing is not fused; `experiment_driver.build.model_aggregator`
uses the composition when `--zeroing` is set.

Measured with the bench's EMNIST CNN rounds (`bench.tff_rounds`, FedAvg,
slices of 50 clients): the composition added 0.07 (10 clients) and 0.13 (50
clients) to the round's ratio to the limit, this factory 0.02 and 0.04 when it
still took a client computation and a `federated_sum` (two calls per client).
In one `federated_aggregate`, the Stack Overflow LSTM's full round at 50
clients went from 1.205 to 1.157 times the limit (package FedAvg: 1.146).
"""

import collections
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import aggregator_wrappers
from fl_common import diagnostics

# Indices of the per-client int32 counts, summed with the values.
_COUNT_CLIENT, _COUNT_NONFINITE, _COUNT_DIRECTION, _COUNT_CLIPPED = range(4)


def client_contribution(value: Any, weight: Optional[tf.Tensor],
                         clipping_norm: Optional[tf.Tensor]) -> tuple[Any, ...]:
  """`(c_k·w_k·Δ_k, Δ_k/‖Δ_k‖₂, [w_k,] counts)` of one client (module
  docstring); zeros, weight 0 for a NaN or Inf update."""
  norm = diagnostics.screen_norm(value)
  is_finite = tf.math.is_finite(norm)
  has_direction = tf.logical_and(is_finite, norm > 0.0)
  factor = tf.constant(1.0, tf.float64)
  was_clipped = tf.constant(False)
  if clipping_norm is not None:
    rho = tf.cast(clipping_norm, tf.float64)
    was_clipped = tf.logical_and(is_finite, norm > rho)
    factor = tf.where(was_clipped, rho / norm, factor)
  if weight is not None:
    factor *= tf.cast(weight, tf.float64)
  inverse_norm = tf.where(has_direction, 1.0 / norm, 0.0)

  def scale(scalar):
    return tf.nest.map_structure(lambda t: t * tf.cast(scalar, t.dtype), value)

  def zeros():
    return tf.nest.map_structure(tf.zeros_like, value)

  weighted_value, unit_value = tf.cond(
      is_finite, lambda: (scale(factor), scale(inverse_norm)),
      lambda: (zeros(), zeros()))
  counts = tf.stack([
      tf.constant(1),
      tf.cast(tf.logical_not(is_finite), tf.int32),
      tf.cast(has_direction, tf.int32),
      tf.cast(was_clipped, tf.int32),
  ])
  if weight is None:
    return weighted_value, unit_value, counts
  safe_weight = tf.where(is_finite, weight, tf.zeros_like(weight))
  return weighted_value, unit_value, safe_weight, counts


def build_summing_computations(
    value_type: tff.types.Type, weight_type: Optional[tff.types.Type],
    clipping: bool) -> tuple[tff.Computation, ...]:
  """`(zero, accumulate, merge, report)` of the `federated_aggregate` that sums
  the clients' `client_contribution`s.

  `accumulate(sums, client)` computes the contribution of one client from its
  `<value[, weight][, clipping_norm]>` and adds it to `sums`, in one call on
  the worker: a `federated_map` of the contributions followed by a
  `federated_sum` takes two calls per client and holds two more model-sized
  values per client between them.
  """
  norm_type = tff.TensorType(np.float32)
  client_type = tff.StructWithPythonType(
      [('value', value_type)] +
      ([('weight', weight_type)] if weight_type is not None else []) +
      ([('clipping_norm', norm_type)] if clipping else []),
      collections.OrderedDict)

  def contribution(client):
    return client_contribution(
        client['value'], client['weight'] if weight_type is not None else None,
        client['clipping_norm'] if clipping else None)

  sums_type = tff.tensorflow.computation(contribution,
                                         client_type).type_signature.result

  def add(a, b):
    return tf.nest.map_structure(tf.add, a, b)

  @tff.tensorflow.computation
  def zero():
    return tf.nest.map_structure(
        lambda spec: tf.zeros(spec.shape, spec.dtype),
        tff.types.type_to_tf_tensor_specs(sums_type))

  @tff.tensorflow.computation(sums_type, client_type)
  def accumulate(sums, client):
    return add(sums, contribution(client))

  merge = tff.tensorflow.computation(add, sums_type, sums_type)
  report = tff.tensorflow.computation(lambda sums: sums, sums_type)
  return zero, accumulate, merge, report


def build_server_computation(
    sums_type: tff.types.Type, weighted: bool, clipping: bool,
    target_quantile: float, clipping_learning_rate: float) -> tff.Computation:
  """`sums[, ρ] -> <mean, [next ρ,] ‖Δ‖, cosine, #clients, #non-finite,
  #zero, #clipped>` from the cohort's summed contributions."""

  def finish(sums, clipping_norm):
    if weighted:
      value_sum, unit_sum, weight_sum, counts = sums
    else:
      value_sum, unit_sum, counts = sums
      weight_sum = counts[_COUNT_CLIENT]
    mean = tf.nest.map_structure(
        lambda t: tf.math.divide(t, tf.cast(weight_sum, t.dtype)), value_sum)
    num_clients = counts[_COUNT_CLIENT]
    outputs = (mean,)
    if clipping_norm is not None:
      unclipped_fraction = (
          tf.cast(num_clients - counts[_COUNT_CLIPPED], tf.float32) /
          tf.cast(num_clients, tf.float32))
      outputs += (clipping_norm * tf.math.exp(
          -clipping_learning_rate * (unclipped_fraction - target_quantile)),)
    return outputs + diagnostics.cohort_measurements(
        mean, unit_sum, num_clients, counts[_COUNT_NONFINITE],
        counts[_COUNT_DIRECTION]) + (counts[_COUNT_CLIPPED],)

  if clipping:
    return tff.tensorflow.computation(finish, sums_type,
                                      tff.TensorType(np.float32))
  return tff.tensorflow.computation(lambda sums: finish(sums, None),
                                    sums_type)


def finish_round(state, outputs, *, weighted: bool,
                 clipping: bool) -> tff.templates.MeasuredProcessOutput:
  """The process's output from `build_server_computation`'s `outputs` at the
  server: its next state, the mean, and the composition's measurements."""
  if clipping:
    (mean, new_state, update_norm, mean_cosine, num_clients, num_nonfinite,
     num_zero, num_clipped) = outputs
  else:
    (mean, update_norm, mean_cosine, num_clients, num_nonfinite, num_zero,
     _) = outputs
    new_state = state
  # The composition's measurements: its sum factories measure nothing.
  empty = tff.federated_value((), tff.SERVER)
  mean_measurements = collections.OrderedDict(mean_value=empty)
  if weighted:
    mean_measurements['mean_weight'] = empty
  else:
    mean_measurements['mean_count'] = empty
  inner_measurements = mean_measurements
  if clipping:
    inner_measurements = collections.OrderedDict(
        clipping=tff.federated_zip(mean_measurements),
        clipping_norm=state,
        clipped_count=num_clipped)
  measurements = collections.OrderedDict(
      update_norm=update_norm,
      mean_pairwise_cosine=mean_cosine,
      num_clients=num_clients,
      num_nonfinite_updates=num_nonfinite,
      num_zero_updates=num_zero,
      inner_aggregator=tff.federated_zip(inner_measurements),
  )
  return tff.templates.MeasuredProcessOutput(
      state=new_state, result=mean,
      measurements=tff.federated_zip(measurements))


def _build_process(value_type: tff.types.Type,
                   weight_type: Optional[tff.types.Type], clipping: bool,
                   initial_clipping_norm: float, target_quantile: float,
                   clipping_learning_rate: float
                   ) -> tff.templates.AggregationProcess:
  """The aggregation process (module docstring).

  Raises:
    ValueError: If `value_type` is not a structure of floats.
  """
  if not tff.types.is_structure_of_floats(value_type):
    raise ValueError('diagnosed_mean_factory needs a structure of floats, got '
                     f'value_type {value_type}.')
  zero, accumulate, merge, report = build_summing_computations(
      value_type, weight_type, clipping)
  server_computation = build_server_computation(
      report.type_signature.result, weight_type is not None, clipping,
      target_quantile, clipping_learning_rate)
  initial_state = np.float32(initial_clipping_norm) if clipping else ()

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value(initial_state, tff.SERVER)

  def next_impl(state, value, weight):
    client_args = collections.OrderedDict(value=value)
    if weight is not None:
      client_args['weight'] = weight
    if clipping:
      client_args['clipping_norm'] = tff.federated_broadcast(state)
    sums = tff.federated_aggregate(tff.federated_zip(client_args), zero(),
                                   accumulate, merge, report)
    outputs = tff.federated_map(server_computation,
                                (sums, state) if clipping else sums)
    return finish_round(state, outputs, weighted=weight is not None,
                        clipping=clipping)

  state_type = init_fn.type_signature.result
  value_at_clients = tff.FederatedType(value_type, tff.CLIENTS)
  if weight_type is None:

    @tff.federated_computation(state_type, value_at_clients)
    def next_fn(state, value):
      return next_impl(state, value, None)

  else:

    @tff.federated_computation(state_type, value_at_clients,
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      return next_impl(state, value, weight)

  return tff.templates.AggregationProcess(init_fn, next_fn)


class WeightedDiagnosedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """The weighted mean's processes (module docstring)."""

  def __init__(self, **settings: Any):
    self.settings = settings

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    return _build_process(value_type, weight_type, **self.settings)


class UnweightedDiagnosedMeanFactory(
    tff.aggregators.UnweightedAggregationFactory):
  """The unweighted mean's processes (module docstring)."""

  def __init__(self, **settings: Any):
    self.settings = settings

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return _build_process(value_type, None, **self.settings)


def diagnosed_mean_factory(
    *,
    clipping: bool = True,
    weighted: bool = True,
    initial_clipping_norm: float = 1.0,
    target_quantile: float = 0.8,
    clipping_learning_rate: float = 0.2,
) -> aggregator_wrappers.AggregationFactory:
  """The mean of the client updates with diagnostics and adaptive clipping.

  Equals `diagnostics.diagnostics_factory(tff.learning.robust_aggregator(
  zeroing=False, clipping=clipping, weighted=weighted))` at the default
  clipping settings, in one client computation and one sum (module
  docstring).

  Args:
    clipping: Whether to clip each update to the adaptive norm `ρ`.
    weighted: Whether the mean is weighted by the clients' weights.
    initial_clipping_norm: `ρ_1`.
    target_quantile: `q`, the fraction of updates to leave unclipped.
    clipping_learning_rate: `η_a` of the geometric update of `ρ`.

  Raises:
    ValueError: If `initial_clipping_norm` is not positive, `target_quantile`
      is outside [0, 1] or `clipping_learning_rate` is negative.
  """
  if not initial_clipping_norm > 0.0:
    raise ValueError('initial_clipping_norm must be positive, got '
                     f'{initial_clipping_norm}.')
  if not 0.0 <= target_quantile <= 1.0:
    raise ValueError(
        f'target_quantile must be in [0, 1], got {target_quantile}.')
  if not clipping_learning_rate >= 0.0:
    raise ValueError('clipping_learning_rate must be non-negative, got '
                     f'{clipping_learning_rate}.')
  settings = dict(clipping=clipping,
                  initial_clipping_norm=initial_clipping_norm,
                  target_quantile=target_quantile,
                  clipping_learning_rate=clipping_learning_rate)
  if weighted:
    return WeightedDiagnosedMeanFactory(**settings)
  return UnweightedDiagnosedMeanFactory(**settings)
