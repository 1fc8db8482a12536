"""AdaBest against a NumPy transcription of Varno et al. (2022), Algorithm 1."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from tests import tiny_models

# Unequal client sizes, so the progressive mean n̄ differs from n_i; the
# model's own weight decay (l2) is part of grad L_i.
PROBLEM = tiny_models.LinearRegressionProblem(
    seed=7, client_sizes={'a': 4, 'b': 3, 'c': 5},
    initial_kernel=[[0.1], [-0.2], [0.3]], initial_bias=[0.05], l2=0.01)
# Client 'b' skips round 2, so in round 3 it has t - t'_b = 2.
COHORTS = (('a', 'b'), ('a', 'c'), ('b', 'c'))


def reference_adabest(cohorts, *, learning_rate, decay, mu, beta, uniform):
  """Algorithm 1 (AdaBest lines) in NumPy, with eq. 2 written with x̄."""
  cloud = PROBLEM.initial_weights()  # x^0
  previous_aggregate = cloud.copy()  # x̄^0 = x^0
  client_states = {}
  examples_seen, participations = 0.0, 0
  history = []
  for t, cohort in enumerate(cohorts, start=1):
    eta = learning_rate * decay**(t - 1)
    mean_examples = examples_seen / participations if participations else 0.0
    client_models, weights = [], []
    for cid in cohort:
      h_i, last_round = client_states.get(cid, (np.zeros_like(cloud), 0))
      features, labels = PROBLEM.client_data[cid]
      theta = cloud.copy()
      for start in range(0, len(labels), PROBLEM.batch_size):
        batch = slice(start, start + PROBLEM.batch_size)
        theta = theta - eta * (
            PROBLEM.loss_gradient(theta, features[batch], labels[batch]) - h_i)
      g_i = cloud - theta
      n_i = len(labels)
      mu_i = mu * mean_examples / n_i if uniform and mean_examples else mu
      client_states[cid] = (h_i / (t - last_round) + mu_i * g_i, t)
      client_models.append(theta)
      weights.append(1.0 if uniform else n_i)
      examples_seen += n_i
      participations += 1
    aggregate = np.average(client_models, axis=0, weights=weights)  # x̄^t
    server_h = beta * (previous_aggregate - aggregate)  # eq. 2
    cloud = aggregate - server_h  # eq. 1
    previous_aggregate = aggregate
    history.append((cloud.copy(), aggregate.copy(), server_h.copy(),
                    {k: (v[0].copy(), v[1]) for k, v in client_states.items()}))
  return history


@pytest.mark.parametrize('uniform', [True, False])
def test_three_rounds_match_numpy_reference(uniform):
  weighting = (tff.learning.ClientWeighting.UNIFORM if uniform else
               tff.learning.ClientWeighting.NUM_EXAMPLES)
  hparams = dict(learning_rate=0.1, decay=0.9, mu=0.3, beta=0.6)
  process = adabest.build_adabest(
      PROBLEM.model_fn, client_learning_rate=hparams['learning_rate'],
      client_learning_rate_decay=hparams['decay'], mu=hparams['mu'],
      beta=hparams['beta'], client_weighting=weighting)
  expected = reference_adabest(COHORTS, uniform=uniform, **hparams)
  rounds = tiny_models.run_stateful_rounds(process, COHORTS, PROBLEM.dataset)
  for (state, metrics, client_states), (cloud, aggregate, server_h,
                                        reference_states) in zip(rounds,
                                                                 expected):
    np.testing.assert_allclose(
        tiny_models.flat(state.global_model_weights.trainable), cloud,
        atol=1e-6)
    np.testing.assert_allclose(
        tiny_models.flat(process.get_model_weights(state).trainable),
        aggregate, atol=1e-6)
    np.testing.assert_allclose(
        metrics['finalizer']['oracle_gradient_estimate_norm'],
        np.linalg.norm(server_h), rtol=1e-5)
    np.testing.assert_allclose(metrics['model_norms']['global_model_norm'],
                               np.linalg.norm(cloud), rtol=1e-5)
    np.testing.assert_allclose(metrics['model_norms']['deployed_model_norm'],
                               np.linalg.norm(aggregate), rtol=1e-5)
    assert set(client_states) == set(reference_states)
    for cid, (h_i, last_round) in reference_states.items():
      np.testing.assert_allclose(
          tiny_models.flat(
              client_states[cid][adabest.LOCAL_GRADIENT_ESTIMATE]),
          h_i, atol=1e-6)
      assert client_states[cid][adabest.LAST_ROUND] == last_round


def test_beta_and_mu_zero_is_weighted_fedavg():
  learning_rate = 0.1
  fedavg = tff.learning.algorithms.build_weighted_fed_avg(
      PROBLEM.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
  process = adabest.build_adabest(
      PROBLEM.model_fn, client_learning_rate=learning_rate,
      client_learning_rate_decay=1.0, mu=0.0, beta=0.0,
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
  adabest_outputs = tiny_models.run_stateful_rounds(process, COHORTS[:2],
                                                  PROBLEM.dataset)
  fedavg_state = fedavg.initialize()
  for cohort, (state, _, _) in zip(COHORTS[:2], adabest_outputs):
    fedavg_state = fedavg.next(fedavg_state,
                               [PROBLEM.dataset(cid) for cid in cohort]).state
    np.testing.assert_allclose(
        tiny_models.flat(process.get_model_weights(state).trainable),
        tiny_models.flat(fedavg.get_model_weights(fedavg_state).trainable),
        atol=1e-6)


def test_set_model_weights_sets_the_deployed_model():
  process = adabest.build_adabest(PROBLEM.model_fn, beta=0.5, mu=0.1)
  state = tiny_models.run_stateful_rounds(process, COHORTS[:1],
                                          PROBLEM.dataset)[0][0]
  new_weights = tff.learning.models.ModelWeights(
      trainable=[np.full((PROBLEM.num_features, 1), 0.7, np.float32),
                 np.array([-1.0], np.float32)],
      non_trainable=[])
  new_state = process.set_model_weights(state, new_weights)
  np.testing.assert_allclose(
      tiny_models.flat(process.get_model_weights(new_state).trainable),
      tiny_models.flat(new_weights.trainable))
  # The broadcast model is x = x̄ - h with the state's h kept.
  h = tiny_models.flat(state.finalizer[adabest.ORACLE_GRADIENT_ESTIMATE])
  assert np.linalg.norm(h) > 0
  np.testing.assert_allclose(
      tiny_models.flat(new_state.global_model_weights.trainable),
      tiny_models.flat(new_weights.trainable) - h, atol=1e-6)


def test_beta_decays_after_a_plateau_of_the_estimate_norm():
  patience, factor, beta = 2, 0.5, 0.8
  optimizer = adabest._AdaBestServerOptimizer(beta, patience, factor)
  weights = (tf.zeros([2]),)
  state = optimizer.initialize((tf.TensorSpec([2], tf.float32),))
  # ||h|| falls for two rounds, then rises for five.
  gradients = [4.0, -3.0, 0.1, 2.0, 2.0, 2.0, 2.0, 2.0]
  reference_beta, estimate, lowest, since_lowest = beta, 0.0, np.inf, 0
  for g in gradients:
    state, weights = optimizer.next(state, weights,
                                    (tf.constant([g, 0.0]),))
    estimate = reference_beta * (estimate + g)
    if abs(estimate) < lowest:
      lowest, since_lowest = abs(estimate), 0
    else:
      since_lowest += 1
    if since_lowest >= patience:
      reference_beta, since_lowest = reference_beta * factor, 0
    np.testing.assert_allclose(
        state[adabest.ORACLE_GRADIENT_ESTIMATE][0][0], estimate, rtol=1e-6)
    np.testing.assert_allclose(optimizer.get_hparams(state)[adabest.BETA],
                               reference_beta, rtol=1e-6)
  assert reference_beta < beta / 2  # it decayed at least twice


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(beta=1.5), '1.5'),
    (dict(mu=-0.1), '-0.1'),
    (dict(beta_decay_patience=0), '0'),
    (dict(beta_decay_factor=1.0), '1.0'),
    (dict(client_learning_rate=0.0), '0.0'),
    (dict(client_learning_rate_decay=1.2), '1.2'),
    (dict(client_weighting='uniform'), 'uniform'),
])
def test_bad_hyperparameters_raise_value_error(kwargs, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    adabest.build_adabest(PROBLEM.model_fn, **kwargs)
