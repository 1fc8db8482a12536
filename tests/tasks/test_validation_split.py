"""tasks.validation_split: disjoint, reproducible client-level splits."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import validation_split


def _client_data(num_clients: int) -> tff.simulation.datasets.ClientData:
  return tff.simulation.datasets.TestClientData({
      f'c{i}': collections.OrderedDict(
          x=np.full((i + 1, 2), i, np.float32), y=np.full(i + 1, i, np.int32)
      )
      for i in range(num_clients)
  })


def _task(num_clients: int) -> tff.simulation.baselines.BaselineTask:
  data = _client_data(num_clients)
  batch = lambda dataset: dataset.batch(2)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=data,
      test_data=data,
      train_preprocess_fn=batch,
      eval_preprocess_fn=batch,
  )

  def model_fn():
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential(
            [tf.keras.layers.Dense(3, input_shape=(2,), activation='softmax')]
        ),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=datasets.element_type_structure,
    )

  return tff.simulation.baselines.BaselineTask(datasets, model_fn)


@pytest.mark.parametrize(
    'num_clients,fraction,num_validation',
    [(10, 0.2, 2), (3400, 0.2, 680), (2, 0.2, 1), (5, 0.9, 4)],
)
def test_split_is_a_disjoint_partition_of_the_right_size(
    num_clients, fraction, num_validation
):
  ids = [f'c{i}' for i in range(num_clients)]
  train, validation = validation_split.split_client_ids(ids, fraction, seed=3)
  assert len(validation) == num_validation
  assert not set(train) & set(validation)
  assert sorted(train + validation) == sorted(ids)


def test_split_is_reproducible_by_seed_and_changes_with_it():
  ids = [f'c{i}' for i in range(100)]
  first = validation_split.split_client_ids(ids, 0.2, seed=7)
  assert validation_split.split_client_ids(ids, 0.2, seed=7) == first
  assert validation_split.split_client_ids(ids, 0.2, seed=8) != first


@pytest.mark.parametrize('fraction', [0.0, 1.0, -0.1, 1.5])
def test_bad_fraction_is_a_value_error_naming_it(fraction):
  with pytest.raises(ValueError, match='validation_fraction'):
    validation_split.split_client_ids(['a', 'b'], fraction, seed=0)


def test_one_client_cannot_be_split():
  with pytest.raises(ValueError, match='1 client'):
    validation_split.split_client_ids(['a'], 0.5, seed=0)


def test_split_client_data_serves_each_clients_own_examples():
  data = _client_data(6)
  train, validation = validation_split.split_train_clients(data, 0.5, seed=1)
  assert len(train.client_ids) == len(validation.client_ids) == 3
  for split in (train, validation):
    for client_id in split.client_ids:
      got = list(split.create_tf_dataset_for_client(client_id))
      want = list(data.create_tf_dataset_for_client(client_id))
      assert len(got) == len(want)
      for got_example, want_example in zip(got, want):
        np.testing.assert_array_equal(got_example['x'], want_example['x'])


def test_add_validation_clients_keeps_everything_else():
  task = _task(10)
  split_task = validation_split.add_validation_clients(task, 0.2, seed=0)
  train_ids = split_task.datasets.train_data.client_ids
  validation_ids = split_task.datasets.validation_data.client_ids
  assert len(validation_ids) == 2 and len(train_ids) == 8
  assert sorted(train_ids + validation_ids) == sorted(
      task.datasets.train_data.client_ids
  )
  assert split_task.model_fn is task.model_fn
  assert split_task.datasets.test_data is task.datasets.test_data
  assert (
      split_task.datasets.train_preprocess_fn
      is task.datasets.train_preprocess_fn
  )
  again = validation_split.add_validation_clients(task, 0.2, seed=0)
  assert again.datasets.validation_data.client_ids == validation_ids


def test_zero_fraction_returns_the_task_unchanged():
  task = _task(4)
  assert validation_split.add_validation_clients(task, 0.0, seed=0) is task


def test_cannot_add_validation_twice():
  split_task = validation_split.add_validation_clients(_task(4), 0.5, seed=0)
  with pytest.raises(ValueError, match='already has validation'):
    validation_split.add_validation_clients(split_task, 0.5, seed=0)
