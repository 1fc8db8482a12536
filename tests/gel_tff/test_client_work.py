"""GeL client work vs a NumPy reference of Algorithm 1 on a linear model."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from gel_tff import client_work
from gel_tff import coefficients
from fl_common import fednova

NUM_FEATURES = 3
BATCH_SIZE = 2
LEARNING_RATE = 0.1
MOMENTUM = 0.9
INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, NUM_FEATURES], tf.float32),
    y=tf.TensorSpec([None, 1], tf.float32))
INITIAL_KERNEL = np.array([[0.3], [-0.2], [0.1]], np.float32)
INITIAL_BIAS = np.array([0.05], np.float32)


def linear_model_fn(use_bias: bool = True):
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.Dense(1, use_bias=use_bias,
                              input_shape=(NUM_FEATURES,))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.MeanSquaredError(),
        input_spec=INPUT_SPEC)
  return model_fn


def initial_weights(use_bias: bool = True):
  trainable = [INITIAL_KERNEL, INITIAL_BIAS] if use_bias else [INITIAL_KERNEL]
  return tff.learning.models.ModelWeights(trainable=trainable,
                                          non_trainable=[])


def random_batches(rng, num_batches):
  return [(rng.normal(size=(BATCH_SIZE, NUM_FEATURES)).astype(np.float32),
           rng.normal(size=(BATCH_SIZE, 1)).astype(np.float32))
          for _ in range(num_batches)]


def to_dataset(batches):
  if not batches:
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=np.zeros([0, BATCH_SIZE, NUM_FEATURES], np.float32),
        y=np.zeros([0, BATCH_SIZE, 1], np.float32)))
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.stack([x for x, _ in batches]), y=np.stack([y for _, y in batches])))


def mse_gradient(params, x, y):
  """Gradient of mean((x w + b - y)^2) w.r.t. params = [w (3), b (1)]."""
  residual = x @ params[:NUM_FEATURES] + params[NUM_FEATURES] - y[:, 0]
  return np.concatenate([2.0 * x.T @ residual / len(y),
                         [2.0 * residual.mean()]])


def numpy_client(batches, *, guessed, learning_rate=LEARNING_RATE,
                 momentum=MOMENTUM, proximal_strength=0.0):
  """Algorithm 1 in float64; returns (x^(t,0) - x_final, gradients)."""
  x0 = np.concatenate([INITIAL_KERNEL[:, 0], INITIAL_BIAS]).astype(np.float64)
  x, v, gradients = x0.copy(), np.zeros_like(x0), []
  for features, labels in batches:  # Eq. (1)-(2).
    g = mse_gradient(x, features, labels) + proximal_strength * (x - x0)
    gradients.append(g)
    v = momentum * v - learning_rate * g
    x = x + v
  for _ in range(guessed):  # Eq. (3)-(4): zero proxy gradient, step by step.
    v = momentum * v
    x = x + v
  return x0 - x, gradients


def flat_delta(update):
  return np.concatenate([np.asarray(t).reshape(-1) for t in update])


def run_client_work(process, datasets, use_bias=True):
  output = process.next(process.initialize(),
                        [initial_weights(use_bias)] * len(datasets), datasets)
  return output.result, output.measurements


@pytest.mark.parametrize('guessed_steps', ['remaining', 3, 0])
def test_update_matches_numpy_algorithm_1(guessed_steps):
  rng = np.random.default_rng(1)
  client_batches = [random_batches(rng, n) for n in (2, 5, 7)]
  expected_steps = 6
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      expected_steps=expected_steps, guessed_steps=guessed_steps)
  results, measurements = run_client_work(
      process, [to_dataset(b) for b in client_batches])
  for batches, result in zip(client_batches, results):
    guessed = (max(expected_steps - len(batches), 0)
               if guessed_steps == 'remaining' else guessed_steps)
    expected_delta, _ = numpy_client(batches, guessed=guessed)
    np.testing.assert_allclose(flat_delta(result.update), expected_delta,
                               rtol=1e-5, atol=1e-6)
    assert result.update_weight == BATCH_SIZE * len(batches)
  assert measurements['gradient_steps'] == 2 + 5 + 7


def test_infinite_guess_uses_factor_alpha_over_one_minus_alpha():
  rng = np.random.default_rng(2)
  batches = random_batches(rng, 4)
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      guessed_steps='infinite', report_normalizer=True)
  [result], _ = run_client_work(process, [to_dataset(batches)])
  no_guess_delta, gradients = numpy_client(batches, guessed=0)
  velocity = np.zeros_like(gradients[0])
  for g in gradients:
    velocity = MOMENTUM * velocity - LEARNING_RATE * g
  expected = no_guess_delta - MOMENTUM / (1 - MOMENTUM) * velocity
  np.testing.assert_allclose(flat_delta(result.update.model_delta), expected,
                             rtol=1e-5, atol=1e-6)
  # With tau' infinite every coefficient of Lemma 1 is 1 / (1 - alpha).
  np.testing.assert_allclose(result.update.normalizer, 4 / (1 - MOMENTUM),
                             rtol=1e-6)


def test_closed_form_guess_equals_explicit_zero_gradient_steps():
  # Without a bias, a batch of zeros has zero loss gradient, so training on
  # it is exactly one momentum step with a zero gradient (eq. (3)).
  rng = np.random.default_rng(3)
  real_batches = random_batches(rng, 3)
  zero_batch = (np.zeros((BATCH_SIZE, NUM_FEATURES), np.float32),
                np.zeros((BATCH_SIZE, 1), np.float32))
  num_guessed = 5
  explicit = client_work.build_gel_client_work(
      linear_model_fn(use_bias=False), learning_rate=LEARNING_RATE,
      guessed_steps=0)
  closed_form = client_work.build_gel_client_work(
      linear_model_fn(use_bias=False), learning_rate=LEARNING_RATE,
      guessed_steps=num_guessed)
  [explicit_result], _ = run_client_work(
      explicit, [to_dataset(real_batches + [zero_batch] * num_guessed)],
      use_bias=False)
  [guessed_result], _ = run_client_work(
      closed_form, [to_dataset(real_batches)], use_bias=False)
  np.testing.assert_allclose(flat_delta(guessed_result.update),
                             flat_delta(explicit_result.update), rtol=1e-5,
                             atol=1e-7)
  assert np.abs(flat_delta(guessed_result.update)).max() > 1e-3


def test_update_is_lemma1_combination_of_gradients():
  rng = np.random.default_rng(4)
  client_batches = [random_batches(rng, n) for n in (1, 3, 6)]
  expected_steps = 8
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      expected_steps=expected_steps, report_normalizer=True)
  results, _ = run_client_work(process,
                               [to_dataset(b) for b in client_batches])
  for batches, result in zip(client_batches, results):
    tau_i = len(batches)
    guessed = expected_steps - tau_i
    _, gradients = numpy_client(batches, guessed=guessed)
    # Eq. (6): a_i[k] = (1 - alpha^(tau' + tau_i - k)) / (1 - alpha).
    coefficients = np.array([
        (1 - MOMENTUM**(guessed + tau_i - k)) / (1 - MOMENTUM)
        for k in range(tau_i)])
    # x - x^(t,0) = -eta_l sum_k a_k g_k, and TFF's delta is its negative.
    expected = LEARNING_RATE * sum(
        a * g for a, g in zip(coefficients, gradients))
    assert isinstance(result.update, fednova.FedNovaClientUpdate)
    np.testing.assert_allclose(flat_delta(result.update.model_delta),
                               expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.update.normalizer, coefficients.sum(),
                               rtol=1e-6)


@pytest.mark.parametrize('momentum, steps, guessed', [
    (0.9, 6, 12), (0.9, 18, 0), (0.5, 4, 'infinite'), (0.0, 3, 0)])
def test_measured_coefficients_are_lemma1s(momentum, steps, guessed):
  """Figure 3's coefficients, read off the client update on a probe."""
  measured = coefficients.measure_gradient_coefficients(
      momentum=momentum, gradient_steps=steps, guessed_steps=guessed)
  if guessed == 'infinite':
    expected = np.full(steps, 1 / (1 - momentum))
  else:
    expected = np.array([sum(momentum**j for j in range(guessed + steps - k))
                         for k in range(steps)])
  np.testing.assert_allclose(measured, expected, rtol=1e-5)


