"""Diagnostics aggregator and helpers agree with NumPy on explicit updates.

Also checks that TFF's `robust_aggregator` clipping is SPEC.md §1's adaptive
clipping: `ρ_1 = 1`, clip to `ρ`, `ρ ← ρ·exp(−0.2·(b − 0.8))`.
"""

import collections
import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnostics
from tests import tiny_models

_VALUE_TYPE = tff.types.StructWithPythonType(
    [tff.TensorType(np.float32, [3]), tff.TensorType(np.float32, [2])], list)
_WEIGHT_TYPE = tff.TensorType(np.float32)


def _client_updates(num_clients, seed):
  rng = np.random.default_rng(seed)
  return [[rng.normal(size=3).astype(np.float32),
           rng.normal(size=2).astype(np.float32)]
          for _ in range(num_clients)]


def _flat(update):
  return np.concatenate([np.ravel(t) for t in update]).astype(np.float64)


def _numpy_mean_pairwise_cosine(updates):
  vectors = [_flat(u) for u in updates]
  cosines = [a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
             for a, b in itertools.permutations(vectors, 2)]
  return np.mean(cosines)


def _weighted_mean(updates, weights):
  return (sum(w * _flat(u) for u, w in zip(updates, weights))
          / sum(weights))


def _run_weighted(inner, updates, weights):
  process = diagnostics.diagnostics_factory(inner).create(
      _VALUE_TYPE, _WEIGHT_TYPE)
  return process.next(process.initialize(), updates, weights)


def test_weighted_measurements_match_numpy():
  updates = _client_updates(4, seed=0)
  weights = [1.0, 2.0, 3.0, 4.0]
  output = _run_weighted(tff.aggregators.MeanFactory(), updates, weights)
  expected_mean = _weighted_mean(updates, weights)
  np.testing.assert_allclose(_flat(output.result), expected_mean,
                             rtol=1e-5, atol=1e-6)
  measurements = output.measurements
  assert measurements['update_norm'] == pytest.approx(
      np.linalg.norm(expected_mean), rel=1e-5)
  assert measurements['mean_pairwise_cosine'] == pytest.approx(
      _numpy_mean_pairwise_cosine(updates), abs=1e-6)
  assert measurements['num_clients'] == 4
  assert measurements['num_nonfinite_updates'] == 0
  assert measurements['num_zero_updates'] == 0
  assert set(measurements['inner_aggregator']) == {'mean_value', 'mean_weight'}


def test_unweighted_measurements_match_numpy():
  updates = _client_updates(3, seed=1)
  process = diagnostics.diagnostics_factory(
      tff.aggregators.UnweightedMeanFactory()).create(_VALUE_TYPE)
  output = process.next(process.initialize(), updates)
  expected_mean = np.mean([_flat(u) for u in updates], axis=0)
  np.testing.assert_allclose(_flat(output.result), expected_mean,
                             rtol=1e-5, atol=1e-6)
  assert output.measurements['update_norm'] == pytest.approx(
      np.linalg.norm(expected_mean), rel=1e-5)
  assert output.measurements['mean_pairwise_cosine'] == pytest.approx(
      _numpy_mean_pairwise_cosine(updates), abs=1e-6)
  assert output.measurements['num_clients'] == 3


def test_parallel_and_opposite_updates_give_extreme_cosines():
  same = [[np.array([1.0, 2.0, 0.0], np.float32), np.array([0.0, 2.0],
                                                           np.float32)]]
  parallel = [same[0], [2.0 * t for t in same[0]], [0.5 * t for t in same[0]]]
  opposite = [same[0], [-t for t in same[0]]]
  assert _run_weighted(tff.aggregators.MeanFactory(), parallel, [1.0] * 3
                       ).measurements['mean_pairwise_cosine'] == pytest.approx(
                           1.0, abs=1e-6)
  assert _run_weighted(tff.aggregators.MeanFactory(), opposite, [1.0] * 2
                       ).measurements['mean_pairwise_cosine'] == pytest.approx(
                           -1.0, abs=1e-6)


def test_nonfinite_updates_are_excluded_and_counted():
  finite = _client_updates(2, seed=2)
  with_nan = [np.array([np.nan, 1.0, 1.0], np.float32),
              np.array([1.0, 1.0], np.float32)]
  with_inf = [np.array([1.0, 1.0, 1.0], np.float32),
              np.array([np.inf, 1.0], np.float32)]
  updates = [finite[0], with_nan, finite[1], with_inf]
  weights = [2.0, 5.0, 3.0, 7.0]
  output = _run_weighted(tff.aggregators.MeanFactory(), updates, weights)
  expected_mean = _weighted_mean(finite, [2.0, 3.0])
  assert np.all(np.isfinite(_flat(output.result)))
  np.testing.assert_allclose(_flat(output.result), expected_mean,
                             rtol=1e-5, atol=1e-6)
  assert output.measurements['num_nonfinite_updates'] == 2
  assert output.measurements['num_zero_updates'] == 0
  assert output.measurements['num_clients'] == 4
  assert output.measurements['mean_pairwise_cosine'] == pytest.approx(
      _numpy_mean_pairwise_cosine(finite), abs=1e-6)


