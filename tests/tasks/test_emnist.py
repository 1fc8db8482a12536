"""tasks.emnist: SPEC.md's EMNIST-62 CNN, offline checks, validation split."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import emnist
from tests import task_checks


def test_model_is_specs_cnn_with_62_classes():
  task = emnist.create_emnist_task(
      use_synthetic_data=True, validation_fraction=0.0
  )
  # conv 3x3x32, conv 3x3x64, (max-pool, dropout) dense 128, dense 62.
  assert task_checks.variable_shapes(task) == [
      [3, 3, 1, 32], [32], [3, 3, 32, 64], [64],
      [12 * 12 * 64, 128], [128], [128, 62], [62],
  ]
  spec = task.datasets.element_type_structure
  assert spec[0].shape.as_list() == [None, 28, 28, 1]


def test_fedavg_trains_two_rounds_on_two_clients():
  task = emnist.create_emnist_task(
      train_batch_size=2,
      max_elements_per_client=3,
      use_synthetic_data=True,
      validation_fraction=0.0,
  )
  client_ids = task.datasets.train_data.client_ids
  assert len(client_ids) == 2
  run = task_checks.train_fedavg(task, client_ids, client_learning_rate=0.01)
  for train_metrics in run.train_metrics:
    assert train_metrics['num_examples'] == 2 * 3  # max_elements_per_client
    assert emnist.ACCURACY_METRIC_NAME in train_metrics
    assert np.isfinite(train_metrics['loss'])
  task_checks.assert_model_changed(run)


def test_validation_split_is_the_seeded_client_split():
  task = emnist.create_emnist_task(
      use_synthetic_data=True, validation_fraction=0.2, seed=4
  )
  task_checks.assert_seeded_validation_split(
      task, tff.simulation.datasets.emnist.get_synthetic().client_ids, 0.2,
      seed=4
  )


@pytest.mark.parametrize('existing_dir', [True, False])
def test_missing_data_is_one_line_naming_the_file_and_writes_nothing(
    tmp_path, existing_dir
):
  data_dir = tmp_path / 'cache'
  if existing_dir:
    data_dir.mkdir()
  message = task_checks.missing_data_message(emnist.create_emnist_task,
                                            data_dir)
  assert str(data_dir / 'emnist_all.sqlite') in message
  assert os.listdir(tmp_path) == (['cache'] if existing_dir else [])
  if existing_dir:
    assert not os.listdir(data_dir)


def test_loads_cached_file_from_data_dir_without_writing(tmp_path):
  # A tiny file in TFF's EMNIST format, where TFF would have cached it.
  def writer_dataset(client_id):
    label = int(client_id[-1])
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(
            label=np.full(3, label, np.int64),
            pixels=np.full((3, 28, 28), label / 10, np.float32),
        )
    )

  splits = {'w0': 'all_train', 'w1': 'all_train', 'w2': 'all_train',
            'w3': 'all_test'}
  tff.simulation.datasets.save_to_sql_client_data(
      list(splits), writer_dataset, str(tmp_path / 'emnist_all.sqlite'),
      split_names_by_client_id=splits,
  )
  task = emnist.create_emnist_task(
      data_dir=str(tmp_path), validation_fraction=0.34, seed=0
  )
  all_train = task.datasets.train_data.client_ids + (
      task.datasets.validation_data.client_ids
  )
  assert sorted(all_train) == ['w0', 'w1', 'w2']
  assert task.datasets.test_data.client_ids == ['w3']
  client_id = task.datasets.train_data.client_ids[0]
  pixels, labels = next(iter(task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client(client_id))))
  np.testing.assert_array_equal(labels, [int(client_id[-1])] * 3)
  assert pixels.shape == (3, 28, 28, 1)
  assert os.listdir(tmp_path) == ['emnist_all.sqlite']


def test_bad_batch_size_is_a_value_error():
  with pytest.raises(ValueError, match='batch_size'):
    emnist.create_emnist_task(train_batch_size=0, use_synthetic_data=True)