def test_measured_coefficients_refuse_a_guess_without_a_count():
  with pytest.raises(ValueError, match='count'):
    coefficients.measure_gradient_coefficients(
        momentum=0.9, gradient_steps=3, guessed_steps='remaining')


def test_normalizer_without_guess_is_fednova_momentum_vector_norm():
  rng = np.random.default_rng(5)
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      guessed_steps=0, report_normalizer=True)
  [result], _ = run_client_work(process, [to_dataset(random_batches(rng, 4))])
  # Wang et al. 2020: a = [1 - alpha^tau_i, ..., 1 - alpha] / (1 - alpha).
  expected = sum(1 - MOMENTUM**j for j in range(1, 5)) / (1 - MOMENTUM)
  np.testing.assert_allclose(result.update.normalizer, expected, rtol=1e-6)


def test_proximal_term_matches_numpy():
  rng = np.random.default_rng(6)
  batches = random_batches(rng, 5)
  proximal_strength = 0.5
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      expected_steps=7, proximal_strength=proximal_strength)
  [result], _ = run_client_work(process, [to_dataset(batches)])
  expected, _ = numpy_client(batches, guessed=2,
                             proximal_strength=proximal_strength)
  without_term, _ = numpy_client(batches, guessed=2)
  np.testing.assert_allclose(flat_delta(result.update), expected, rtol=1e-5,
                             atol=1e-6)
  assert np.abs(expected - without_term).max() > 1e-3


