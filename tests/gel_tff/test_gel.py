"""The Table 3 processes: equivalences with TFF's algorithms, FedNova, smoke."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from gel_tff import client_work
from gel_tff import gel

NUM_FEATURES = 3
INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, NUM_FEATURES], tf.float32),
    y=tf.TensorSpec([None, 1], tf.float32))
LEARNING_RATE = 0.05
STEPS_PER_CLIENT = (2, 4, 7)


def model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(1, kernel_initializer='ones',
                            input_shape=(NUM_FEATURES,))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=INPUT_SPEC)


def client_datasets(seed, steps=STEPS_PER_CLIENT):
  rng = np.random.default_rng(seed)
  return [
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          x=rng.normal(size=(2 * n, NUM_FEATURES)).astype(np.float32),
          y=rng.normal(size=(2 * n, 1)).astype(np.float32))).batch(2)
      for n in steps
  ]


def train(process, num_rounds=2):
  state = process.initialize()
  for round_num in range(num_rounds):
    output = process.next(state, client_datasets(round_num))
    state = output.state
  return process.get_model_weights(state).trainable, output.metrics


def assert_same_weights(actual, expected):
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)


def test_zero_guessed_steps_is_fedavgcm():
  gel_weights, _ = train(gel.build_gel(
      model_fn, base='fedavgcm', client_learning_rate=LEARNING_RATE,
      guessed_steps=0))
  tff_weights, _ = train(tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          LEARNING_RATE, momentum=0.9),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0)))
  assert_same_weights(gel_weights, tff_weights)


def test_guessing_changes_fedavgcm():
  gel_weights, _ = train(gel.build_gel(
      model_fn, base='fedavgcm', client_learning_rate=LEARNING_RATE,
      expected_steps=10))
  no_guess_weights, _ = train(gel.build_gel(
      model_fn, base='fedavgcm', client_learning_rate=LEARNING_RATE,
      guessed_steps=0))
  assert max(np.abs(a - b).max()
             for a, b in zip(gel_weights, no_guess_weights)) > 1e-3


def test_fedavg_baseline_is_tff_fedavg_with_sgd():
  weights, _ = train(gel.build_budgeted_baseline(
      model_fn, base='fedavg', client_learning_rate=LEARNING_RATE))
  tff_weights, _ = train(tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0)))
  assert_same_weights(weights, tff_weights)


def test_proximal_strength_acts_only_in_fedprox():
  # TFF 0.87's own FedProx client work adds mu (x^(t,0) - x) to the gradient
  # (the opposite sign of the gradient of mu/2 ||x - x^(t,0)||^2), so it is
  # no reference here; the proximal gradient is checked against NumPy in
  # tests/gel_tff/test_client_work.py.
  fedavgcm_weights, _ = train(gel.build_budgeted_baseline(
      model_fn, base='fedavgcm', client_learning_rate=LEARNING_RATE))
  ignored_weights, _ = train(gel.build_budgeted_baseline(
      model_fn, base='fedavgcm', client_learning_rate=LEARNING_RATE,
      proximal_strength=0.5))
  fedprox_weights, _ = train(gel.build_budgeted_baseline(
      model_fn, base='fedprox', client_learning_rate=LEARNING_RATE,
      proximal_strength=0.5))
  assert_same_weights(ignored_weights, fedavgcm_weights)
  assert max(np.abs(a - b).max()
             for a, b in zip(fedprox_weights, fedavgcm_weights)) > 1e-3


def test_fedyogi_baseline_is_tff_fedavg_with_yogi_server():
  weights, _ = train(gel.build_budgeted_baseline(
      model_fn, base='fedyogi', client_learning_rate=LEARNING_RATE))
  tff_weights, _ = train(tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_yogi(
          1e-2, beta_1=0.9, beta_2=0.99, epsilon=1e-3)))
  assert_same_weights(weights, tff_weights)


def test_fednova_gel_round_matches_normalized_average_of_client_updates():
  expected_steps = 9
  process = gel.build_gel(model_fn, base='fednova',
                          client_learning_rate=LEARNING_RATE,
                          expected_steps=expected_steps)
  state = process.initialize()
  initial = process.get_model_weights(state)
  new_weights = process.get_model_weights(
      process.next(state, client_datasets(0)).state).trainable
  # The same clients' updates, from the client work tested on its own.
  work = client_work.build_gel_client_work(
      model_fn, learning_rate=LEARNING_RATE, expected_steps=expected_steps,
      report_normalizer=True)
  results = work.next(work.initialize(), [initial] * 3,
                      client_datasets(0)).result
  p = np.array([r.update_weight for r in results]) / sum(
      r.update_weight for r in results)
  normalizers = np.array([r.update.normalizer for r in results])
  tau_eff = p @ normalizers
  for i, initial_tensor in enumerate(initial.trainable):
    aggregate = tau_eff * sum(p_k * r.update.model_delta[i] / n for p_k, r, n
                              in zip(p, results, normalizers))
    np.testing.assert_allclose(new_weights[i], initial_tensor - aggregate,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('base', gel.BASES)
@pytest.mark.parametrize('use_gel', [True, False])
def test_one_round_of_each_combination(base, use_gel):
  if use_gel:
    process = gel.build_gel(model_fn, base=base,
                            client_learning_rate=LEARNING_RATE,
                            expected_steps=10)
  else:
    process = gel.build_budgeted_baseline(model_fn, base=base,
                                          client_learning_rate=LEARNING_RATE)
  state = process.initialize()
  before = process.get_model_weights(state).trainable
  output = process.next(state, client_datasets(0))
  after = process.get_model_weights(output.state).trainable
  assert output.metrics['client_work']['gradient_steps'] == sum(
      STEPS_PER_CLIENT)
  assert all(np.all(np.isfinite(t)) for t in after)
  assert max(np.abs(a - b).max() for a, b in zip(after, before)) > 1e-4


def test_server_optimizer_follows_table_3():
  assert gel.build_server_optimizer('fedyogi').get_hparams(
      gel.build_server_optimizer('fedyogi').initialize(
          tf.TensorSpec([], tf.float32)))['beta_2'] == pytest.approx(0.99)
  sgd = gel.build_server_optimizer('fedavgcm', learning_rate=0.5)
  assert set(sgd.get_hparams(sgd.initialize(tf.TensorSpec([], tf.float32)))
             ) == {'learning_rate'}


def test_bad_arguments():
  with pytest.raises(ValueError, match='fedadam'):
    gel.build_gel(model_fn, base='fedadam')
  with pytest.raises(ValueError, match='0.0'):
    gel.build_gel(model_fn, momentum=0.0)
  with pytest.raises(TypeError, match='WeightedAggregationFactory'):
    gel.build_gel(model_fn, model_aggregator='mean')


def test_an_unweighted_aggregator_averages_uniformly_in_both_executions():
  # The aggregator a builder takes is the same per client and on shards
  # (`fl_engine.compose`): an unweighted one averages the updates uniformly.
  # (Per client it was refused before the one composer.)
  process = gel.build_gel(
      model_fn, model_aggregator=tff.aggregators.UnweightedMeanFactory())
  assert 'aggregator' in process.initialize()._asdict()
