"""LAMB matches a NumPy transcription of its published update."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import lamb
from tests import tiny_models


def _numpy_lamb_step(weights, moments, gradients, step, *, learning_rate,
                     beta_1, beta_2, epsilon, weight_decay):
  """You et al. 2020 Alg. 2 (LAMB); `step` counts from 1."""
  new_weights, new_moments = [], []
  for w, (m, v), g in zip(weights, moments, gradients):
    m = beta_1 * m + (1.0 - beta_1) * g
    v = beta_2 * v + (1.0 - beta_2) * g**2
    m_hat = m / (1.0 - beta_1**step)
    v_hat = v / (1.0 - beta_2**step)
    direction = m_hat / (np.sqrt(v_hat) + epsilon) + weight_decay * w
    w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(direction)
    ratio = w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
    new_weights.append(w - learning_rate * ratio * direction)
    new_moments.append((m, v))
  return new_weights, new_moments


def _run_numpy(learning_rates, **hparams):
  weights = [w.astype(np.float64)
             for w in tiny_models.optimizer_initial_weights()]
  moments = [(np.zeros_like(w), np.zeros_like(w)) for w in weights]
  for step, learning_rate in enumerate(learning_rates):
    weights, moments = _numpy_lamb_step(
        weights, moments, tiny_models.optimizer_gradients(step), step + 1,
        learning_rate=learning_rate, **hparams)
  return weights


@pytest.mark.parametrize('weight_decay', [0.0, 0.01])
def test_four_steps_match_numpy(weight_decay):
  optimizer = lamb.build_lamb(0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-3,
                              weight_decay=weight_decay)
  expected = _run_numpy([0.1] * 4, beta_1=0.9, beta_2=0.99, epsilon=1e-3,
                        weight_decay=weight_decay)
  for actual, want in zip(tiny_models.run_optimizer(optimizer, 4), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)


def test_zero_norm_layer_takes_untrusted_step_and_others_are_rescaled():
  optimizer = lamb.build_lamb(0.5, epsilon=0.0)
  kernel, bias = tiny_models.optimizer_initial_weights()
  _, bias_gradient = tiny_models.optimizer_gradients(0)
  new_kernel, new_bias = tiny_models.run_optimizer(optimizer, 1)
  # First step with ε = 0: the bias-corrected Adam direction is sign(g).
  # Zero bias: ratio 1, step = lr * sign(g).
  np.testing.assert_allclose(new_bias, -0.5 * np.sign(bias_gradient),
                             rtol=1e-6)
  # Non-zero kernel: the step has norm lr * ‖kernel‖.
  np.testing.assert_allclose(
      np.linalg.norm(new_kernel - kernel), 0.5 * np.linalg.norm(kernel),
      rtol=1e-5)


def test_scheduled_learning_rate_matches_numpy():
  rates = [0.1, 0.2, 0.05]
  # schedule_learning_rate also asks for the rate after the last step.
  schedule = lambda step: tf.gather(tf.constant(rates + [0.0]), step)
  optimizer = tff.learning.optimizers.schedule_learning_rate(
      lamb.build_lamb(1.0), schedule)
  expected = _run_numpy(rates, beta_1=0.9, beta_2=0.99, epsilon=1e-3,
                        weight_decay=0.0)
  for actual, want in zip(tiny_models.run_optimizer(optimizer, 3), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)


def test_hparams_round_trip():
  optimizer = lamb.build_lamb(0.1)
  state = optimizer.initialize([tf.TensorSpec([2], tf.float32)])
  hparams = optimizer.get_hparams(state)
  assert list(hparams) == ['learning_rate', 'beta_1', 'beta_2', 'epsilon',
                           'weight_decay']
  hparams['learning_rate'] = 0.7
  assert optimizer.get_hparams(
      optimizer.set_hparams(state, hparams))['learning_rate'] == 0.7


@pytest.mark.parametrize('kwargs, bad', [
    (dict(learning_rate=-1.0), 'learning_rate'),
    (dict(learning_rate=0.1, beta_1=1.0), 'beta_1'),
    (dict(learning_rate=0.1, beta_2=-0.5), 'beta_2'),
    (dict(learning_rate=0.1, epsilon=-1e-3), 'epsilon'),
    (dict(learning_rate=0.1, weight_decay=-0.1), 'weight_decay'),
])
def test_bad_hyperparameter_raises(kwargs, bad):
  with pytest.raises(ValueError, match=bad):
    lamb.build_lamb(**kwargs)


# --- FedLamb: two rounds of TFF FedAvg with server LAMB on a linear model ---
def test_two_round_fedavg_with_server_lamb_matches_numpy():
  process = tiny_models.build_fedavg(
      lamb.build_lamb(0.05, beta_1=0.9, beta_2=0.99, epsilon=1e-3))
  weights, weights_per_round = tiny_models.run_fedavg_rounds(process, 2)
  moments = [(np.zeros_like(w), np.zeros_like(w)) for w in weights]
  assert np.all(weights[1] == 0.0)  # the bias starts in the zero-norm case
  for step, round_weights in enumerate(weights_per_round, start=1):
    weights, moments = _numpy_lamb_step(
        weights, moments, tiny_models.numpy_fedavg_update(*weights), step,
        learning_rate=0.05, beta_1=0.9, beta_2=0.99, epsilon=1e-3,
        weight_decay=0.0)
    for actual, want in zip(round_weights, weights):
      np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)
