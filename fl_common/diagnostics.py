"""Per-round measurements of large-cohort training (Charles et al. 2021).

`diagnostics_factory(inner)` wraps any `tff.aggregators` factory (weighted or
unweighted) and adds, inside the TFF computation, what the paper reads each
round (SPEC.md §1 "Measurements"):

* `update_norm`: `‖Δ‖₂`, the global L2 norm (over all variables) of the
  aggregate the inner factory returns, i.e. of the server pseudo-gradient
  (Section 4, Figures 1 and 8).
* `mean_pairwise_cosine`: eq. (5) of appendix B.6.1, the mean cosine
  similarity over all pairs `i ≠ j` of the cohort's client updates. With unit
  vectors `u_k = Δ_k/‖Δ_k‖₂`,
  `Σ_{i≠j} ⟨u_i, u_j⟩ = ‖Σ_k u_k‖² − M`, so the mean over the `M(M − 1)`
  ordered (equivalently `M(M − 1)/2` unordered) pairs is
  `(‖Σ_k u_k‖² − M) / (M(M − 1))`: each client sends `u_k` to one extra
  `federated_sum` (one model-sized vector per client; the cost is linear in
  `M`) and no update leaves the computation. Eq. (5) as printed divides a sum
  over ordered pairs by `C(M, 2)`, which is twice the average the text
  describes ("take the average over all pairs"); the average is reported.
  Only clients with a finite, non-zero update enter `M` here; with fewer than
  two of them the value is NaN (the mean over no pair is undefined).
* `num_clients`: the cohort size `M` that reached the aggregator.
* `num_nonfinite_updates`: client updates containing a NaN or Inf. Such an
  update is replaced by zeros (and, for a weighted inner factory, its weight
  by 0) before the inner factory sees it, so it never reaches the server
  model. With an unweighted inner factory the zeroed update still counts in
  the mean's denominator, as with `tff.aggregators.zeroing_factory`.
* `num_zero_updates`: finite client updates that are exactly zero. TFF's
  model-delta client work (FedOpt, FedSGD) zeroes a non-finite delta on the
  client and gives it weight 0, so behind it a diverged client arrives here
  as a zero update, not a non-finite one: this column is where it shows. A
  client without examples, or one whose training left the model unchanged,
  also sends zeros. Zero updates have no direction and are excluded from the
  cosine.

The inner factory's own measurements are kept under `inner_aggregator`.

Placement: cosines are scale-invariant, so clipping does not change them
(B.6.1), but zeroing and non-finite screening do; put this factory outside
TFF's robust aggregator so it sees the raw client updates:
`diagnostics_factory(tff.learning.robust_aggregator(...))` (without zeroing,
`diagnosed_mean.diagnosed_mean_factory` computes the same in one pass). It
is stateless (its state is the inner factory's). For normalized FedAvg, wrap
it in the normalizing factory (`normalized_update.normalized_update_factory(
diagnostics_factory(...))`), so that `update_norm` is `‖Δ‖₂` before
normalization.

The module also has the pure-Python helpers the paper's analysis uses:
catastrophic failures (Section 3.1) and cumulative examples (Section 3.5).
"""

import collections
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import aggregator_wrappers


# Per-client counts, summed in one `federated_sum`: (1, non-finite, direction).
_COUNT_CLIENT, _COUNT_NONFINITE, _COUNT_DIRECTION = range(3)


def screen_norm(value: Any) -> tf.Tensor:
  """Global L2 norm of a client update, as a float64 scalar; NaN or Inf if
  (and only if) the update has a NaN or Inf entry.

  One float32 pass over the update (its sums of squares, as
  `tf.linalg.global_norm` but without its `L2Loss`, which `tf.vectorized_map`
  cannot vectorize: `fl_engine.lanes` maps this over clients); only when
  that overflows or is not finite is the norm recomputed in float64, which
  tells a finite update whose squares overflow float32 from a non-finite one.
  """
  flat = tf.nest.flatten(value)
  norm = tf.cast(tf.sqrt(tf.add_n(
      [tf.reduce_sum(tf.square(t)) for t in flat])), tf.float64)
  return tf.cond(tf.math.is_finite(norm), lambda: norm,
                 lambda: aggregator_wrappers.global_norm(flat))


