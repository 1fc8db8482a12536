"""Per-client accuracy is each client's own; percentiles are numpy's."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from large_cohort import per_client_evaluation


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


def test_each_client_gets_its_own_accuracy():
  # Weights whose prediction is argmax(x @ kernel + bias).
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
    expected.append(np.mean(predictions == y[:, 0]))
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(2))  # several batches
  evaluate = per_client_evaluation.build_per_client_evaluation(_model_fn)
  accuracies = evaluate(weights, datasets)
  assert len(accuracies) == 3
  np.testing.assert_allclose(accuracies, expected, rtol=1e-6)
  assert len(set(expected)) > 1  # the clients really differ


def test_unknown_metric_raises_with_the_available_names():
  with pytest.raises(ValueError, match='sparse_categorical_accuracy'):
    per_client_evaluation.build_per_client_evaluation(_model_fn, 'accuracy')


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
