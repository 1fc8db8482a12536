"""FedDyn against a NumPy transcription of Varno et al. (2022), Algorithm 1."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from adabest_tff import feddyn
from tests import tiny_models

POPULATION_SIZE = 4  # three clients take part, a fourth never does
PROBLEM = tiny_models.LinearRegressionProblem(
    seed=11, client_sizes={'a': 4, 'b': 3, 'c': 5},
    initial_kernel=[[0.2], [0.1], [-0.3]], initial_bias=[-0.1], l2=0.01)
# Cohorts of varying size; 'b' skips round 2.
COHORTS = (('a', 'b'), ('c',), ('a', 'b', 'c'))


def reference_feddyn(cohorts, *, learning_rate, decay, mu, uniform):
  """Algorithm 1 (FedDyn lines) in NumPy; μ_i = μ·n̄/n_i when uniform."""
  cloud = PROBLEM.initial_weights()
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
      features, labels = PROBLEM.client_data[cid]
      n_i = len(labels)
      mu_i = mu * mean_examples / n_i if uniform and mean_examples else mu
      theta = cloud.copy()
      for start in range(0, n_i, PROBLEM.batch_size):
        batch = slice(start, start + PROBLEM.batch_size)
        gradient = (
            PROBLEM.loss_gradient(theta, features[batch], labels[batch]) -
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
      PROBLEM.model_fn, population_size=POPULATION_SIZE,
      client_learning_rate=hparams['learning_rate'],
      client_learning_rate_decay=hparams['decay'], mu=hparams['mu'],
      client_weighting=weighting)
  expected = reference_feddyn(COHORTS, uniform=uniform, **hparams)
  rounds = tiny_models.run_stateful_rounds(process, COHORTS, PROBLEM.dataset)
  for (state, metrics, client_states), (cloud, aggregate, server_h,
                                        reference_h) in zip(rounds, expected):
    np.testing.assert_allclose(
        tiny_models.flat(state.global_model_weights.trainable), cloud,
        atol=1e-6)
    np.testing.assert_allclose(
        tiny_models.flat(process.get_model_weights(state).trainable),
        aggregate, atol=1e-6)
    np.testing.assert_allclose(
        metrics['finalizer']['oracle_gradient_estimate_norm'],
        np.linalg.norm(server_h), rtol=1e-5)
    for cid, h_i in reference_h.items():
      np.testing.assert_allclose(
          tiny_models.flat(
              client_states[cid][adabest.LOCAL_GRADIENT_ESTIMATE]),
          h_i, atol=1e-6)


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
          tiny_models.flat(feddyn_h) - tiny_models.flat(h),
          fraction * (tiny_models.flat(adabest_h) - tiny_models.flat(h)),
          atol=1e-6)
      np.testing.assert_allclose(
          tiny_models.flat(feddyn_x) + tiny_models.flat(feddyn_h),
          tiny_models.flat(x) - tiny_models.flat(g), atol=1e-6)
      np.testing.assert_allclose(
          tiny_models.flat(adabest_x) + tiny_models.flat(adabest_h),
          tiny_models.flat(x) - tiny_models.flat(g), atol=1e-6)
      if fraction == 1.0:
        np.testing.assert_allclose(tiny_models.flat(feddyn_x),
                                   tiny_models.flat(adabest_x), atol=1e-6)
      h, x = feddyn_h, feddyn_x


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(population_size=0), '0'),
    (dict(population_size=2.5), '2.5'),
    (dict(population_size=4, mu=-1.0), '-1.0'),
    (dict(population_size=4, client_learning_rate=-0.1), '-0.1'),
])
def test_bad_hyperparameters_raise_value_error(kwargs, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    feddyn.build_feddyn(PROBLEM.model_fn, **kwargs)
