"""FedDyn against a NumPy transcription of Varno et al. (2022), Algorithm 1."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from adabest_tff import feddyn
from adabest_tff import stateful_process

NUM_FEATURES = 3
BATCH_SIZE = 2
L2 = 0.01
POPULATION_SIZE = 4  # three clients take part, a fourth never does
INITIAL_KERNEL = np.array([[0.2], [0.1], [-0.3]], np.float32)
INITIAL_BIAS = np.array([-0.1], np.float32)
RNG = np.random.default_rng(11)
CLIENT_DATA = {
    cid: (RNG.normal(size=(n, NUM_FEATURES)).astype(np.float32),
          RNG.normal(size=(n, 1)).astype(np.float32))
    for cid, n in (('a', 4), ('b', 3), ('c', 5))
}
# Cohorts of varying size; 'b' skips round 2.
COHORTS = (('a', 'b'), ('c',), ('a', 'b', 'c'))


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


def reference_feddyn(cohorts, *, learning_rate, decay, mu, uniform):
  """Algorithm 1 (FedDyn lines) in NumPy; μ_i = μ·n̄/n_i when uniform."""
  cloud = np.concatenate([INITIAL_KERNEL.ravel(), INITIAL_BIAS])
  server_h = np.zeros_like(cloud)
  client_h = {}
  examples_seen, participations = 0.0, 0
  history = []
  for t, cohort in enumerate(cohorts, start=1):
    eta = learning_rate * decay**(t - 1)
    mean_examples = examples_seen / participations if participations else 0.0
    client_models, weights = [], []
    for cid in cohort:
      h_i = client_h.get(cid, np.zeros_like(cloud))
      features, labels = CLIENT_DATA[cid]
      n_i = len(labels)
      mu_i = mu * mean_examples / n_i if uniform and mean_examples else mu
      theta = cloud.copy()
      for start in range(0, n_i, BATCH_SIZE):
        batch = slice(start, start + BATCH_SIZE)
        gradient = (loss_gradient(theta, features[batch], labels[batch]) -
                    h_i - mu_i * (cloud - theta))
        theta = theta - eta * gradient
      client_h[cid] = h_i + mu_i * (cloud - theta)
      client_models.append(theta)
      weights.append(1.0 if uniform else n_i)
      examples_seen += n_i
      participations += 1
    aggregate = np.average(client_models, axis=0, weights=weights)
    server_h = server_h + len(cohort) / POPULATION_SIZE * (cloud - aggregate)
    cloud = aggregate - server_h
    history.append((cloud.copy(), aggregate.copy(), server_h.copy(),
                    {k: v.copy() for k, v in client_h.items()}))
  return history


@pytest.mark.parametrize('uniform', [True, False])
def test_three_rounds_match_numpy_reference(uniform):
  weighting = (tff.learning.ClientWeighting.UNIFORM if uniform else
               tff.learning.ClientWeighting.NUM_EXAMPLES)
  hparams = dict(learning_rate=0.1, decay=0.9, mu=0.4)
  process = feddyn.build_feddyn(
      model_fn, population_size=POPULATION_SIZE,
      client_learning_rate=hparams['learning_rate'],
      client_learning_rate_decay=hparams['decay'], mu=hparams['mu'],
      client_weighting=weighting)
  expected = reference_feddyn(COHORTS, uniform=uniform, **hparams)
  state = process.initialize()
  client_states = {}
  fresh = process.initial_client_state()
  for cohort, (cloud, aggregate, server_h, reference_h) in zip(COHORTS,
                                                              expected):
    output = process.next(state, [
        stateful_process.StatefulClientInput(
            tf.data.Dataset.from_tensor_slices(CLIENT_DATA[cid]).batch(
                BATCH_SIZE), client_states.get(cid, fresh))
        for cid in cohort
    ])
    state = output.state
    client_states.update(zip(cohort, output.client_states))
    np.testing.assert_allclose(
        flat(state.global_model_weights.trainable), cloud, atol=1e-6)
    np.testing.assert_allclose(
        flat(process.get_model_weights(state).trainable), aggregate,
        atol=1e-6)
    np.testing.assert_allclose(
        output.metrics['finalizer']['oracle_gradient_estimate_norm'],
        np.linalg.norm(server_h), rtol=1e-5)
    for cid, h_i in reference_h.items():
      np.testing.assert_allclose(
          flat(client_states[cid][adabest.LOCAL_GRADIENT_ESTIMATE]), h_i,
          atol=1e-6)


def test_server_rule_is_adabest_with_beta_one_up_to_participation():
  rng = np.random.default_rng(3)
  shapes = [(3, 1), (1,)]
  estimate = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
  weights = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
  for fraction in (1.0, 0.25):
    h, x = estimate, weights
    for _ in range(3):
      g = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
      feddyn_h, feddyn_x = feddyn.feddyn_server_update(h, x, g, fraction)
      adabest_h, adabest_x = adabest.adabest_server_update(h, x, g, 1.0)
      # Same x^t = x̄^t - h^t; FedDyn's step of h is |P|/|S| of AdaBest's.
      np.testing.assert_allclose(
          flat(feddyn_h) - flat(h), fraction * (flat(adabest_h) - flat(h)),
          atol=1e-6)
      np.testing.assert_allclose(
          flat(feddyn_x) + flat(feddyn_h), flat(x) - flat(g), atol=1e-6)
      np.testing.assert_allclose(
          flat(adabest_x) + flat(adabest_h), flat(x) - flat(g), atol=1e-6)
      if fraction == 1.0:
        np.testing.assert_allclose(flat(feddyn_x), flat(adabest_x), atol=1e-6)
      h, x = feddyn_h, feddyn_x


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(population_size=0), '0'),
    (dict(population_size=2.5), '2.5'),
    (dict(population_size=4, mu=-1.0), '-1.0'),
    (dict(population_size=4, client_learning_rate=-0.1), '-0.1'),
])
def test_bad_hyperparameters_raise_value_error(kwargs, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    feddyn.build_feddyn(model_fn, **kwargs)
