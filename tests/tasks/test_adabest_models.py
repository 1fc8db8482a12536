"""Tests for tasks/adabest_models.py: AdaBest's models and weight decay."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import adabest_models


def _variable_shapes(model: tf.keras.Model) -> list[tuple[int, ...]]:
  return [tuple(v.shape) for v in model.trainable_variables]


def test_mlp_has_two_hidden_layers_of_100():
  model = adabest_models.create_mlp()
  assert _variable_shapes(model) == [
      (784, 100), (100,), (100, 100), (100,), (100, 26), (26,)]
  assert model.output_shape == (None, 26)


@pytest.mark.parametrize('num_classes', [10, 100])
def test_cnn_has_two_5x5x64_convs_and_dense_394_192(num_classes):
  model = adabest_models.create_cnn(num_classes=num_classes)
  # 32 -conv5-> 28 -pool-> 14 -conv5-> 10 -pool-> 5: 5 * 5 * 64 = 1600.
  assert _variable_shapes(model) == [
      (5, 5, 3, 64), (64,), (5, 5, 64, 64), (64,), (1600, 394), (394,),
      (394, 192), (192,), (192, num_classes), (num_classes,)]
  assert model.output_shape == (None, num_classes)


def test_cnn_dense_units_take_feddyns_384():
  model = adabest_models.create_cnn(dense_units=(384, 192))
  assert _variable_shapes(model)[4] == (1600, 384)


def test_logistic_regression_is_one_dense_layer():
  model = adabest_models.create_logistic_regression()
  assert _variable_shapes(model) == [(60, 10), (10,)]


@pytest.mark.parametrize('create_model, weight_decay', [
    (adabest_models.create_mlp, 1e-4),
    (adabest_models.create_cnn, 1e-3),
    (adabest_models.create_logistic_regression, 0.05),
])
def test_l2_term_is_half_weight_decay_times_squared_norm(create_model,
                                                         weight_decay):
  model = create_model(weight_decay=weight_decay)
  rng = np.random.default_rng(0)
  for variable in model.trainable_variables:  # Biases start at 0: randomize.
    variable.assign(rng.normal(size=variable.shape).astype(np.float32))
  squared_norm = sum(
      np.sum(np.square(v.numpy(), dtype=np.float64))
      for v in model.trainable_variables)
  assert float(tf.add_n(model.losses)) == pytest.approx(
      weight_decay / 2 * squared_norm, rel=1e-5)


def test_default_weight_decays_are_adabests():
  def l2_factor(model):
    return model.layers[-1].kernel_regularizer.l2

  assert l2_factor(adabest_models.create_mlp()) == pytest.approx(1e-4 / 2)
  assert l2_factor(adabest_models.create_cnn()) == pytest.approx(1e-3 / 2)


def test_tff_loss_adds_weight_decay_whose_gradient_is_sgd_weight_decay():
  weight_decay = 0.1
  kernel = np.array([[0.5, -1.0, 0.2], [0.3, 0.1, -0.4]], np.float32)
  bias = np.array([0.1, -0.2, 0.3], np.float32)
  x = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, -2.0]], np.float32)
  y = np.array([0, 2, 1], np.int32)
  input_spec = collections.OrderedDict(
      x=tf.TensorSpec([None, 2], tf.float32), y=tf.TensorSpec([None], tf.int32))
  tff_model = tff.learning.models.from_keras_model(
      adabest_models.create_logistic_regression(
          input_shape=(2,), num_classes=3, weight_decay=weight_decay),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=input_spec)
  tff_model.trainable_variables[0].assign(kernel)
  tff_model.trainable_variables[1].assign(bias)

  with tf.GradientTape() as tape:
    loss = tff_model.forward_pass(
        collections.OrderedDict(x=x, y=y), training=True).loss
  gradients = tape.gradient(loss, tff_model.trainable_variables)

  # NumPy reference: mean cross-entropy + wd / 2 * ||w||^2 and its gradient.
  logits = x @ kernel + bias
  probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
  cross_entropy = -np.mean(np.log(probabilities[np.arange(3), y]))
  squared_norm = np.sum(kernel**2) + np.sum(bias**2)
  assert float(loss) == pytest.approx(
      cross_entropy + weight_decay / 2 * squared_norm, rel=1e-5)
  logit_gradient = (probabilities - np.eye(3)[y]) / 3
  np.testing.assert_allclose(
      gradients[0], x.T @ logit_gradient + weight_decay * kernel, rtol=1e-5)
  np.testing.assert_allclose(
      gradients[1], logit_gradient.sum(axis=0) + weight_decay * bias,
      rtol=1e-5, atol=1e-7)


def test_negative_weight_decay_raises_value_error():
  with pytest.raises(ValueError, match='-0.1'):
    adabest_models.create_mlp(weight_decay=-0.1)
