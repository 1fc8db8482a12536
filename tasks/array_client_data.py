"""Clients whose examples are consecutive rows of shared NumPy arrays.

The in-memory tasks (`tasks.synthetic`, `tasks.leaf_shakespeare`) keep every
client's examples in one array per feature, client after client, and hand
TFF an `ArrayClientData` over them. Two things make that worth a class:

* `tff.simulation.datasets.TestClientData` would bake every client into its
  serializable dataset function (one graph branch per client, retraced per
  client id), which makes centralized data and dataset computations slow at
  1,000 clients; here that function slices one array instead.
* The fused rounds (`fl_engine.shards.shards_for_round`,
  `fl_engine.resident`) read `arrays` and `client_rows` to build a round's
  shards in NumPy, without a tf.data pipeline per client.

A client id starts with the decimal index of its rows' block (`'0007'`, or
`'0007_hamlet_Ham'`: the digits before the first `_`), so that the
serializable dataset function finds the rows from the id string alone.
"""

import collections
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import validation_split


def client_index(client_id: str) -> int:
  """The block index a client id starts with (module docstring)."""
  return int(client_id.split('_', 1)[0])


class ArrayClientData(tff.simulation.datasets.ClientData):
  """Clients whose examples are consecutive rows of shared arrays.

  The client whose id starts with index `i` (`client_index`) owns rows
  `offsets[i]:offsets[i + 1]` of every array. `client_ids` may be a subset
  of the blocks (a validation split shares the training arrays).
  """

  def __init__(self, arrays: Mapping[str, np.ndarray], offsets: np.ndarray,
               client_ids: Sequence[str]):
    self._arrays = collections.OrderedDict(arrays)
    self._offsets = np.asarray(offsets)
    self._client_ids = list(client_ids)
    self._client_id_set = frozenset(self._client_ids)
    self._element_type_structure = collections.OrderedDict(
        (name, tf.TensorSpec(array.shape[1:], tf.as_dtype(array.dtype)))
        for name, array in self._arrays.items())

  @property
  def client_ids(self) -> list[str]:
    return self._client_ids

  @property
  def element_type_structure(self) -> collections.OrderedDict:
    return self._element_type_structure

  @property
  def arrays(self) -> collections.OrderedDict:
    """Every client's examples: client `c` owns rows `client_rows(c)`."""
    return self._arrays

  def _bounds(self, client_id: str) -> tuple[int, int]:
    if client_id not in self._client_id_set:
      raise ValueError(f'no client {client_id!r} in this ClientData')
    index = client_index(client_id)
    return int(self._offsets[index]), int(self._offsets[index + 1])

  def client_rows(self, client_id: str) -> np.ndarray:
    """The rows of `arrays` that client `client_id` owns."""
    return np.arange(*self._bounds(client_id))

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    start, end = self._bounds(client_id)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        (name, array[start:end]) for name, array in self._arrays.items()))

  @property
  def serializable_dataset_fn(self) -> Callable[[str], tf.data.Dataset]:
    # Tensors made once, outside the function: a function traced in a
    # tf.data pipeline (e.g. `fl_engine.shards.shards_from_client_data`)
    # captures them by reference, where constants made inside it would copy
    # every client's examples each time it runs.
    tensors = collections.OrderedDict(
        (name, tf.constant(array)) for name, array in self._arrays.items())
    offsets = tf.constant(self._offsets)

    def dataset_fn(client_id: str) -> tf.data.Dataset:
      index = tf.strings.to_number(
          tf.strings.split(client_id, '_', maxsplit=1)[0], out_type=tf.int32)
      start = tf.gather(offsets, index)
      end = tf.gather(offsets, index + 1)
      return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          (name, tensor[start:end]) for name, tensor in tensors.items()))

    return dataset_fn


def stack_clients(
    clients: Sequence[Mapping[str, np.ndarray]],
) -> tuple[collections.OrderedDict, np.ndarray]:
  """All clients' arrays stacked, and each client's first row (and the
  total, last): the `arrays` and `offsets` of an `ArrayClientData`."""
  offsets = np.cumsum([0] + [len(next(iter(c.values()))) for c in clients])
  names = list(clients[0]) if clients else []
  return collections.OrderedDict(
      (name, np.concatenate([c[name] for c in clients])) for name in names
  ), offsets


def create_preprocess_fn(
    client_spec: tff.simulation.baselines.ClientSpec,
    largest_client: int,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Shuffles, repeats, takes and batches, in the order TFF's tasks do.

  The shuffle buffer is `client_spec.shuffle_buffer_size`, or by default
  `largest_client` (examples of the largest client): a uniform permutation
  per pass. The function then also carries its `batch_recipe` (the fields
  of `fl_engine.shards.BatchRecipe`), so that the fused rounds run the same
  pipeline in NumPy.
  """
  shuffle_buffer_size = client_spec.shuffle_buffer_size or largest_client

  def preprocess_fn(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if shuffle_buffer_size > 1:
      dataset = dataset.shuffle(shuffle_buffer_size)
    if client_spec.num_epochs > 1:
      dataset = dataset.repeat(client_spec.num_epochs)
    if client_spec.max_elements is not None:
      dataset = dataset.take(client_spec.max_elements)
    return dataset.batch(client_spec.batch_size)

  if shuffle_buffer_size <= 1 or shuffle_buffer_size >= largest_client:
    preprocess_fn.batch_recipe = dict(
        batch_size=client_spec.batch_size, num_epochs=client_spec.num_epochs,
        shuffle=shuffle_buffer_size > 1,
        max_elements=client_spec.max_elements)
  return preprocess_fn


def baseline_datasets(
    train: Sequence[Mapping[str, np.ndarray]],
    test: Sequence[Mapping[str, np.ndarray]],
    client_ids: Sequence[str],
    *,
    validation_fraction: float,
    seed: int,
    train_client_spec: tff.simulation.baselines.ClientSpec,
    eval_client_spec: tff.simulation.baselines.ClientSpec,
    largest_client: int,
) -> tff.simulation.baselines.BaselineTaskDatasets:
  """A task's datasets over shared arrays: client `client_ids[i]` holds
  `train[i]` and `test[i]`; `validation_fraction` of the training clients
  (seeded by `seed`, `tasks.validation_split`) are validation clients, on
  the same arrays; the pipelines are `create_preprocess_fn`'s."""
  train_arrays = stack_clients(train)
  if validation_fraction > 0.0:
    train_ids, validation_ids = validation_split.split_client_ids(
        list(client_ids), validation_fraction, seed)
    validation_data = ArrayClientData(*train_arrays, validation_ids)
  else:
    train_ids, validation_data = list(client_ids), None
  return tff.simulation.baselines.BaselineTaskDatasets(
      train_data=ArrayClientData(*train_arrays, train_ids),
      test_data=ArrayClientData(*stack_clients(test), client_ids),
      validation_data=validation_data,
      train_preprocess_fn=create_preprocess_fn(train_client_spec,
                                               largest_client),
      eval_preprocess_fn=create_preprocess_fn(eval_client_spec,
                                              largest_client),
  )