def _build_client_screen(value_type: tff.types.Type,
                         weight_type: Optional[tff.types.Type]
                         ) -> tff.Computation:
  """Client side, one computation per client: screening and unit vector.

  Returns `value -> <safe_value, unit_value, counts>` (unweighted) or
  `<value, weight> -> <safe_value, safe_weight, unit_value, counts>`:
  `safe_value` is the update, or zeros if it has a NaN or Inf entry (and
  `safe_weight` is then 0); `unit_value` is `value/‖value‖` for a finite
  non-zero update and zeros otherwise; `counts` is int32
  `(1, is_nonfinite, has_direction)`, summed over clients in one
  `federated_sum`. One norm pass and one scaling pass over the update.
  """

  def screen_value(value):
    norm = screen_norm(value)
    is_finite = tf.math.is_finite(norm)
    has_direction = tf.logical_and(is_finite, norm > 0.0)
    safe_value = tf.cond(
        is_finite, lambda: value,
        lambda: tf.nest.map_structure(tf.zeros_like, value))
    inverse_norm = tf.where(has_direction, 1.0 / norm, 0.0)
    unit_value = tf.nest.map_structure(
        lambda t: t * tf.cast(inverse_norm, t.dtype), safe_value)
    counts = tf.stack([
        tf.constant(1),
        tf.cast(tf.logical_not(is_finite), tf.int32),
        tf.cast(has_direction, tf.int32)
    ])
    return safe_value, unit_value, counts, is_finite

  if weight_type is None:

    @tff.tensorflow.computation(value_type)
    def screen(value):
      safe_value, unit_value, counts, _ = screen_value(value)
      return safe_value, unit_value, counts

    return screen

  @tff.tensorflow.computation(value_type, weight_type)
  def screen_weighted(value, weight):
    safe_value, unit_value, counts, is_finite = screen_value(value)
    safe_weight = tf.where(is_finite, weight, tf.zeros_like(weight))
    return safe_value, safe_weight, unit_value, counts

  return screen_weighted


def cohort_measurements(aggregate: Any, unit_sum: Any, num_clients: tf.Tensor,
                        num_nonfinite: tf.Tensor, num_directions: tf.Tensor
                        ) -> tuple[tf.Tensor, ...]:
  """`(‖Δ‖, mean cosine, #clients, #non-finite, #zero updates)` (module
  docstring) from the aggregate `Δ`, `Σ_k u_k` and the int32 client counts;
  an update is non-finite, zero, or has a direction."""
  count = tf.cast(num_directions, tf.float64)
  unit_sum_square_norm = tf.square(aggregator_wrappers.global_norm(unit_sum))
  mean_cosine = tf.where(
      count >= 2.0,
      (unit_sum_square_norm - count) / (count * (count - 1.0)),
      tf.constant(np.nan, tf.float64))
  return (tf.cast(aggregator_wrappers.global_norm(aggregate), tf.float32),
          tf.cast(mean_cosine, tf.float32), num_clients, num_nonfinite,
          num_clients - num_nonfinite - num_directions)


def _build_server_diagnostics(value_type: tff.types.Type) -> tff.Computation:
  """Server-side: `<aggregate, Σu_k, Σcounts> -> cohort_measurements`."""

  @tff.tensorflow.computation(value_type, value_type,
                              tff.TensorType(np.int32, [3]))
  def diagnose(aggregate, unit_sum, counts):
    return cohort_measurements(aggregate, unit_sum, counts[_COUNT_CLIENT],
                               counts[_COUNT_NONFINITE],
                               counts[_COUNT_DIRECTION])

  return diagnose


