"""Normalized FedAvg takes unit-norm steps along the mean client update."""

import numpy as np
import pytest
import tensorflow_federated as tff

from large_cohort import normalized_update
from tests import tiny_models

_VALUE_TYPE = tff.types.StructWithPythonType(
    [tff.TensorType(np.float32, [2, 2]), tff.TensorType(np.float32, [1])],
    list)


def _flat(update):
  return np.concatenate([np.ravel(t) for t in update]).astype(np.float64)


def test_weighted_aggregate_is_divided_by_its_global_norm():
  updates = [[np.array([[1.0, 0.0], [2.0, -1.0]], np.float32),
              np.array([3.0], np.float32)],
             [np.array([[0.0, 4.0], [-2.0, 1.0]], np.float32),
              np.array([-1.0], np.float32)],
             [np.array([[1.0, 1.0], [1.0, 1.0]], np.float32),
              np.array([0.0], np.float32)]]
  weights = [1.0, 3.0, 2.0]
  process = normalized_update.normalized_update_factory(
      tff.aggregators.MeanFactory()).create(_VALUE_TYPE,
                                            tff.TensorType(np.float32))
  output = process.next(process.initialize(), updates, weights)
  mean = sum(w * _flat(u) for u, w in zip(updates, weights)) / sum(weights)
  np.testing.assert_allclose(_flat(output.result),
                             mean / np.linalg.norm(mean), rtol=1e-6)
  assert output.result[0].shape == (2, 2)
  assert output.measurements['unnormalized_update_norm'] == pytest.approx(
      np.linalg.norm(mean), rel=1e-6)


def test_unweighted_aggregate_is_normalized_and_zero_stays_zero():
  process = normalized_update.normalized_update_factory(
      tff.aggregators.UnweightedMeanFactory()).create(_VALUE_TYPE)
  updates = [[np.full((2, 2), 3.0, np.float32), np.array([4.0], np.float32)],
             [np.full((2, 2), -1.0, np.float32), np.array([0.0], np.float32)]]
  output = process.next(process.initialize(), updates)
  mean = (_flat(updates[0]) + _flat(updates[1])) / 2
  np.testing.assert_allclose(_flat(output.result),
                             mean / np.linalg.norm(mean), rtol=1e-6)
  zeros = [[np.zeros((2, 2), np.float32), np.zeros(1, np.float32)]] * 2
  output = process.next(process.initialize(), zeros)
  np.testing.assert_array_equal(_flat(output.result), np.zeros(5))
  assert output.measurements['unnormalized_update_norm'] == 0.0


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='inner_factory'):
    normalized_update.normalized_update_factory(None)
  with pytest.raises(ValueError, match='server_learning_rate'):
    normalized_update.build_normalized_fed_avg(
        lambda: None, client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        server_learning_rate=0.0)


# --- Normalized FedAvg, two rounds on a linear model, against NumPy ---
def test_two_rounds_of_normalized_fed_avg_match_numpy():
  server_learning_rate = 0.3
  process = normalized_update.build_normalized_fed_avg(
      tiny_models.linear_model_fn(tiny_models.FEDAVG_NUM_FEATURES),
      client_optimizer=tff.learning.optimizers.build_sgdm(
          tiny_models.FEDAVG_CLIENT_LEARNING_RATE),
      server_learning_rate=server_learning_rate)
  weights, weights_per_round = tiny_models.run_fedavg_rounds(process, 2)
  for actual in weights_per_round:
    update = tiny_models.numpy_fedavg_update(*weights)
    norm = np.linalg.norm(_flat(update))
    new_weights = [w - server_learning_rate * u / norm
                   for w, u in zip(weights, update)]
    for got, want in zip(actual, new_weights):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Every server step has length exactly η_s.
    assert np.linalg.norm(_flat(actual) - _flat(weights)) == pytest.approx(
        server_learning_rate, rel=1e-5)
    weights = new_weights
