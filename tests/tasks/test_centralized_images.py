"""Tests for tasks/centralized_images.py: TFDS loaders, offline (downloads:
tests/tasks/test_tfds_downloads.py)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import centralized_images
from tasks import data_files
from tasks.errors import MissingDataError


@pytest.mark.parametrize('name, shape, num_classes', [
    ('emnist_l', (28, 28, 1), 26),
    ('cifar10', (32, 32, 3), 10),
    ('cifar100', (32, 32, 3), 100),
])
def test_loads_mocked_dataset_as_arrays(name, shape, num_classes):
  with centralized_images.mock_image_data(num_examples=300):
    train, test = centralized_images.load_image_dataset(name)
  for split in (train, test):
    assert split.x.shape == (300, *shape)
    assert split.x.dtype == np.uint8
    assert split.y.dtype == np.int32
    assert split.y.min() >= 0 and split.y.max() < num_classes
  # 300 uniform draws reach the top class with overwhelming probability.
  assert train.y.max() == num_classes - 1
  assert not np.array_equal(train.x, test.x)


def _fixed_examples(images: np.ndarray, labels: list[int]):
  """A `tfds.testing.mock_data` dataset function returning fixed examples."""

  def as_dataset(builder, split, decoders=None, read_config=None,
                 shuffle_files=False):
    del builder, split, decoders, read_config, shuffle_files
    return tf.data.Dataset.from_tensor_slices(
        {'image': images, 'label': np.array(labels, np.int64)})

  return as_dataset


def test_emnist_letters_labels_1_to_26_become_0_to_25():
  images = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28, 1)
  with tfds.testing.mock_data(
      num_examples=3, as_dataset_fn=_fixed_examples(images, [1, 26, 5])):
    train, test = centralized_images.load_image_dataset('emnist_l')
  np.testing.assert_array_equal(train.y, [0, 25, 4])
  np.testing.assert_array_equal(train.x, images)
  np.testing.assert_array_equal(test.y, [0, 25, 4])


def test_emnist_letters_label_0_is_rejected():
  images = np.zeros((2, 28, 28, 1), np.uint8)
  with tfds.testing.mock_data(
      num_examples=2, as_dataset_fn=_fixed_examples(images, [3, 0])):
    with pytest.raises(ValueError, match='label 0 outside 1..26'):
      centralized_images.load_image_dataset('emnist_l')


def test_tfds_default_mock_data_loads_cifar():
  with tfds.testing.mock_data(num_examples=7):
    train, _ = centralized_images.load_image_dataset('cifar100')
  assert train.x.shape == (7, 32, 32, 3)
  assert train.y.max() < 100


@pytest.mark.parametrize('name, tfds_name, archive', [
    ('emnist_l', 'emnist/letters', 'gzip.zip'),
    ('cifar10', 'cifar10', 'cifar-10-binary.tar.gz'),
    ('cifar100', 'cifar100', 'cifar-100-binary.tar.gz')])
def test_offline_missing_dataset_is_one_line_and_writes_nothing(
    tmp_path, name, tfds_name, archive):
  with pytest.raises(MissingDataError) as error:
    centralized_images.load_image_dataset(name, data_dir=str(tmp_path))
  message = str(error.value)
  assert '\n' not in message
  assert f"TFDS '{tfds_name}'" in message and archive in message
  assert str(tmp_path) in message and 'prepare_data' in message
  assert not list(tmp_path.iterdir())  # Nothing was downloaded or written.


def test_failed_download_raises_missing_data_error(tmp_path, monkeypatch):
  # A loopback port nobody listens on.
  monkeypatch.setenv(data_files.MIRROR_ENV, 'http://127.0.0.1:9')
  monkeypatch.setenv(data_files.OFFLINE_ENV, '0')
  with pytest.raises(MissingDataError, match='could not be downloaded'):
    centralized_images.load_image_dataset('cifar10', data_dir=str(tmp_path))
  assert not (tmp_path / 'cifar10').exists()


def test_unknown_dataset_raises_value_error():
  with pytest.raises(ValueError, match="'mnist'"):
    centralized_images.load_image_dataset('mnist')