def test_plain_sgd_and_uniform_weighting():
  rng = np.random.default_rng(7)
  client_batches = [random_batches(rng, n) for n in (2, 4)]
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=0.0,
      guessed_steps=0,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  results, _ = run_client_work(process,
                               [to_dataset(b) for b in client_batches])
  for batches, result in zip(client_batches, results):
    expected, _ = numpy_client(batches, guessed=0, momentum=0.0)
    np.testing.assert_allclose(flat_delta(result.update), expected,
                               rtol=1e-5, atol=1e-6)
    assert result.update_weight == 1.0


def test_hparams_drive_steps_and_guess():
  rng = np.random.default_rng(8)
  batches = random_batches(rng, 3)
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, momentum=MOMENTUM,
      expected_steps=5)
  hparams = process.get_hparams(process.initialize())
  assert set(hparams) == {'learning_rate', 'momentum'}
  hparams['learning_rate'] = np.float32(0.05)
  hparams['momentum'] = np.float32(0.5)
  state = process.set_hparams(process.initialize(), hparams)
  output = process.next(state, [initial_weights()], [to_dataset(batches)])
  expected, _ = numpy_client(batches, guessed=2, learning_rate=0.05,
                             momentum=0.5)
  np.testing.assert_allclose(flat_delta(output.result[0].update), expected,
                             rtol=1e-5, atol=1e-6)


def test_client_without_data_sends_zero_update():
  process = client_work.build_gel_client_work(
      linear_model_fn(), learning_rate=LEARNING_RATE, report_normalizer=True)
  [result], measurements = run_client_work(process, [to_dataset([])])
  np.testing.assert_array_equal(flat_delta(result.update.model_delta), 0.0)
  assert result.update.normalizer == 0.0
  assert result.update_weight == 0.0
  assert measurements['gradient_steps'] == 0


def test_client_update_type_matches_process():
  for report_normalizer in (False, True):
    process = client_work.build_gel_client_work(
        linear_model_fn(), learning_rate=LEARNING_RATE,
        report_normalizer=report_normalizer)
    update_type = process.next.type_signature.result.result.member.update
    delta_type = tff.to_type([tff.TensorType(np.float32, [NUM_FEATURES, 1]),
                              tff.TensorType(np.float32, [1])])
    assert client_work.client_update_type(
        delta_type, report_normalizer=report_normalizer).is_equivalent_to(
            update_type)


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(guessed_steps='sometimes'), 'sometimes'),
    (dict(guessed_steps=-1), '-1'),
    (dict(guessed_steps=True), 'True'),
    (dict(momentum=1.0), '1.0'),
    (dict(momentum=0.0), "'remaining'"),
    (dict(expected_steps=0), '0'),
    (dict(learning_rate=0.0), '0.0'),
    (dict(proximal_strength=-0.1), '-0.1'),
])
def test_bad_arguments_raise_value_error(kwargs, bad_value):
  arguments = dict(learning_rate=LEARNING_RATE) | kwargs
  with pytest.raises(ValueError, match=bad_value):
    client_work.build_gel_client_work(linear_model_fn(), **arguments)
