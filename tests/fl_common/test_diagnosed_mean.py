"""The one-pass mean with clipping and diagnostics equals the composition it
replaces, agrees with SPEC.md §1's adaptive clipping in NumPy, and is one
client computation and one sum."""

import collections
import math
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from fl_common import diagnostics
from large_cohort import fedopt
from tests import tiny_models

_VALUE_TYPE = tff.types.StructWithPythonType(
    [tff.TensorType(np.float32, [3]), tff.TensorType(np.float32, [2])], list)
_WEIGHT_TYPE = tff.TensorType(np.float32)
# The two computations sum clients' float32 values in different orders, and
# TFF's executor does not fix the order (clients finish concurrently): values
# of order 1 may differ by a few ulps, so an element near zero needs an
# absolute tolerance (seen: 1.2e-7 on a weight of -0.03 on a busy machine).
_SUM_ORDER_TOLERANCE = dict(rtol=1e-6, atol=1e-6)


def _flat(update):
  return np.concatenate([np.ravel(t) for t in update]).astype(np.float64)


def _create(factory, weighted):
  if weighted:
    return factory.create(_VALUE_TYPE, _WEIGHT_TYPE)
  return factory.create(_VALUE_TYPE)


def _next(process, state, updates, weights):
  if weights is None:
    return process.next(state, updates)
  return process.next(state, updates, weights)


def _round_updates(rng, round_num):
  """Updates of norms around the clipping norm, one NaN and one zero."""
  updates = [[(s * rng.normal(size=3)).astype(np.float32),
              (s * rng.normal(size=2)).astype(np.float32)]
             for s in (0.1, 0.4, 0.9, 2.0 + round_num, 5.0)]
  updates.append([np.array([np.nan, 1.0, 1.0], np.float32),
                  np.ones(2, np.float32)])
  updates.append([np.zeros(3, np.float32), np.zeros(2, np.float32)])
  return updates


def _assert_measurements_equal(actual, expected):
  assert list(actual) == list(expected)
  for name, value in expected.items():
    if isinstance(value, collections.OrderedDict):
      _assert_measurements_equal(actual[name], value)
    elif isinstance(value, tuple):
      assert actual[name] == value
    else:
      np.testing.assert_allclose(actual[name], value, **_SUM_ORDER_TOLERANCE)


@pytest.mark.parametrize('clipping', [True, False])
@pytest.mark.parametrize('weighted', [True, False])
def test_equals_diagnostics_around_robust_aggregator(clipping, weighted):
  fused = _create(diagnosed_mean.diagnosed_mean_factory(
      clipping=clipping, weighted=weighted), weighted)
  composition = _create(diagnostics.diagnostics_factory(
      tff.learning.robust_aggregator(zeroing=False, clipping=clipping,
                                     weighted=weighted)), weighted)
  assert (fused.next.type_signature.result.measurements ==
          composition.next.type_signature.result.measurements)
  assert (fused.next.type_signature.result.result ==
          composition.next.type_signature.result.result)
  rng = np.random.default_rng(0)
  fused_state, composition_state = fused.initialize(), composition.initialize()
  weights = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] if weighted else None
  for round_num in range(3):
    updates = _round_updates(rng, round_num)
    fused_output = _next(fused, fused_state, updates, weights)
    composition_output = _next(composition, composition_state, updates,
                               weights)
    np.testing.assert_allclose(_flat(fused_output.result),
                               _flat(composition_output.result),
                               **_SUM_ORDER_TOLERANCE)
    _assert_measurements_equal(fused_output.measurements,
                               composition_output.measurements)
    fused_state = fused_output.state
    composition_state = composition_output.state
  if clipping:  # The clipping norm moved, identically.
    norm = fused_output.measurements['inner_aggregator']['clipping_norm']
    assert norm != pytest.approx(1.0)


