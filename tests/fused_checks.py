"""Shared by the fused-round tests: small client datasets (uneven sizes, an
optional NaN client), a float comparison of nested results, and one round
of a per-client and a fused process compared."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import execution
from fl_engine import shards

NUM_FEATURES = 3

# The server Adam's ε in the equality tests. Adam's first step is
# Δ/(|Δ| + ε), close to sign(Δ): at TFF's default ε = 1e-7, a coordinate of
# the mean update that cancels to about ε turns the two paths' float32
# rounding (1e-8) into a relative difference of 1e-2 in the new weights. A
# larger ε keeps the step a smooth function of Δ, so that the comparison
# tests the arithmetic, not the rounding.
ADAM_EPSILON = 1e-2


def on_shards(build, model_fn, *, lanes=1, resident_examples=None, **kwargs):
  """`build(model_fn, execution=OnShards(lanes, resident_examples),
  **kwargs)`: a builder's process on shards of clients."""
  return build(model_fn, execution=execution.OnShards(
      lanes=lanes, resident_examples=resident_examples), **kwargs)


def client_datasets(sizes, nan_client=None, batch_size=2, seed=0):
  rng = np.random.default_rng(seed)
  datasets = []
  for k, size in enumerate(sizes):
    x = rng.normal(size=(size, NUM_FEATURES)).astype(np.float32)
    y = rng.normal(size=(size, 1)).astype(np.float32)
    if k == nan_client:
      x[0, 0] = np.nan
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(batch_size))
  return datasets


def assert_close(a, b):
  flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
  assert len(flat_a) == len(flat_b)
  for x, y in zip(flat_a, flat_b):
    np.testing.assert_allclose(np.asarray(x, np.float64),
                               np.asarray(y, np.float64), rtol=1e-5,
                               atol=1e-6)


def assert_same_stateful_round(output, other_output, runner, other_runner,
                               client_ids):
  """Asserts that two stateful rounds (`StatefulClientRunner.next`
  outputs) gave equal states and metrics, and left equal states of
  `client_ids` in their runners' stores."""
  assert_close(output.state, other_output.state)
  assert_close(output.metrics, other_output.metrics)
  assert_close(runner.store.load(client_ids),
               other_runner.store.load(client_ids))


def assert_same_round(per_client, on_shards, state, fused_state, datasets,
                      clients_per_shard, max_shard_bytes=None):
  """Runs a round of both processes (the fused one on shards of
  `datasets`, cut to `max_shard_bytes` if given), asserts equal states,
  metrics and metric structure, and returns both outputs."""
  output = per_client.next(state, datasets)
  round_shards = shards.shards_from_datasets(datasets, clients_per_shard)
  if max_shard_bytes is not None:
    round_shards = shards.split_shards(round_shards, max_shard_bytes)
  fused_output = on_shards.next(fused_state, round_shards)
  assert_close(output.state, fused_output.state)
  assert_close(output.metrics, fused_output.metrics)
  assert (tf.nest.map_structure(lambda _: 0, output.metrics) ==
          tf.nest.map_structure(lambda _: 0, fused_output.metrics))
  return output, fused_output


def assert_screened(metrics, sizes, nan_client):
  """Asserts a round's counts with an empty and a NaN client among `sizes`:
  every client counted, both sent zeros, the NaN client's examples dropped
  from the training metrics."""
  aggregator = metrics['aggregator']
  assert aggregator['num_clients'] == len(sizes)
  assert aggregator['num_zero_updates'] == 2
  train = metrics['client_work']['train']
  assert train['num_examples'] == sum(sizes) - sizes[nan_client]


def saturated_classifier_fn():
  """A Keras softmax classifier (TFF's `from_keras_model`, Keras' cross
  entropy on probabilities) whose predictions on
  `saturated_classifier_datasets` start saturated: probabilities below
  Keras' epsilon, which TFF's per-client forward pass clips (its
  `predict_on_batch` is a call; Keras sees no logits through it)."""

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
        3, activation='softmax', input_shape=(NUM_FEATURES,),
        kernel_initializer=tf.keras.initializers.RandomNormal(seed=0))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, NUM_FEATURES], tf.float32),
            y=tf.TensorSpec([None], tf.int32)),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def saturated_classifier_datasets(sizes, batch_size=2, seed=0):
  rng = np.random.default_rng(seed)
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=(50.0 * rng.normal(size=(size, NUM_FEATURES))).astype(np.float32),
      y=rng.integers(0, 3, size).astype(np.int32))).batch(batch_size)
          for size in sizes]


def assert_saturated_loss(loss):
  """Asserts that a mean loss is that of saturated predictions as TFF's
  per-client forward pass computes it: large, and bounded by Keras'
  clipping of probabilities at 1e-7 (-log(1e-7) = 16.1 per example)."""
  assert 5.0 < loss <= -np.log(1e-7) + 1e-3
