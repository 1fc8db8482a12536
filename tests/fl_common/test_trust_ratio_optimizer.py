"""fl_common.trust_ratio_optimizer: the trust ratio and the state plumbing.

LARS and LAMB themselves are checked against NumPy in tests/fl_common/test_lars.py
and test_lamb.py; here a minimal subclass (trust-ratio SGD with a step counter)
checks what the base class does for any subclass.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import trust_ratio_optimizer


class _TrustRatioSgd(trust_ratio_optimizer.TrustRatioOptimizer):
  """`x ← x − η·r·g` per tensor, counting its steps in a slot."""

  def __init__(self, learning_rate, decay=0.5):
    super().__init__(
        'TRSGD',
        collections.OrderedDict(learning_rate=learning_rate, decay=decay),
        decay_names=('decay',))

  def _initial_slots(self, specs):
    return collections.OrderedDict(step=0)

  def _update(self, hparams, state, weights, gradients):
    new_weights = [
        w - hparams['learning_rate'] * trust_ratio_optimizer.trust_ratio(w, g)
        * g for w, g in zip(weights, gradients)]
    return collections.OrderedDict(step=state['step'] + 1), new_weights


def _numpy_ratio(weights, direction):
  weights_norm = np.linalg.norm(weights)
  direction_norm = np.linalg.norm(direction)
  if weights_norm > 0 and direction_norm > 0:
    return weights_norm / direction_norm
  return 1.0


def test_trust_ratio_divides_the_norms_and_is_one_for_a_zero_norm():
  weights = tf.constant([3.0, 4.0])
  direction = tf.constant([0.0, 2.0])
  np.testing.assert_allclose(
      trust_ratio_optimizer.trust_ratio(weights, direction), 5.0 / 2.0)
  np.testing.assert_allclose(
      trust_ratio_optimizer.trust_ratio(weights, direction, epsilon=0.5),
      5.0 / 2.5)
  assert trust_ratio_optimizer.trust_ratio(tf.zeros([2]), direction) == 1.0
  assert trust_ratio_optimizer.trust_ratio(weights, tf.zeros([2])) == 1.0


def test_zeros_like_specs_keeps_structure_shapes_and_dtypes():
  zeros = trust_ratio_optimizer.zeros_like_specs(
      [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([1], tf.float64)])
  assert [(z.shape.as_list(), z.dtype) for z in zeros] == [
      ([2, 3], tf.float32), ([1], tf.float64)]
  assert all(not np.any(z.numpy()) for z in zeros)


def test_state_is_hparams_then_slots_through_steps():
  optimizer = _TrustRatioSgd(0.1)
  weights = [tf.constant([3.0, 4.0]), tf.constant([0.0])]
  state = optimizer.initialize([tf.TensorSpec([2]), tf.TensorSpec([1])])
  assert list(state) == ['learning_rate', 'decay', 'step']
  for step in (1, 2):
    gradients = [tf.constant([1.0, 0.0]), tf.constant([2.0])]
    expected = [w.numpy() - 0.1 * _numpy_ratio(w, g) * g.numpy()
                for w, g in zip(weights, gradients)]
    state, weights = optimizer.next(state, weights, gradients)
    assert list(state) == ['learning_rate', 'decay', 'step']
    assert state['step'] == step
    for actual, want in zip(weights, expected):
      np.testing.assert_allclose(actual, want, rtol=1e-6)


def test_hparams_are_read_and_replaced_without_the_slots():
  optimizer = _TrustRatioSgd(0.1)
  state = optimizer.initialize([tf.TensorSpec([2])])
  hparams = optimizer.get_hparams(state)
  assert dict(hparams) == {'learning_rate': 0.1, 'decay': 0.5}
  hparams['learning_rate'] = 0.7
  new_state = optimizer.set_hparams(state, hparams)
  assert new_state['learning_rate'] == 0.7
  assert new_state['step'] == state['step']


def test_schedule_learning_rate_sets_the_rate_each_step():
  optimizer = tff.learning.optimizers.schedule_learning_rate(
      _TrustRatioSgd(1.0), lambda step: 0.5 * tf.cast(step + 1, tf.float32))
  weights = [tf.constant([0.0, 0.0])]  # zero norm: the ratio is 1
  state = optimizer.initialize([tf.TensorSpec([2])])
  for _ in range(2):
    state, weights = optimizer.next(state, weights, [tf.constant([1.0, 2.0])])
  # Rates 0.5 then 1.0; the second step's ratio is ‖x‖/‖g‖ = 0.5.
  np.testing.assert_allclose(weights[0], [-0.5 - 0.5, -1.0 - 1.0], rtol=1e-6)


@pytest.mark.parametrize('kwargs, message', [
    (dict(learning_rate=-0.1), 'TRSGD learning_rate must be >= 0, got -0.1'),
    (dict(learning_rate=0.1, decay=1.0),
     r'TRSGD decay must be in \[0, 1\), got 1.0'),
    (dict(learning_rate=0.1, decay=-0.5),
     r'TRSGD decay must be in \[0, 1\), got -0.5'),
])
def test_out_of_range_hparams_raise_value_errors_naming_them(kwargs, message):
  with pytest.raises(ValueError, match=message):
    _TrustRatioSgd(**kwargs)


def test_tensor_hparams_are_not_checked():
  _TrustRatioSgd(tf.constant(-1.0))