def test_clipping_settings_follow_the_papers_rule_in_numpy():
  """Three rounds at ρ_1 = 0.5, q = 0.5, η_a = 0.3 against SPEC.md eq. (4)."""
  process = diagnosed_mean.diagnosed_mean_factory(
      initial_clipping_norm=0.5, target_quantile=0.5,
      clipping_learning_rate=0.3).create(_VALUE_TYPE, _WEIGHT_TYPE)
  state = process.initialize()
  rng = np.random.default_rng(1)
  clip = 0.5
  for _ in range(3):
    updates = [[(s * rng.normal(size=3)).astype(np.float32),
                (s * rng.normal(size=2)).astype(np.float32)]
               for s in (0.05, 0.2, 0.4, 1.0)]
    weights = [4.0, 1.0, 2.0, 3.0]
    output = process.next(state, updates, weights)
    state = output.state
    norms = np.array([np.linalg.norm(_flat(u)) for u in updates])
    clipped = [_flat(u) * min(1.0, clip / n) for u, n in zip(updates, norms)]
    np.testing.assert_allclose(
        _flat(output.result),
        sum(w * c for w, c in zip(weights, clipped)) / sum(weights),
        rtol=1e-5, atol=1e-6)
    inner = output.measurements['inner_aggregator']
    assert inner['clipping_norm'] == pytest.approx(clip, rel=1e-5)
    assert inner['clipped_count'] == np.sum(norms > clip)
    clip *= math.exp(-0.3 * (np.mean(norms <= clip) - 0.5))
    assert state == pytest.approx(clip, rel=1e-5)


def _intrinsic_counts(process):
  text = process.next.to_building_block().compact_representation()
  return {name: len(re.findall(name + r'\b', text))
          for name in ('federated_map', 'federated_sum', 'federated_aggregate')}


def test_one_client_computation_inside_one_aggregate():
  fused = diagnosed_mean.diagnosed_mean_factory().create(_VALUE_TYPE,
                                                         _WEIGHT_TYPE)
  composition = diagnostics.diagnostics_factory(
      tff.learning.robust_aggregator(zeroing=False)).create(
          _VALUE_TYPE, _WEIGHT_TYPE)
  assert _intrinsic_counts(fused) == {
      'federated_map': 0, 'federated_sum': 0, 'federated_aggregate': 1}
  assert _intrinsic_counts(composition)['federated_sum'] == 5


def test_in_fedavg_equals_the_composition():
  rng = np.random.default_rng(2)
  datasets = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=(n, 2)).astype(np.float32),
      y=(5.0 * rng.normal(size=(n, 1))).astype(np.float32))).batch(2)
              for n in (3, 4, 5)]
  outputs = []
  initial_weights = None
  for aggregator in (diagnosed_mean.diagnosed_mean_factory(),
                     diagnostics.diagnostics_factory(
                         tff.learning.robust_aggregator(zeroing=False))):
    process = fedopt.build_fedopt(
        tiny_models.linear_model_fn(2),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.5),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        model_aggregator=aggregator)
    state = process.initialize()
    if initial_weights is None:
      initial_weights = process.get_model_weights(state)
    state = process.set_model_weights(state, initial_weights)
    for _ in range(2):
      output = process.next(state, datasets)
      state = output.state
    outputs.append((process.get_model_weights(state).trainable,
                    output.metrics['aggregator']))
  (fused_weights, fused_metrics), (weights, metrics) = outputs
  np.testing.assert_allclose(_flat(fused_weights), _flat(weights),
                             **_SUM_ORDER_TOLERANCE)
  _assert_measurements_equal(fused_metrics, metrics)
  assert fused_metrics['inner_aggregator']['clipped_count'] > 0


@pytest.mark.parametrize('settings, message', [
    (dict(initial_clipping_norm=0.0), 'initial_clipping_norm'),
    (dict(target_quantile=1.5), 'target_quantile'),
    (dict(clipping_learning_rate=-0.1), 'clipping_learning_rate'),
])
def test_rejects_bad_settings(settings, message):
  with pytest.raises(ValueError, match=message):
    diagnosed_mean.diagnosed_mean_factory(**settings)


def test_rejects_non_float_values():
  with pytest.raises(ValueError, match='structure of floats'):
    diagnosed_mean.diagnosed_mean_factory().create(
        tff.TensorType(np.int32, [3]), _WEIGHT_TYPE)
