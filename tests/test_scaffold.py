"""SCAFFOLD option II against a NumPy transcription of Karimireddy et al."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import scaffold
from adabest_tff import stateful_process

NUM_FEATURES = 3
BATCH_SIZE = 2
L2 = 0.01
POPULATION_SIZE = 5
INITIAL_KERNEL = np.array([[-0.1], [0.2], [0.1]], np.float32)
INITIAL_BIAS = np.array([0.3], np.float32)
RNG = np.random.default_rng(5)
CLIENT_DATA = {
    cid: (RNG.normal(size=(n, NUM_FEATURES)).astype(np.float32),
          RNG.normal(size=(n, 1)).astype(np.float32))
    for cid, n in (('a', 4), ('b', 3), ('c', 5), ('empty', 0))
}
# 'empty' has no data: K = 0 steps, so it keeps c_i and sends a zero update.
COHORTS = (('a', 'b'), ('b', 'c', 'empty'), ('a', 'c'))


def model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(
          1, input_shape=(NUM_FEATURES,),
          kernel_initializer=tf.keras.initializers.Constant(INITIAL_KERNEL),
          bias_initializer=tf.keras.initializers.Constant(INITIAL_BIAS),
          kernel_regularizer=tf.keras.regularizers.l2(L2))
  ])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=(tf.TensorSpec([None, NUM_FEATURES], tf.float32),
                  tf.TensorSpec([None, 1], tf.float32)))


def flat(trainable):
  return np.concatenate([np.ravel(t) for t in trainable])


def loss_gradient(theta, features, labels):
  residual = (features @ theta[:NUM_FEATURES] + theta[NUM_FEATURES] -
              labels[:, 0])
  n = len(labels)
  return np.concatenate([
      2.0 / n * features.T @ residual + 2.0 * L2 * theta[:NUM_FEATURES],
      [2.0 / n * residual.sum()],
  ])


def reference_scaffold(cohorts, *, learning_rate, decay, server_learning_rate,
                       uniform):
  """SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II) in NumPy."""
  x = np.concatenate([INITIAL_KERNEL.ravel(), INITIAL_BIAS])
  c = np.zeros_like(x)
  client_c = {}
  history = []
  for t, cohort in enumerate(cohorts, start=1):
    eta = learning_rate * decay**(t - 1)
    deltas, weights, control_deltas = [], [], []
    for cid in cohort:
      c_i = client_c.get(cid, np.zeros_like(x))
      features, labels = CLIENT_DATA[cid]
      y, steps = x.copy(), 0
      for start in range(0, len(labels), BATCH_SIZE):
        batch = slice(start, start + BATCH_SIZE)
        y = y - eta * (loss_gradient(y, features[batch], labels[batch]) -
                       c_i + c)
        steps += 1
      new_c_i = c_i - c + (x - y) / (steps * eta) if steps else c_i
      control_deltas.append(new_c_i - c_i)
      client_c[cid] = new_c_i
      deltas.append(y - x)
      weights.append(1.0 if uniform else len(labels))
    x = x + server_learning_rate * np.average(deltas, axis=0, weights=weights)
    c = c + np.sum(control_deltas, axis=0) / POPULATION_SIZE
    history.append((x.copy(), c.copy(),
                    {k: v.copy() for k, v in client_c.items()}))
  return history


@pytest.mark.parametrize('uniform', [True, False])
def test_three_rounds_match_numpy_reference(uniform):
  weighting = (tff.learning.ClientWeighting.UNIFORM if uniform else
               tff.learning.ClientWeighting.NUM_EXAMPLES)
  hparams = dict(learning_rate=0.1, decay=0.9, server_learning_rate=0.7)
  process = scaffold.build_scaffold(
      model_fn, population_size=POPULATION_SIZE,
      client_learning_rate=hparams['learning_rate'],
      client_learning_rate_decay=hparams['decay'],
      server_learning_rate=hparams['server_learning_rate'],
      client_weighting=weighting)
  expected = reference_scaffold(COHORTS, uniform=uniform, **hparams)
  state = process.initialize()
  client_states = {}
  fresh = process.initial_client_state()
  for cohort, (x, c, reference_c) in zip(COHORTS, expected):
    output = process.next(state, [
        stateful_process.StatefulClientInput(
            tf.data.Dataset.from_tensor_slices(CLIENT_DATA[cid]).batch(
                BATCH_SIZE), client_states.get(cid, fresh))
        for cid in cohort
    ])
    state = output.state
    client_states.update(zip(cohort, output.client_states))
    np.testing.assert_allclose(
        flat(process.get_model_weights(state).trainable), x, atol=1e-6)
    np.testing.assert_allclose(
        flat(state.client_work['server_values'][scaffold.CONTROL_VARIATE]), c,
        atol=1e-6)
    for cid, c_i in reference_c.items():
      np.testing.assert_allclose(
          flat(client_states[cid][scaffold.CONTROL_VARIATE]), c_i, atol=1e-5)


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(population_size=-3), '-3'),
    (dict(population_size=5, server_learning_rate=0.0), '0.0'),
    (dict(population_size=5, client_learning_rate_decay=0.0), '0.0'),
])
def test_bad_hyperparameters_raise_value_error(kwargs, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    scaffold.build_scaffold(model_fn, **kwargs)
