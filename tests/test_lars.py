"""LARS matches a NumPy transcription of its published update."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from large_cohort import lars


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


def _initial_weights():
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 2)).astype(np.float32)
  bias = np.zeros(2, np.float32)  # zero-norm layer: trust ratio 1.
  return [kernel, bias]


def _gradients(step):
  rng = np.random.default_rng(100 + step)
  kernel_gradient = rng.normal(size=(3, 2)).astype(np.float32)
  bias_gradient = rng.normal(size=2).astype(np.float32)
  return [kernel_gradient, bias_gradient]


def _run_optimizer(optimizer, num_steps):
  weights = [tf.constant(w) for w in _initial_weights()]
  state = optimizer.initialize(
      [tf.TensorSpec(w.shape, tf.float32) for w in weights])
  for step in range(num_steps):
    state, weights = optimizer.next(
        state, weights, [tf.constant(g) for g in _gradients(step)])
  return [w.numpy() for w in weights]


def _run_numpy(learning_rates, **hparams):
  weights = [w.astype(np.float64) for w in _initial_weights()]
  momenta = [np.zeros_like(w) for w in weights]
  for step, learning_rate in enumerate(learning_rates):
    weights, momenta = _numpy_lars_step(
        weights, momenta, _gradients(step), learning_rate=learning_rate,
        **hparams)
  return weights


@pytest.mark.parametrize('weight_decay', [0.0, 0.01])
def test_four_steps_match_numpy(weight_decay):
  optimizer = lars.build_lars(
      0.1, momentum=0.9, epsilon=1e-3, weight_decay=weight_decay)
  expected = _run_numpy([0.1] * 4, momentum=0.9, epsilon=1e-3,
                        weight_decay=weight_decay)
  for actual, want in zip(_run_optimizer(optimizer, 4), expected):
    np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)


def test_zero_norm_layer_takes_untrusted_step_and_others_are_rescaled():
  optimizer = lars.build_lars(0.5, momentum=0.9, epsilon=0.0)
  kernel, bias = _initial_weights()
  kernel_gradient, bias_gradient = _gradients(0)
  new_kernel, new_bias = _run_optimizer(optimizer, 1)
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
  for actual, want in zip(_run_optimizer(optimizer, 3), expected):
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

_CLIENT_DATA = [
    (np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], np.float32),
     np.array([[1.0], [0.0], [2.0]], np.float32)),
    (np.array([[-1.0, 1.0], [0.0, 3.0]], np.float32),
     np.array([[-1.0], [1.5]], np.float32)),
]
_CLIENT_LR = 0.1


def _linear_model_fn():
  keras_model = tf.keras.Sequential(
      [tf.keras.layers.Dense(1, input_shape=(2,))])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.MeanSquaredError(),
      input_spec=collections.OrderedDict(
          x=tf.TensorSpec([None, 2], tf.float32),
          y=tf.TensorSpec([None, 1], tf.float32)))


def _numpy_fedavg_update(kernel, bias):
  """Example-weighted mean of `x − x_k` after one full-batch SGD step."""
  updates, weights = [], []
  for x, y in _CLIENT_DATA:
    residual = x @ kernel + bias - y
    kernel_gradient = 2.0 * x.T @ residual / len(x)
    bias_gradient = 2.0 * residual.sum(axis=0) / len(x)
    updates.append([_CLIENT_LR * kernel_gradient, _CLIENT_LR * bias_gradient])
    weights.append(len(x))
  total = sum(weights)
  return [sum(w * u[i] for w, u in zip(weights, updates)) / total
          for i in range(2)]


def test_two_round_fedavg_with_server_lars_matches_numpy():
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _linear_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_CLIENT_LR),
      server_optimizer_fn=lars.build_lars(0.05, momentum=0.9, epsilon=1e-3))
  datasets = [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=x, y=y)).batch(len(x))
      for x, y in _CLIENT_DATA]
  state = process.initialize()
  weights = [np.asarray(w, np.float64)
             for w in process.get_model_weights(state).trainable]
  momenta = [np.zeros_like(w) for w in weights]
  assert np.all(weights[1] == 0.0)  # the bias starts in the zero-norm case
  for _ in range(2):
    state = process.next(state, datasets).state
    weights, momenta = _numpy_lars_step(
        weights, momenta, _numpy_fedavg_update(*weights), learning_rate=0.05,
        momentum=0.9, epsilon=1e-3, weight_decay=0.0)
    for actual, want in zip(process.get_model_weights(state).trainable,
                            weights):
      np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-6)
