"""EMNIST-L, CIFAR-10 and CIFAR-100 from TensorFlow Datasets as NumPy arrays.

These are the centralized datasets AdaBest (Varno et al. 2022, Section 4)
partitions over clients (see `tasks.partition`). Images stay `uint8` in
memory (CIFAR's training split is 150 MB as bytes, 600 MB as floats);
normalization happens in the task's `tf.data` pipeline.

EMNIST-L is TFDS's `emnist/letters`: 26 letter classes stored as labels
1..26 (TFDS declares 37 classes, tensorflow/datasets#2579), shifted here to
0..25. FedDyn's code keeps only the first 10 letters; AdaBest's text and this
package use all 26.

Data are fetched on first use (`prepare_image_dataset`), into `data_dir` or
TFDS's default directory (`~/tensorflow_datasets`, `$TFDS_DATA_DIR`): the
source archive TFDS's builder reads is downloaded by `tasks.data_files`
(atomically, resumable, with a progress bar, from a mirror if one is set),
checked against the size and sha256 TFDS registers for it, and kept in
`<data_dir>/downloads/manual/`, where TFDS's builder finds it instead of
downloading; the builder then prepares the dataset into a temporary
directory it renames when done. A run killed at any moment leaves no
prepared dataset behind, only a `.part` to resume or an `.incomplete`
directory TFDS ignores.
"""

import contextlib
import dataclasses
import os
import sys
import zlib
from collections.abc import Iterator
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import data_files
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
    data_dir: TFDS's data directory; None: TFDS's default. The dataset is
      downloaded and prepared there on first use (`prepare_image_dataset`).

  Returns:
    The `(train, test)` splits: `x` holds `uint8` images
    `[N, height, width, channels]`, `y` labels `0..num_classes-1`.

  Raises:
    ValueError: If `name` is unknown or a label is out of range.
    MissingDataError: If the dataset is not prepared and cannot be
      downloaded, or its cached archive is not whole (`CorruptDataError`).
  """
  if not _tfds_is_mocked():
    prepare_image_dataset(name, data_dir=data_dir)
  spec = IMAGE_DATASETS[name]
  splits = tfds.load(spec.tfds_name, split=['train', 'test'],
                     as_supervised=True, data_dir=data_dir, download=False)
  return tuple(_to_labelled_images(spec, split) for split in splits)


def _tfds_is_mocked() -> bool:
  """Whether `tfds.testing.mock_data` is active (it replaces the builder's
  preparation, and its data need none)."""
  prepare = tfds.core.DatasetBuilder.download_and_prepare
  return prepare.__module__.startswith('tensorflow_datasets.testing')


def _source_files(builder: tfds.core.DatasetBuilder) -> dict[
    str, tfds.core.download.checksums.UrlInfo]:
  """The archives the builder downloads: `{url: UrlInfo(size, checksum,
  filename)}`, as TFDS registers them."""
  return builder.url_infos


def prepare_image_dataset(name: str, *, data_dir: Optional[str] = None
                          ) -> str:
  """Makes sure TFDS has prepared `name` in `data_dir`; returns the directory.

  Downloads its source archive(s) unless they are in
  `<data_dir>/downloads/manual/` already (unless offline, see
  `tasks.data_files.configure`), checks each against TFDS's registered size
  and sha256, and runs TFDS's preparation from them.

  Raises:
    ValueError: If `name` is unknown.
    MissingDataError: The dataset is not prepared and an archive cannot be
      downloaded (or offline); `CorruptDataError`: an archive is not whole.
  """
  if name not in IMAGE_DATASETS:
    raise ValueError(
        f'Unknown image dataset {name!r}; expected one of'
        f' {sorted(IMAGE_DATASETS)}.'
    )
  spec = IMAGE_DATASETS[name]
  builder = tfds.builder(spec.tfds_name, data_dir=data_dir)
  # builder.data_dir is <root>/<name>[/<config>]/<version>.
  root = str(builder.data_dir)
  for _ in range(spec.tfds_name.count('/') + 2):
    root = os.path.dirname(root)
  if builder.is_prepared():
    return root
  manual_dir = os.path.join(root, 'downloads', 'manual')
  sources = _source_files(builder)
  missing = [info.filename for info in sources.values()
             if not os.path.isfile(os.path.join(manual_dir, info.filename))]
  if missing and data_files.is_offline():
    raise MissingDataError(_missing_data_message(
        spec, f'is not prepared in {root} and its source'
        f' {", ".join(missing)} is not in {manual_dir}'))
  for url, info in sources.items():
    path = os.path.join(manual_dir, info.filename)
    if os.path.isfile(path):
      problem = data_files.published_file_problem(
          path, info.size, info.checksum)
      if problem:
        raise data_files.CorruptDataError(
            f'{path} is not a complete copy of {spec.display_name}\'s source'
            f' ({problem}); delete it and rerun to download it again')
      continue
    os.makedirs(manual_dir, exist_ok=True)
    try:
      data_files.fetch_published_file(
          data_files.source_url(url, info.filename), path,
          size=info.size, sha256=info.checksum)
    except data_files.DownloadError as e:
      raise MissingDataError(_missing_data_message(
          spec, f'could not be downloaded ({e})')) from e
  if not data_files.show_progress():
    tfds.disable_progress_bar()
  # TFDS prints its progress to stdout; stdout is for results.
  with contextlib.redirect_stdout(sys.stderr):
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return root


def _missing_data_message(spec: ImageDatasetSpec, problem: str) -> str:
  return (
      f"{spec.display_name} (TFDS '{spec.tfds_name}') {problem}. Rerun with"
      f' network (or a mirror in ${data_files.MIRROR_ENV}), or on a networked'
      ' machine run `python -m tasks.prepare_data --task=TASK'
      ' --data_dir=DIR`, copy DIR here and pass --data_dir=DIR.'
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
