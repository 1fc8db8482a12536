"""SCAFFOLD option II against a NumPy transcription of Karimireddy et al."""

import numpy as np
import pytest
import tensorflow_federated as tff

from adabest_tff import scaffold
from tests import tiny_models

POPULATION_SIZE = 5
PROBLEM = tiny_models.LinearRegressionProblem(
    seed=5, client_sizes={'a': 4, 'b': 3, 'c': 5, 'empty': 0},
    initial_kernel=[[-0.1], [0.2], [0.1]], initial_bias=[0.3], l2=0.01)
# 'empty' has no data: K = 0 steps, so it keeps c_i and sends a zero update.
COHORTS = (('a', 'b'), ('b', 'c', 'empty'), ('a', 'c'))


def reference_scaffold(cohorts, *, learning_rate, decay, server_learning_rate,
                       uniform):
  """SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II) in NumPy."""
  x = PROBLEM.initial_weights()
  c = np.zeros_like(x)
  client_c = {}
  history = []
  for t, cohort in enumerate(cohorts, start=1):
    eta = learning_rate * decay**(t - 1)
    deltas, weights, control_deltas = [], [], []
    for cid in cohort:
      c_i = client_c.get(cid, np.zeros_like(x))
      features, labels = PROBLEM.client_data[cid]
      y, steps = x.copy(), 0
      for start in range(0, len(labels), PROBLEM.batch_size):
        batch = slice(start, start + PROBLEM.batch_size)
        y = y - eta * (
            PROBLEM.loss_gradient(y, features[batch], labels[batch]) - c_i +
            c)
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
      PROBLEM.model_fn, population_size=POPULATION_SIZE,
      client_learning_rate=hparams['learning_rate'],
      client_learning_rate_decay=hparams['decay'],
      server_learning_rate=hparams['server_learning_rate'],
      client_weighting=weighting)
  expected = reference_scaffold(COHORTS, uniform=uniform, **hparams)
  rounds = tiny_models.run_stateful_rounds(process, COHORTS, PROBLEM.dataset)
  for (state, _, client_states), (x, c, reference_c) in zip(rounds, expected):
    np.testing.assert_allclose(
        tiny_models.flat(process.get_model_weights(state).trainable), x,
        atol=1e-6)
    np.testing.assert_allclose(
        tiny_models.flat(
            state.client_work['server_values'][scaffold.CONTROL_VARIATE]),
        c, atol=1e-6)
    for cid, c_i in reference_c.items():
      np.testing.assert_allclose(
          tiny_models.flat(client_states[cid][scaffold.CONTROL_VARIATE]), c_i,
          atol=1e-5)


@pytest.mark.parametrize('kwargs, bad_value', [
    (dict(population_size=-3), '-3'),
    (dict(population_size=5, server_learning_rate=0.0), '0.0'),
    (dict(population_size=5, client_learning_rate_decay=0.0), '0.0'),
])
def test_bad_hyperparameters_raise_value_error(kwargs, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    scaffold.build_scaffold(PROBLEM.model_fn, **kwargs)
