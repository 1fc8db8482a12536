"""FedNova aggregation against a NumPy reference with heterogeneous tau_i."""

import numpy as np
import pytest
import tensorflow_federated as tff

from fl_common import fednova

DELTA_TYPE = tff.to_type([tff.TensorType(np.float32, [2, 2]),
                          tff.TensorType(np.float32, [3])])
VALUE_TYPE = fednova.fednova_update_type(DELTA_TYPE)
WEIGHT_TYPE = tff.TensorType(np.float32)


def momentum_normalizer(steps, alpha=0.9):
  """`||a_i||_1` of FedNova's momentum vector for `steps` local steps."""
  return sum((1 - alpha**j) / (1 - alpha) for j in range(1, steps + 1))


def client_values(rng, normalizers):
  return [
      fednova.FedNovaClientUpdate(
          model_delta=[rng.normal(size=(2, 2)).astype(np.float32),
                       rng.normal(size=3).astype(np.float32)],
          normalizer=np.float32(n))
      for n in normalizers
  ]


def flat(delta):
  return np.concatenate([np.asarray(t).reshape(-1) for t in delta])


def numpy_fednova(values, weights):
  """Delta = (sum_i p_i ||a_i||_1) * sum_i p_i Delta_i / ||a_i||_1."""
  p = np.asarray(weights, np.float64) / np.sum(weights)
  normalizers = np.array([v.normalizer for v in values], np.float64)
  deltas = np.stack([flat(v.model_delta) for v in values])
  safe = np.where(normalizers > 0, normalizers, 1.0)
  normalized = np.where(normalizers[:, None] > 0, deltas / safe[:, None], 0.0)
  tau_eff = p @ normalizers
  return tau_eff * (p @ normalized), tau_eff


def test_matches_numpy_for_heterogeneous_steps():
  rng = np.random.default_rng(0)
  normalizers = [momentum_normalizer(s) for s in (4, 9, 13, 20)]
  values = client_values(rng, normalizers)
  weights = [20.0, 80.0, 40.0, 100.0]
  process = fednova.FedNovaAggregationFactory().create(VALUE_TYPE,
                                                       WEIGHT_TYPE)
  output = process.next(process.initialize(), values, weights)
  expected, tau_eff = numpy_fednova(values, weights)
  np.testing.assert_allclose(flat(output.result), expected, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(output.measurements['effective_steps'], tau_eff,
                             rtol=1e-6)
  np.testing.assert_allclose(output.measurements['update_norm'],
                             np.linalg.norm(expected), rtol=1e-5)
  # Not the plain weighted mean of the deltas: normalization matters here.
  plain_mean = np.average(np.stack([flat(v.model_delta) for v in values]),
                          axis=0, weights=weights)
  assert np.abs(plain_mean - expected).max() > 1e-2


def test_equal_normalizers_give_weighted_mean():
  rng = np.random.default_rng(1)
  values = client_values(rng, [5.0, 5.0, 5.0])
  weights = [1.0, 2.0, 3.0]
  process = fednova.FedNovaAggregationFactory().create(VALUE_TYPE,
                                                       WEIGHT_TYPE)
  output = process.next(process.initialize(), values, weights)
  plain_mean = np.average(np.stack([flat(v.model_delta) for v in values]),
                          axis=0, weights=weights)
  np.testing.assert_allclose(flat(output.result), plain_mean,
                             rtol=1e-5, atol=1e-6)


def test_client_without_steps_adds_no_nan():
  rng = np.random.default_rng(2)
  values = client_values(rng, [0.0, 3.0])
  values[0] = values[0]._replace(
      model_delta=[np.zeros((2, 2), np.float32), np.zeros(3, np.float32)])
  weights = [0.0, 10.0]
  process = fednova.FedNovaAggregationFactory().create(VALUE_TYPE,
                                                       WEIGHT_TYPE)
  output = process.next(process.initialize(), values, weights)
  np.testing.assert_allclose(flat(output.result), flat(values[1].model_delta),
                             rtol=1e-6)


def test_inner_factory_sees_normalized_deltas():
  rng = np.random.default_rng(3)
  normalizers = [2.0, 6.0, 11.0]
  values = client_values(rng, normalizers)
  weights = [1.0, 1.0, 1.0]
  clip_norm = 0.2
  clipping_mean = tff.aggregators.clipping_factory(
      clip_norm, tff.aggregators.MeanFactory())
  process = fednova.FedNovaAggregationFactory(clipping_mean).create(
      VALUE_TYPE, WEIGHT_TYPE)
  output = process.next(process.initialize(), values, weights)
  normalized = [flat(v.model_delta) / n for v, n in zip(values, normalizers)]
  clipped = [d * min(1.0, clip_norm / np.linalg.norm(d)) for d in normalized]
  expected = np.mean(normalizers) * np.mean(clipped, axis=0)
  np.testing.assert_allclose(flat(output.result), expected,
                             rtol=1e-5, atol=1e-6)


def test_bad_value_type_raises_value_error():
  with pytest.raises(ValueError, match='float32'):
    fednova.FedNovaAggregationFactory().create(DELTA_TYPE, WEIGHT_TYPE)


def test_bad_inner_factory_raises_type_error():
  with pytest.raises(TypeError, match='UnweightedMeanFactory'):
    fednova.FedNovaAggregationFactory(tff.aggregators.UnweightedMeanFactory())
