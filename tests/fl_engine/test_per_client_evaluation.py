"""Per-client metrics are each client's own, their sum is TFF's federated
evaluation, percentiles are numpy's."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import per_client_evaluation
from fl_engine import shards
from tests import fused_checks


def _model_fn():
  keras_model = tf.keras.Sequential(
      [tf.keras.layers.Dense(2, input_shape=(2,))])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(
          x=tf.TensorSpec([None, 2], tf.float32),
          y=tf.TensorSpec([None, 1], tf.int32)),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def _weights_and_clients():
  """Weights whose prediction is argmax(x @ kernel + bias), 3 clients."""
  kernel = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
  bias = np.array([0.0, 0.5], np.float32)
  weights = tff.learning.models.ModelWeights(trainable=[kernel, bias],
                                             non_trainable=[])
  rng = np.random.default_rng(0)
  datasets, expected = [], []
  for num_examples in (5, 1, 8):
    x = rng.normal(size=(num_examples, 2)).astype(np.float32)
    y = rng.integers(0, 2, size=(num_examples, 1)).astype(np.int32)
    predictions = np.argmax(x @ kernel + bias, axis=1)
    expected.append(predictions == y[:, 0])
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(2))  # several batches
  return weights, datasets, expected


def test_each_client_gets_its_own_accuracy():
  weights, datasets, correct = _weights_and_clients()
  evaluate = per_client_evaluation.build_per_client_evaluation(_model_fn)
  per_client = evaluate(weights, datasets)
  assert len(per_client) == 3
  accuracies = [c['finalized']['sparse_categorical_accuracy']
                for c in per_client]
  expected = [np.mean(c) for c in correct]
  np.testing.assert_allclose(accuracies, expected, rtol=1e-6)
  assert len(set(expected)) > 1  # the clients really differ
  assert [c['finalized']['num_examples'] for c in per_client] == [5, 1, 8]


def _assert_fused_equals_per_client(model_fn, weights, datasets,
                                    clients_per_shard, rtol):
  """Evaluates `datasets` per client and on shards of `clients_per_shard`,
  asserts each client's metrics equal; returns (per_client, per_shard,
  the shards' clients)."""
  per_client = per_client_evaluation.build_per_client_evaluation(model_fn)(
      weights, datasets)
  fused = per_client_evaluation.build_fused_per_client_evaluation(model_fn)
  per_shard = fused(weights,
                    shards.shards_from_datasets(datasets, clients_per_shard))
  got = per_client_evaluation.split_clients(per_shard)
  assert len(got) == len(per_client) == len(datasets)
  for a, b in zip(per_client, got):
    tf.nest.map_structure(
        lambda x, y: np.testing.assert_allclose(np.asarray(x), y, rtol=rtol),
        a, b)
  return per_client, per_shard, got


@pytest.mark.parametrize('clients_per_shard', [1, 2, 3])
def test_fused_evaluation_equals_the_per_client_evaluation(clients_per_shard):
  weights, datasets, _ = _weights_and_clients()
  # An empty client too: its metrics are the model's initial (zero) ones.
  datasets.insert(1, datasets[0].take(0))
  assert len(datasets) == 4
  _, per_shard, got = _assert_fused_equals_per_client(
      _model_fn, weights, datasets, clients_per_shard, rtol=1e-6)
  # Summed per shard, the totals are the clients' sums.
  tf.nest.map_structure(
      np.testing.assert_array_equal,
      per_client_evaluation.sum_over_shards(
          [shard['unfinalized'] for shard in per_shard]),
      per_client_evaluation.sum_over_clients(
          [client['unfinalized'] for client in got]))


def test_fused_evaluation_of_saturated_predictions_equals_per_client():
  # Keras' loss on clipped probabilities, as per client (not on the logits
  # that the inlined evaluation would show it).
  model_fn = fused_checks.saturated_classifier_fn()
  datasets = fused_checks.saturated_classifier_datasets([5, 3, 8])
  with tf.Graph().as_default():
    weights_model = model_fn()
  weights = tff.learning.models.ModelWeights(
      trainable=[np.random.default_rng(1).normal(size=v.shape).astype(
          np.float32) for v in weights_model.trainable_variables],
      non_trainable=[])
  per_client, _, _ = _assert_fused_equals_per_client(
      model_fn, weights, datasets, 2, rtol=1e-5)
  fused_checks.assert_saturated_loss(per_client[0]['finalized']['loss'])


def test_summed_then_finalized_metrics_equal_tff_federated_evaluation():
  weights, datasets, correct = _weights_and_clients()
  evaluate = per_client_evaluation.build_per_client_evaluation(_model_fn)
  per_client = evaluate(weights, datasets)
  totals = per_client_evaluation.MetricsFinalizer(_model_fn)(
      per_client_evaluation.sum_over_clients(
          [c['unfinalized'] for c in per_client]))
  # Example-weighted: the accuracy over all 14 examples, not the mean of the
  # clients' accuracies.
  assert totals['sparse_categorical_accuracy'] == pytest.approx(
      np.mean(np.concatenate(correct)), rel=1e-6)
  fed_eval = tff.learning.algorithms.build_fed_eval(_model_fn)
  state = fed_eval.set_model_weights(fed_eval.initialize(), weights)
  want = fed_eval.next(state, datasets).metrics['client_work']['eval'][
      'current_round_metrics']
  assert set(totals) == set(want)
  for name, value in want.items():
    assert totals[name] == pytest.approx(float(value), rel=1e-6), name


def test_a_non_tff_model_is_rejected():
  with pytest.raises(ValueError, match='VariableModel'):
    per_client_evaluation.build_per_client_evaluation(
        lambda: tf.keras.Sequential([tf.keras.layers.Dense(1)]))
  with pytest.raises(ValueError, match='at least one client'):
    per_client_evaluation.sum_over_clients([])


def test_percentiles_match_numpy():
  values = np.random.default_rng(1).uniform(size=37)
  percentiles = per_client_evaluation.accuracy_percentiles(values)
  assert list(percentiles) == [5, 25, 50, 75, 95]
  for q, value in percentiles.items():
    assert value == np.percentile(values, q)
  assert per_client_evaluation.accuracy_percentiles(
      [0.2, 0.4, 0.6, 0.8], (0, 50, 100)) == pytest.approx(
          {0: 0.2, 50: 0.5, 100: 0.8})


@pytest.mark.parametrize('values, percentiles, bad', [
    ([], (50,), 'non-empty'),
    ([0.5, float('nan')], (50,), 'finite'),
    ([0.5], (101,), 'percentiles'),
])
def test_bad_percentile_arguments_raise(values, percentiles, bad):
  with pytest.raises(ValueError, match=bad):
    per_client_evaluation.accuracy_percentiles(values, percentiles)
