"""Tests for tasks/partitioned_task.py: AdaBest's partitioned tasks."""

import collections
import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import shards
from tasks import partitioned_task
from tasks import synthetic
from tasks.errors import MissingDataError


def _epochs_of(values: np.ndarray, batch_size: int, num_epochs: int):
  dataset = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(v=values))
  return partitioned_task.bootstrapped_epochs(
      dataset, batch_size=batch_size, num_epochs=num_epochs)


@pytest.mark.parametrize('num_examples', [1, 44, 45, 50, 100])
def test_bootstrapped_epochs_are_full_batches_of_own_examples(num_examples):
  values = np.arange(1_000, 1_000 + num_examples)
  batch_size, num_epochs = 45, 3
  batches = [b['v'].numpy() for b in
             _epochs_of(values, batch_size, num_epochs).batch(batch_size)]
  batches_per_epoch = -(-num_examples // batch_size)
  assert len(batches) == num_epochs * batches_per_epoch
  assert all(len(batch) == batch_size for batch in batches)
  for epoch in range(num_epochs):
    epoch_values = np.concatenate(
        batches[epoch * batches_per_epoch:(epoch + 1) * batches_per_epoch])
    # The epoch is a permutation of the client's examples, then fillers
    # drawn from those same examples.
    np.testing.assert_array_equal(
        np.sort(epoch_values[:num_examples]), values)
    assert set(epoch_values[num_examples:]) <= set(values)


def test_bootstrapped_fillers_are_resampled_every_epoch():
  values = np.arange(50)
  examples = [e['v'].numpy() for e in _epochs_of(values, 45, 20)]
  fillers = np.concatenate(
      [examples[90 * epoch + 50:90 * (epoch + 1)] for epoch in range(20)])
  # 800 uniform draws with replacement from 50 values cover nearly all.
  assert len(set(fillers)) > 40
  # The epochs' orders differ too.
  assert not np.array_equal(examples[:50], examples[90:140])


def test_bootstrapped_epochs_differ_between_clients_and_repeat_under_a_seed():
  values = np.arange(30)

  def two_clients():
    tf.random.set_seed(7)
    return [[e['v'].numpy() for e in _epochs_of(values, 8, 2)]
            for _ in range(2)]

  first, second = two_clients()
  # Equally sized clients built one after the other are shuffled apart...
  assert not np.array_equal(first, second)
  # ...and the same seed rebuilds the same datasets.
  np.testing.assert_array_equal(two_clients(), [first, second])
  # A dataset gives the same examples every time it is iterated.
  dataset = _epochs_of(values, 8, 2)
  np.testing.assert_array_equal([e['v'].numpy() for e in dataset],
                                [e['v'].numpy() for e in dataset])


def test_bootstrapped_epochs_of_an_empty_client_are_empty():
  assert not list(_epochs_of(np.zeros(0, np.int64), 45, 5))


def _flips_and_crops(image: np.ndarray) -> list[np.ndarray]:
  """Every flip (or not) of `image` cropped from it zero-padded by 4."""
  candidates = []
  for flipped in (image, image[:, ::-1]):
    padded = np.pad(flipped, [(4, 4), (4, 4), (0, 0)])
    candidates += [padded[i:i + 8, j:j + 8] for i, j in
                   itertools.product(range(9), repeat=2)]
  return candidates


def test_augment_image_keeps_shape_and_flips_and_crops_half_the_time():
  image = np.random.default_rng(0).normal(size=(8, 8, 3)).astype(np.float32)
  candidates = _flips_and_crops(image)
  num_draws = 400
  unchanged = flipped_only = 0
  for draw in range(num_draws):
    augmented = partitioned_task.augment_image(
        tf.constant(image), tf.constant([0, draw], tf.int64)).numpy()
    assert augmented.shape == image.shape
    assert any(np.array_equal(augmented, c) for c in candidates)
    unchanged += np.array_equal(augmented, image)
    flipped_only += np.array_equal(augmented, image[:, ::-1])
  # P(no flip) * P(no crop or the centre crop) = 0.5 * (0.5 + 0.5 / 81).
  expected = 0.5 * (0.5 + 0.5 / 81)
  assert abs(unchanged / num_draws - expected) < 0.1
  assert abs(flipped_only / num_draws - expected) < 0.1


def test_augment_image_is_a_function_of_its_seed():
  image = tf.random.stateless_normal([8, 8, 3], seed=[1, 2])
  seed = tf.constant([3, 4], tf.int64)
  np.testing.assert_array_equal(partitioned_task.augment_image(image, seed),
                                partitioned_task.augment_image(image, seed))


def _two_rounds_of_fedavg(task, client_ids):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
  state = process.initialize()
  initial_weights = process.get_model_weights(state).trainable
  for _ in range(2):
    client_datasets = [
        task.datasets.train_preprocess_fn(
            task.datasets.train_data.create_tf_dataset_for_client(client_id))
        for client_id in client_ids
    ]
    output = process.next(state, client_datasets)
    state = output.state
    train_metrics = output.metrics['client_work']['train']
    assert np.isfinite(train_metrics['loss'])
  final_weights = process.get_model_weights(state).trainable
  assert any(not np.allclose(a, b)
             for a, b in zip(initial_weights, final_weights))
  return train_metrics


def test_mock_cifar10_task_trains_two_rounds_of_fedavg():
  task = partitioned_task.create_partitioned_task(
      'cifar10', num_clients=10, dirichlet_alpha=0.3, num_epochs=1,
      use_mock_data=True)
  datasets = task.datasets
  assert datasets.element_type_structure == collections.OrderedDict(
      x=tf.TensorSpec([None, 32, 32, 3], tf.float32),
      y=tf.TensorSpec([None], tf.int32))
  assert len(datasets.train_data.client_ids) == 10
  assert datasets.validation_data.client_ids == ['validation_0']
  # 20 mock examples per client (10 + 1) in each split.
  assert sum(1 for _ in datasets.test_data) == 220
  train_metrics = _two_rounds_of_fedavg(task, ['0', '1', '2'])
  # One epoch over 20 examples is one bootstrapped batch of 45 per client.
  assert train_metrics['num_examples'] == 3 * 45


def test_mock_cifar10_training_data_differs_between_clients_and_repeats():
  task = partitioned_task.create_partitioned_task(
      'cifar10', num_clients=10, dirichlet_alpha=0.3, num_epochs=1,
      use_mock_data=True)
  client_data = task.datasets.train_data.create_tf_dataset_for_client('0')

  def two_builds_of_one_client():
    # As two clients of a round: built one after the other under one seed.
    tf.random.set_seed(11)
    return [[batch['x'].numpy() for batch in
             task.datasets.train_preprocess_fn(client_data)]
            for _ in range(2)]

  first, second = two_builds_of_one_client()
  assert not np.array_equal(np.concatenate(first), np.concatenate(second))
  np.testing.assert_array_equal(two_builds_of_one_client(), [first, second])


def test_mock_emnist_l_inputs_are_standardized_and_model_is_the_mlp():
  task = partitioned_task.create_partitioned_task(
      'emnist_l', num_clients=10, num_epochs=1, batch_size=20,
      use_mock_data=True)
  datasets = task.datasets
  train_x = np.concatenate([
      batch['x'].numpy()
      for client_id in datasets.train_data.client_ids
      for batch in datasets.train_preprocess_fn(
          datasets.train_data.create_tf_dataset_for_client(client_id))
  ])
  # Standardized with the training split's statistics (train + validation
  # clients); EMNIST-L gets no augmentation, so batches are exact examples.
  assert train_x.shape[1:] == (28, 28, 1)
  assert abs(train_x.mean()) < 0.05 and abs(train_x.std() - 1) < 0.05
  test_x = np.concatenate([b['x'].numpy() for b in
                           datasets.get_centralized_test_data()])
  assert test_x.shape == (220, 28, 28, 1)
  assert abs(test_x.mean()) < 0.1
  with tf.Graph().as_default():
    shapes = [tuple(v.shape) for v in task.model_fn().trainable_variables]
  assert shapes == [(784, 100), (100,), (100, 100), (100,), (100, 26), (26,)]


def test_synthetic_task_repartitions_leaf_data_and_trains():
  task = partitioned_task.create_partitioned_task(
      'synthetic', num_clients=20, dirichlet_alpha=0.3, unbalanced_sigma=0.3,
      num_epochs=1, batch_size=5)
  datasets = task.datasets
  clients = synthetic.generate_synthetic_clients(
      num_clients=synthetic.NUM_CLIENTS)
  leaf_train, leaf_test = synthetic.split_client_examples(
      clients, synthetic.LEAF_SEED)

  def num_examples(client_data):
    return sum(
        int(client_data.create_tf_dataset_for_client(client_id).cardinality())
        for client_id in client_data.client_ids)

  assert num_examples(datasets.train_data) + num_examples(
      datasets.validation_data) == sum(len(y) for _, y in leaf_train)
  assert int(datasets.test_data.cardinality()) == sum(
      len(y) for _, y in leaf_test)
  assert len(datasets.validation_data.client_ids) == 2
  _two_rounds_of_fedavg(task, ['0', '1'])


@pytest.mark.parametrize('kwargs, message', [
    (dict(dataset='mnist'), 'mnist'),
    (dict(dataset='cifar10', batch_size=0), 'batch_size'),
    (dict(dataset='cifar10', num_epochs=0), 'num_epochs'),
    (dict(dataset='cifar10', dirichlet_alpha=-1.0), 'dirichlet_alpha'),
])
def test_bad_arguments_raise_value_error(kwargs, message):
  with pytest.raises(ValueError, match=message):
    partitioned_task.create_partitioned_task(use_mock_data=True, **kwargs)


def test_missing_image_data_raises_missing_data_error(tmp_path):
  with pytest.raises(MissingDataError, match='cifar100'):
    partitioned_task.create_partitioned_task('cifar100',
                                             data_dir=str(tmp_path))


@pytest.mark.parametrize('dataset', ['emnist_l', 'digits'])
def test_numpy_shards_follow_the_clients_pipelines(dataset):
  # fl_engine.shards batches these clients in NumPy (the preprocess
  # functions' batch recipes): evaluation shards equal the tf.data
  # pipelines' exactly; training shards have the pipeline's batches (full,
  # bootstrapped epochs of the client's own standardized examples), drawn
  # with NumPy's generator instead of TF's.
  batch_size, num_epochs = 7, 2
  task = partitioned_task.create_partitioned_task(
      dataset, num_clients=10, num_epochs=num_epochs, batch_size=batch_size,
      eval_batch_size=6, use_mock_data=True, unbalanced_sigma=0.5)
  datasets = task.datasets
  ids = datasets.train_data.client_ids[:5]
  per_client = [datasets.train_preprocess_fn(
      datasets.train_data.create_tf_dataset_for_client(i)) for i in ids]
  [numpy_shard] = shards.shards_for_round(
      datasets.train_data, datasets.train_preprocess_fn, ids, 5,
      np.random.default_rng(0))
  [tf_shard] = shards.shards_from_datasets(per_client, 5)
  np.testing.assert_array_equal(numpy_shard['batch_sizes'],
                                tf_shard['batch_sizes'])
  assert set(numpy_shard['batch_sizes']) <= {0, batch_size}
  for name in ('x', 'y'):
    assert numpy_shard['examples'][name].dtype == tf_shard['examples'][
        name].dtype

  def examples_of_client(shard, k):
    ends = np.cumsum(shard['batch_sizes'])
    closing = np.flatnonzero(shard['batch_sizes'] == 0)
    start = 0 if k == 0 else ends[closing[k - 1]]
    return {name: array[start:ends[closing[k]]]
            for name, array in shard['examples'].items()}

  for k, client_id in enumerate(ids):
    own = next(iter(datasets.eval_preprocess_fn(
        datasets.train_data.create_tf_dataset_for_client(client_id)).unbatch(
            ).batch(10_000)), None)
    made = examples_of_client(numpy_shard, k)
    if own is None:
      assert len(made['y']) == 0
      continue
    n = len(own['y'])
    epoch = len(made['y']) // num_epochs
    key = lambda e: np.lexsort(e['x'].reshape(len(e['x']), -1).T)
    for start in range(0, len(made['y']), epoch):
      # Each epoch: a permutation of the client's standardized examples,
      # then fillers drawn from them.
      part = {name: a[start:start + n] for name, a in made.items()}
      np.testing.assert_allclose(part['x'][key(part)],
                                 own['x'].numpy()[key(
                                     {'x': own['x'].numpy()})], rtol=1e-6)
  # Validation clients, evaluated in NumPy shards, equal the pipeline's.
  val_ids = datasets.validation_data.client_ids
  [numpy_eval] = shards.shards_for_round(
      datasets.validation_data, datasets.eval_preprocess_fn, val_ids,
      len(val_ids), np.random.default_rng(0))
  [tf_eval] = shards.shards_from_datasets(
      [datasets.eval_preprocess_fn(
          datasets.validation_data.create_tf_dataset_for_client(i))
       for i in val_ids], len(val_ids))
  tf.nest.map_structure(np.testing.assert_array_equal, numpy_eval, tf_eval)


def test_augmented_tasks_keep_the_tf_data_pipeline():
  task = partitioned_task.create_partitioned_task(
      'cifar10', num_clients=4, use_mock_data=True)
  assert not hasattr(task.datasets.train_preprocess_fn, 'batch_recipe')
  assert hasattr(task.datasets.eval_preprocess_fn, 'batch_recipe')
