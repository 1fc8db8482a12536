"""LARS matches a NumPy transcription of its published update."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import lars
from tests import tiny_models


def _numpy_lars_step(weights, momenta, gradients, *, learning_rate, momentum,
                     epsilon, weight_decay):
  """You et al. 2020 Alg. 1 (LARS), ε in the trust-ratio denominator."""
  new_weights, new_momenta = [], []
  for w, m, g in zip(weights, momenta, gradients):
    m = momentum * m + (1.0 - momentum) * (g + weight_decay * w)
    w_norm, m_norm = np.linalg.norm(w), np.linalg.norm(m)
    ratio = w_norm / (m_norm + epsilon) if w_norm > 0 and m_norm > 0 else 1.0
    new_weights.append(w - learning_rate * ratio * m)
    new_momenta.append(m)
  return new_weights, new_momenta


def _run_numpy(learning_rates, **hparams):
  weights = [w.astype(np.float64)
             for w in tiny_models.optimizer_initial_weights()]
  momenta = [np.zeros_like(w) for w in weights]
  for step, learning_rate in enumerate(learning_rates):
    weights, momenta = _numpy_lars_step(
        weights, momenta, tiny_models.optimizer_gradients(step),
        learning_rate=learning_rate, **hparams)
  return weights


@pytest.mark.parametrize('weight_decay', [0.0, 0.01])
def test_four_steps_match_numpy(weight_decay):
  optimizer = lars.build_lars(
      0.1, momentum=0.9, epsilon=1e-3, weight_decay=weight_decay)
  expected = _run_numpy([0.1] * 4, momentum=0.9, epsilon=1e-3,
                        weight_decay=weight_decay)
  for actual, want in zip(tiny_models.run_optimizer(optimizer, 4), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)


def test_zero_norm_layer_takes_untrusted_step_and_others_are_rescaled():
  optimizer = lars.build_lars(0.5, momentum=0.9, epsilon=0.0)
  kernel, bias = tiny_models.optimizer_initial_weights()
  kernel_gradient, bias_gradient = tiny_models.optimizer_gradients(0)
  new_kernel, new_bias = tiny_models.run_optimizer(optimizer, 1)
  # Zero bias: ratio 1, step = lr * (1 - β) * g.
  np.testing.assert_allclose(new_bias, -0.5 * 0.1 * bias_gradient, rtol=1e-6)
  # Non-zero kernel with ε = 0: the step has norm lr * ‖kernel‖.
  np.testing.assert_allclose(
      np.linalg.norm(new_kernel - kernel), 0.5 * np.linalg.norm(kernel),
      rtol=1e-5)
  assert np.dot((new_kernel - kernel).ravel(), kernel_gradient.ravel()) < 0


def test_scheduled_learning_rate_matches_numpy():
  rates = [0.1, 0.2, 0.05]
  # schedule_learning_rate also asks for the rate after the last step.
  schedule = lambda step: tf.gather(tf.constant(rates + [0.0]), step)
  optimizer = tff.learning.optimizers.schedule_learning_rate(
      lars.build_lars(1.0), schedule)
  expected = _run_numpy(rates, momentum=0.9, epsilon=1e-3, weight_decay=0.0)
  for actual, want in zip(tiny_models.run_optimizer(optimizer, 3), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)


def test_hparams_round_trip():
  optimizer = lars.build_lars(0.1)
  state = optimizer.initialize([tf.TensorSpec([2], tf.float32)])
  hparams = optimizer.get_hparams(state)
  assert list(hparams) == ['learning_rate', 'momentum', 'epsilon',
                           'weight_decay']
  hparams['learning_rate'] = 0.7
  assert optimizer.get_hparams(
      optimizer.set_hparams(state, hparams))['learning_rate'] == 0.7


@pytest.mark.parametrize('kwargs, bad', [
    (dict(learning_rate=-1.0), 'learning_rate'),
    (dict(learning_rate=0.1, momentum=1.0), 'momentum'),
    (dict(learning_rate=0.1, epsilon=-1e-3), 'epsilon'),
    (dict(learning_rate=0.1, weight_decay=-0.1), 'weight_decay'),
])
def test_bad_hyperparameter_raises(kwargs, bad):
  with pytest.raises(ValueError, match=bad):
    lars.build_lars(**kwargs)


# --- FedLARS: two rounds of TFF FedAvg with server LARS on a linear model ---
def test_two_round_fedavg_with_server_lars_matches_numpy():
  process = tiny_models.build_fedavg(
      lars.build_lars(0.05, momentum=0.9, epsilon=1e-3))
  weights, weights_per_round = tiny_models.run_fedavg_rounds(process, 2)
  momenta = [np.zeros_like(w) for w in weights]
  assert np.all(weights[1] == 0.0)  # the bias starts in the zero-norm case
  for round_weights in weights_per_round:
    weights, momenta = _numpy_lars_step(
        weights, momenta, tiny_models.numpy_fedavg_update(*weights),
        learning_rate=0.05, momentum=0.9, epsilon=1e-3, weight_decay=0.0)
    for actual, want in zip(round_weights, weights):
      np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)