def test_finite_update_whose_squares_overflow_float32_keeps_its_direction():
  # 1e30² overflows float32: the client screen's fast float32 norm is Inf,
  # and the float64 recomputation must tell this finite update from a NaN.
  huge = [np.array([3e30, 0.0, 0.0], np.float32),
          np.array([4e30, 0.0], np.float32)]
  same_direction = [np.array([3.0, 0.0, 0.0], np.float32),
                    np.array([4.0, 0.0], np.float32)]
  output = _run_weighted(tff.aggregators.MeanFactory(),
                         [huge, same_direction], [1.0, 1.0])
  assert output.measurements['num_nonfinite_updates'] == 0
  assert output.measurements['num_zero_updates'] == 0
  assert output.measurements['mean_pairwise_cosine'] == pytest.approx(
      1.0, abs=1e-6)


def test_cosine_skips_zero_updates_and_is_nan_below_two_directions():
  nonzero = _client_updates(1, seed=3)[0]
  zero = [np.zeros(3, np.float32), np.zeros(2, np.float32)]
  output = _run_weighted(tff.aggregators.MeanFactory(), [nonzero, zero],
                         [1.0, 1.0])
  assert math.isnan(output.measurements['mean_pairwise_cosine'])
  assert output.measurements['num_zero_updates'] == 1
  np.testing.assert_allclose(_flat(output.result), _flat(nonzero) / 2,
                             rtol=1e-6)


def test_rejects_non_factory():
  with pytest.raises(ValueError, match='inner_factory'):
    diagnostics.diagnostics_factory('mean')


def test_robust_aggregator_clipping_is_the_papers_adaptive_clipping():
  """Two rounds of `robust_aggregator(zeroing=False)` against Algorithm 2."""
  process = diagnostics.diagnostics_factory(
      tff.learning.robust_aggregator(zeroing=False, clipping=True,
                                     weighted=True)).create(
                                         _VALUE_TYPE, _WEIGHT_TYPE)
  state = process.initialize()
  clip = 1.0  # ρ_1
  for round_num in range(3):
    updates = [[(round_num + 1) * scale * t for t in u] for scale, u in zip(
        (0.1, 0.3, 0.5, 2.0, 4.0), _client_updates(5, seed=10 + round_num))]
    weights = [1.0, 2.0, 1.0, 3.0, 2.0]
    output = process.next(state, updates, weights)
    state = output.state
    clipping = output.measurements['inner_aggregator']
    assert clipping['clipping_norm'] == pytest.approx(clip, rel=1e-5)
    norms = np.array([np.linalg.norm(_flat(u)) for u in updates])
    clipped = [_flat(u) * min(1.0, clip / n) for u, n in zip(updates, norms)]
    np.testing.assert_allclose(
        _flat(output.result),
        sum(w * c for w, c in zip(weights, clipped)) / sum(weights),
        rtol=1e-5, atol=1e-6)
    assert clipping['clipped_count'] == np.sum(norms > clip)
    # The cosine is measured on the raw (unclipped) updates.
    assert output.measurements['mean_pairwise_cosine'] == pytest.approx(
        _numpy_mean_pairwise_cosine(updates), abs=1e-6)
    unclipped_fraction = np.mean(norms <= clip)  # b^t, unweighted
    clip *= math.exp(-0.2 * (unclipped_fraction - 0.8))  # eq. (4)


def test_in_fed_avg_update_norm_is_the_server_step():
  process = tff.learning.algorithms.build_weighted_fed_avg(
      tiny_models.linear_model_fn(2),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=diagnostics.diagnostics_factory(
          tff.aggregators.MeanFactory()))
  rng = np.random.default_rng(4)
  datasets = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=(n, 2)).astype(np.float32),
      y=rng.normal(size=(n, 1)).astype(np.float32))).batch(2)
              for n in (3, 4, 5)]
  state = process.initialize()
  before = _flat(process.get_model_weights(state).trainable)
  output = process.next(state, datasets)
  after = _flat(process.get_model_weights(output.state).trainable)
  aggregator_metrics = output.metrics['aggregator']
  # Server SGD at rate 1 moves the model by exactly the aggregate.
  assert aggregator_metrics['update_norm'] == pytest.approx(
      np.linalg.norm(after - before), rel=1e-5)
  assert aggregator_metrics['num_clients'] == 3
  assert -1.0 <= aggregator_metrics['mean_pairwise_cosine'] <= 1.0


@pytest.mark.parametrize('previous, current, failed', [
    (0.8, 0.4, True), (0.8, 0.41, False), (0.8, 0.0, True), (0.0, 0.0, False),
    (0.5, 0.9, False)])
def test_catastrophic_failure_is_halving_in_one_round(previous, current,
                                                      failed):
  assert diagnostics.is_catastrophic_failure(previous, current) is failed


def test_catastrophic_failure_rounds():
  accuracies = [0.1, 0.3, 0.6, 0.25, 0.5, 0.24, 0.3]
  assert diagnostics.catastrophic_failure_rounds(accuracies) == [4, 6]
  assert diagnostics.catastrophic_failure_rounds(
      accuracies, first_round=11) == [14, 16]
  with pytest.raises(ValueError, match='accuracy'):
    diagnostics.catastrophic_failure_rounds([0.5, float('nan')])


def test_cumulative_examples():
  np.testing.assert_array_equal(
      diagnostics.cumulative_examples([10, 0, 5, 7]), [10, 10, 15, 22])
  with pytest.raises(ValueError, match='examples'):
    diagnostics.cumulative_examples([3, -1])