def _build_next_impl(
    inner_process: tff.templates.AggregationProcess,
    value_type: tff.types.Type,
    weight_type: Optional[tff.types.Type],
) -> aggregator_wrappers.NextImpl:
  """The diagnostics `next` around `inner_process` (weighted if a type)."""
  screen = _build_client_screen(value_type, weight_type)
  diagnose = _build_server_diagnostics(value_type)

  def next_impl(state, value, weight):
    if weight is None:
      safe_value, unit_value, counts = tff.federated_map(screen, value)
      safe_weight = None
    else:
      safe_value, safe_weight, unit_value, counts = tff.federated_map(
          screen, (value, weight))
    inner_output = aggregator_wrappers.inner_next(inner_process, state,
                                                  safe_value, safe_weight)
    unit_sum, count_sums = tff.federated_sum((unit_value, counts))
    (update_norm, mean_pairwise_cosine, num_clients, num_nonfinite,
     num_zero) = tff.federated_map(
         diagnose, (inner_output.result, unit_sum, count_sums))
    measurements = collections.OrderedDict(
        update_norm=update_norm,
        mean_pairwise_cosine=mean_pairwise_cosine,
        num_clients=num_clients,
        num_nonfinite_updates=num_nonfinite,
        num_zero_updates=num_zero,
        inner_aggregator=inner_output.measurements,
    )
    return tff.templates.MeasuredProcessOutput(
        state=inner_output.state,
        result=inner_output.result,
        measurements=tff.federated_zip(measurements))

  return next_impl


def diagnostics_factory(
    inner_factory: aggregator_wrappers.AggregationFactory
) -> aggregator_wrappers.AggregationFactory:
  """Wraps `inner_factory`, adding the paper's per-round measurements.

  See the module docstring for the measurements, the non-finite screening and
  where to place the factory.

  Args:
    inner_factory: A weighted or unweighted `tff.aggregators` factory that
      aggregates the (screened) client updates; the result has its
      weightedness.

  Raises:
    ValueError: If `inner_factory` is not a `tff.aggregators` factory.
  """
  return aggregator_wrappers.wrap_factory('diagnostics_factory',
                                          inner_factory, _build_next_impl)


def _check_accuracy(accuracy: float) -> None:
  if not np.isfinite(accuracy) or accuracy < 0.0:
    raise ValueError(
        f'accuracy must be a finite non-negative number, got {accuracy}.')


def is_catastrophic_failure(previous_accuracy: float, accuracy: float) -> bool:
  """Whether accuracy fell by at least half in one round (Section 3.1).

  The paper's definition: "the training accuracy decreased by a factor of at
  least 1/2 in a single round", i.e. `accuracy <= previous_accuracy / 2`.
  A round starting from accuracy 0 cannot fail (there is nothing to lose).

  Raises:
    ValueError: If either accuracy is negative or not finite.
  """
  _check_accuracy(previous_accuracy)
  _check_accuracy(accuracy)
  return previous_accuracy > 0.0 and accuracy <= 0.5 * previous_accuracy


def catastrophic_failure_rounds(train_accuracies: Sequence[float],
                                first_round: int = 1) -> list[int]:
  """The rounds whose train accuracy is a catastrophic failure.

  Args:
    train_accuracies: Train accuracy of consecutive rounds.
    first_round: The round number of `train_accuracies[0]`.

  Returns:
    The round numbers `r` with `is_catastrophic_failure(acc[r-1], acc[r])`.

  Raises:
    ValueError: If an accuracy is negative or not finite.
  """
  return [first_round + i for i in range(1, len(train_accuracies))
          if is_catastrophic_failure(train_accuracies[i - 1],
                                     train_accuracies[i])]


def cumulative_examples(examples_per_round: Sequence[int]) -> np.ndarray:
  """Running total of the examples processed (data efficiency, Section 3.5).

  Args:
    examples_per_round: Examples the cohort processed in each round.

  Returns:
    An int64 array whose entry `t` is the examples processed in rounds 0..t.

  Raises:
    ValueError: If a count is negative.
  """
  counts = np.asarray(examples_per_round, dtype=np.int64)
  if np.any(counts < 0):
    raise ValueError(
        f'examples per round must be >= 0, got {examples_per_round}.')
  return np.cumsum(counts)
