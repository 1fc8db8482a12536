"""EMNIST-L, CIFAR-10 and CIFAR-100 from TensorFlow Datasets as NumPy arrays.

These are the centralized datasets AdaBest (Varno et al. 2022, Section 4)
partitions over clients (see `tasks.partition`). Images stay `uint8` in
memory (CIFAR's training split is 150 MB as bytes, 600 MB as floats);
normalization happens in the task's `tf.data` pipeline.

EMNIST-L is TFDS's `emnist/letters`: 26 letter classes stored as labels
1..26 (TFDS declares 37 classes, tensorflow/datasets#2579), shifted here to
0..25. FedDyn's code keeps only the first 10 letters; AdaBest's text and this
package use all 26.

Nothing is downloaded when `data_dir` is given: TFDS must have prepared the
dataset there already (e.g. with `tfds build cifar10 --data_dir=DIR` on a
networked machine). With `data_dir=None` TFDS uses its default directory and
downloads on a miss.
"""

import contextlib
import dataclasses
import zlib
from collections.abc import Iterator
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import partition
from tasks.errors import MissingDataError


@dataclasses.dataclass(frozen=True)
class ImageDatasetSpec:
  """Where a dataset lives in TFDS and what its labels look like.

  Attributes:
    display_name: Human-readable name, for messages.
    tfds_name: The TFDS name (with config), e.g. 'emnist/letters'.
    num_classes: Number of classes after `label_offset` is removed.
    label_offset: TFDS label of class 0.
    image_shape: Shape of one image, `(height, width, channels)`.
  """

  display_name: str
  tfds_name: str
  num_classes: int
  label_offset: int
  image_shape: tuple[int, int, int]


IMAGE_DATASETS: dict[str, ImageDatasetSpec] = {
    'emnist_l': ImageDatasetSpec(
        'EMNIST-L', 'emnist/letters', 26, 1, (28, 28, 1)
    ),
    'cifar10': ImageDatasetSpec('CIFAR-10', 'cifar10', 10, 0, (32, 32, 3)),
    'cifar100': ImageDatasetSpec('CIFAR-100', 'cifar100', 100, 0, (32, 32, 3)),
}


_READ_CHUNK_SIZE = 10_000


def load_image_dataset(
    name: str, *, data_dir: Optional[str] = None
) -> tuple[partition.CentralizedSplit, partition.CentralizedSplit]:
  """Loads the train and test splits of one of `IMAGE_DATASETS`.

  Args:
    name: 'emnist_l', 'cifar10' or 'cifar100'.
    data_dir: Directory TFDS prepared the dataset in; nothing is downloaded.
      None: TFDS's default directory, downloading on a miss.

  Returns:
    The `(train, test)` splits: `x` holds `uint8` images
    `[N, height, width, channels]`, `y` labels `0..num_classes-1`.

  Raises:
    ValueError: If `name` is unknown or a label is out of range.
    MissingDataError: If the dataset is not in `data_dir` (or could not be
      downloaded when `data_dir` is None).
  """
  if name not in IMAGE_DATASETS:
    raise ValueError(
        f'Unknown image dataset {name!r}; expected one of'
        f' {sorted(IMAGE_DATASETS)}.'
    )
  spec = IMAGE_DATASETS[name]
  try:
    splits = tfds.load(
        spec.tfds_name,
        split=['train', 'test'],
        as_supervised=True,
        data_dir=data_dir,
        download=data_dir is None,
    )
  except AssertionError as error:  # TFDS's "could not find data in DIR".
    raise MissingDataError(
        _missing_data_message(spec, f'not found in {data_dir}')
    ) from error
  except OSError as error:  # The download failed (e.g. no network).
    raise MissingDataError(
        _missing_data_message(
            spec, 'not found locally and could not be downloaded'
        )
    ) from error
  return tuple(_to_labelled_images(spec, split) for split in splits)


def _missing_data_message(spec: ImageDatasetSpec, problem: str) -> str:
  return (
      f"{spec.display_name} (TFDS '{spec.tfds_name}') {problem}. On a"
      f' networked machine run `tfds build {spec.tfds_name} --data_dir=DIR`'
      f" (or tfds.load('{spec.tfds_name}', data_dir=DIR)), copy DIR here and"
      ' pass --data_dir=DIR (data_dir=DIR).'
  )


def _to_labelled_images(
    spec: ImageDatasetSpec, split: tf.data.Dataset
) -> partition.CentralizedSplit:
  """Reads a split of `(image, label)` pairs into arrays, in chunks."""
  # Not `tfds.load(batch_size=-1)`: it batches by the split size recorded in
  # the dataset's metadata, which mocked datasets do not have.
  chunks = list(tfds.as_numpy(split.batch(_READ_CHUNK_SIZE)))
  images = np.concatenate([chunk_images for chunk_images, _ in chunks])
  tfds_labels = np.concatenate([chunk_labels for _, chunk_labels in chunks])
  labels = tfds_labels.astype(np.int32) - spec.label_offset
  out_of_range = labels[(labels < 0) | (labels >= spec.num_classes)]
  if out_of_range.size:
    raise ValueError(
        f'{spec.display_name} has label'
        f' {out_of_range[0] + spec.label_offset} outside'
        f' {spec.label_offset}..{spec.label_offset + spec.num_classes - 1}.'
    )
  return partition.CentralizedSplit(x=images, y=labels)


@contextlib.contextmanager
def mock_image_data(num_examples: int) -> Iterator[None]:
  """Makes `load_image_dataset` return random data, without any files.

  Wraps `tfds.testing.mock_data`, generating random images and labels drawn
  from each dataset's real label range (TFDS's generic mock draws EMNIST-L
  labels from its 37 declared classes).

  Args:
    num_examples: Number of examples in each split.

  Yields:
    Nothing; `load_image_dataset` calls inside the block are mocked.
  """

  def random_split(builder, split, decoders=None, read_config=None,
                   shuffle_files=False) -> tf.data.Dataset:
    del decoders, read_config, shuffle_files  # Unused by random data.
    spec = next(
        spec for spec in IMAGE_DATASETS.values()
        if builder.info.full_name.startswith(spec.tfds_name + '/')
    )
    rng = np.random.default_rng(zlib.crc32(str(split).encode()))
    return tf.data.Dataset.from_tensor_slices({
        'image': rng.integers(
            0, 256, (num_examples, *spec.image_shape), dtype=np.uint8
        ),
        'label': rng.integers(
            spec.label_offset, spec.label_offset + spec.num_classes,
            num_examples,
        ),
    })

  with tfds.testing.mock_data(
      num_examples=num_examples, as_dataset_fn=random_split
  ):
    yield
