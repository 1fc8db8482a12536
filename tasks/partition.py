"""Partitions a centralized labelled dataset over simulated clients.

This is the data protocol of AdaBest (Varno et al. 2022, Section 4 and
supplementary D), which follows FedDyn (Acar et al. 2021) and its public code
(`utils_dataset.py`, `DatasetObject`):

* The training split is divided between `num_clients` training clients and
  `num_validation_clients` validation clients (AdaBest: 10 % of the training
  clients, e.g. 1,100 partitions of which 1,000 train). All of them are
  partitioned together by the same rule; the validation clients are the last
  `num_validation_clients` partitions. Every example goes to exactly one
  client.
* Client sizes: FedDyn draws `n_k ~ LogNormal(log(N/K), sigma)` and rescales
  them to sum to the `N` examples (`sigma = 0`: balanced, AdaBest's
  unbalanced setting: `sigma = 0.3`). Rounding: each client gets the floor of
  its share and the `r < K` examples left over go one each to the `r` clients
  with the largest fractional parts (ties: lowest client index first), so
  balanced clients differ by at most one example. FedDyn's code instead drops
  the remainder (balanced) or gives all of it to client 0 (unbalanced), which
  for CIFAR over 1,100 clients makes client 0 twelve times larger than the
  others.
* IID: the examples are shuffled and cut into consecutive blocks of those
  sizes (FedDyn's 'iid' rule).
* Dirichlet label skew (FedDyn's 'Drichlet' rule, not the per-class
  construction of Hsu et al. 2019): every client draws its own label
  proportions `p_k ~ Dir(alpha * 1_C)`. Then, one example at a time, a client
  that is not yet full is chosen uniformly at random and given an unused
  example of a label drawn from `p_k` restricted to the labels that still
  have unused examples. FedDyn realizes the two uniform choices by rejection
  sampling (redraw a full client, redraw an exhausted label); drawing directly
  among the open clients and the remaining labels gives the same
  distribution in a fraction of the time. Clients filled after a label ran
  out hold proportions that deviate from their draw. When every label a
  client's draw puts mass on is exhausted (FedDyn's loop would never end),
  the label is drawn in proportion to the unused examples of each label.

All randomness comes from `numpy.random.default_rng(partition_seed)`, so a
seed fixes the partition (it does not reproduce FedDyn's own partitions, which
use NumPy's global generator).
"""

import bisect
import collections
import dataclasses
from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

VALIDATION_CLIENT_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class CentralizedSplit:
  """One split of a centralized labelled dataset.

  Attributes:
    x: Inputs, first axis indexing the examples (e.g. `uint8` images).
    y: `int32` labels `0..num_classes-1`, shape `[N]`.
  """

  x: np.ndarray
  y: np.ndarray


@dataclasses.dataclass(frozen=True)
class Partition:
  """Which examples of a centralized dataset each client holds.

  Attributes:
    train_clients: Training client id -> indices of its examples.
    validation_clients: Validation client id -> indices of its examples.
    label_proportions: Client id (training and validation) -> the label
      proportions drawn for it from the Dirichlet distribution; None for IID.
  """

  train_clients: dict[str, np.ndarray]
  validation_clients: dict[str, np.ndarray]
  label_proportions: Optional[dict[str, np.ndarray]]


def partition_dataset(
    labels: np.ndarray,
    *,
    num_clients: int = 100,
    num_validation_clients: Optional[int] = None,
    dirichlet_alpha: Optional[float] = None,
    unbalanced_sigma: float = 0.0,
    partition_seed: int = 0,
) -> Partition:
  """Splits a dataset's examples between training and validation clients.

  See the module docstring for the exact construction.

  Args:
    labels: The integer label of every example of the dataset, shape `[N]`;
      labels are `0..C-1` with `C = max(labels) + 1`.
    num_clients: Number of training clients.
    num_validation_clients: Number of validation clients, drawn from the same
      data; None means `round(0.1 * num_clients)` (AdaBest's 10 %).
    dirichlet_alpha: Concentration of the per-client label proportions
      `Dir(alpha)`; None partitions IID.
    unbalanced_sigma: Sigma of the log-normal client sizes; 0 is balanced.
    partition_seed: Seed of the partition.

  Returns:
    A `Partition`. Training client ids are '0'...'K-1' and validation client
    ids 'validation_0'...; the index arrays are disjoint and together hold
    every index `0..N-1` exactly once.

  Raises:
    ValueError: If an argument is out of range, `labels` is not a 1-D array
      of non-negative integers, or the dataset is too small for every client
      to get at least one example.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
        'labels must be a 1-D integer array, got shape'
        f' {labels.shape} and dtype {labels.dtype}.'
    )
  if labels.size and labels.min() < 0:
    raise ValueError(f'labels must be non-negative, found {labels.min()}.')
  if not isinstance(num_clients, int) or num_clients < 1:
    raise ValueError(f'num_clients must be a positive int, got {num_clients}.')
  if num_validation_clients is None:
    num_validation_clients = round(VALIDATION_CLIENT_FRACTION * num_clients)
  if not isinstance(num_validation_clients, int) or num_validation_clients < 0:
    raise ValueError(
        'num_validation_clients must be a non-negative int, got'
        f' {num_validation_clients}.'
    )
  if dirichlet_alpha is not None and not dirichlet_alpha > 0:
    raise ValueError(
        f'dirichlet_alpha must be positive or None, got {dirichlet_alpha}.'
    )
  if not unbalanced_sigma >= 0:
    raise ValueError(
        f'unbalanced_sigma must be non-negative, got {unbalanced_sigma}.'
    )
  if not isinstance(partition_seed, int) or partition_seed < 0:
    raise ValueError(
        f'partition_seed must be a non-negative int, got {partition_seed}.'
    )
  total_clients = num_clients + num_validation_clients
  rng = np.random.default_rng(partition_seed)
  sizes = _client_sizes(labels.size, total_clients, unbalanced_sigma, rng)
  if dirichlet_alpha is None:
    label_proportions = None
    boundaries = np.cumsum(sizes)[:-1]
    client_indices = np.split(rng.permutation(labels.size), boundaries)
  else:
    num_classes = int(labels.max()) + 1
    label_proportions = rng.dirichlet(
        [dirichlet_alpha] * num_classes, size=total_clients
    )
    client_indices = _assign_by_label_proportions(
        labels, sizes, label_proportions, rng
    )
  client_ids = [str(k) for k in range(num_clients)] + [
      f'validation_{k}' for k in range(num_validation_clients)
  ]
  return Partition(
      train_clients=dict(zip(client_ids[:num_clients], client_indices)),
      validation_clients=dict(
          zip(client_ids[num_clients:], client_indices[num_clients:])
      ),
      label_proportions=(
          None
          if label_proportions is None
          else dict(zip(client_ids, label_proportions))
      ),
  )


def _client_sizes(
    num_examples: int,
    num_clients: int,
    sigma: float,
    rng: np.random.Generator,
) -> np.ndarray:
  """Log-normal client sizes summing to `num_examples` (largest remainder)."""
  # FedDyn draws LogNormal(log(N/K), sigma); the location cancels out in the
  # rescaling below.
  weights = rng.lognormal(mean=0.0, sigma=sigma, size=num_clients)
  shares = weights * (num_examples / weights.sum())
  sizes = np.floor(shares).astype(np.int64)
  remainder = num_examples - int(sizes.sum())
  largest_fractions = np.argsort(-(shares - sizes), kind='stable')
  sizes[largest_fractions[:remainder]] += 1
  if sizes.min() < 1:
    raise ValueError(
        f'{num_examples} examples cannot give each of {num_clients} clients at'
        f' least one example (unbalanced_sigma={sigma}); use fewer clients.'
    )
  return sizes


def _assign_by_label_proportions(
    labels: np.ndarray,
    sizes: np.ndarray,
    label_proportions: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
  """FedDyn's one-example-at-a-time Dirichlet assignment (module docstring)."""
  num_classes = label_proportions.shape[1]
  unused_by_label = [
      rng.permutation(np.flatnonzero(labels == label))
      for label in range(num_classes)
  ]
  unused_counts = np.array([len(pool) for pool in unused_by_label])
  client_indices = [np.empty(size, dtype=np.int64) for size in sizes]
  filled = np.zeros(len(sizes), dtype=np.int64)
  open_clients = list(range(len(sizes)))

  def cumulative_proportions() -> list[list[float]]:
    # Python lists: `bisect` on a list is far cheaper per draw than NumPy.
    available = unused_counts > 0
    return np.cumsum(label_proportions * available, axis=1).tolist()

  cumulative = cumulative_proportions()
  uniforms = rng.random((labels.size, 2)).tolist()
  for client_draw, label_draw in uniforms:
    slot = min(int(client_draw * len(open_clients)), len(open_clients) - 1)
    client = open_clients[slot]
    if cumulative[client][-1] > 0:
      label = _draw_index(cumulative[client], label_draw)
    else:
      label = _draw_index(np.cumsum(unused_counts).tolist(), label_draw)
    unused_counts[label] -= 1
    client_indices[client][filled[client]] = (
        unused_by_label[label][unused_counts[label]]
    )
    filled[client] += 1
    if filled[client] == sizes[client]:
      open_clients[slot] = open_clients[-1]
      open_clients.pop()
    if unused_counts[label] == 0:
      cumulative = cumulative_proportions()
  return client_indices


def _draw_index(cumulative_weights: list[float], uniform: float) -> int:
  """Index `i` drawn with probability proportional to its weight.

  Args:
    cumulative_weights: Running sums of non-negative weights, last one > 0.
    uniform: A draw from U[0, 1).

  Returns:
    An index whose weight is positive.
  """
  last_positive = bisect.bisect_left(cumulative_weights, cumulative_weights[-1])
  target = uniform * cumulative_weights[-1]
  # `min` guards the rounding case `target == total`.
  return min(bisect.bisect_right(cumulative_weights, target), last_positive)


def create_client_data(
    examples: Mapping[str, np.ndarray],
    client_indices: Mapping[str, np.ndarray],
) -> tff.simulation.datasets.ClientData:
  """A `ClientData` whose client `c` holds `examples[..][client_indices[c]]`.

  The centralized arrays are shared, not copied per client: a client's
  examples are gathered when its dataset is created. Called with a Python
  string (as `create_tf_dataset_for_client` does, eagerly), the dataset is
  built from just that client's slice, so serializing it (TFF does, to pass
  it to a computation) costs only the client's data. Traced with a string
  tensor (`create_tf_dataset_from_all_clients`, `dataset_computation`), the
  lookup runs in TensorFlow on constants holding the whole dataset.

  Args:
    examples: Feature name -> array whose first axis indexes the examples
      (e.g. `{'x': images, 'y': labels}`).
    client_indices: Client id -> indices into the first axis of `examples`,
      e.g. `Partition.train_clients`.

  Returns:
    A `tff.simulation.datasets.ClientData` whose elements are
    `OrderedDict`s with the keys of `examples`.

  Raises:
    ValueError: If `client_indices` is empty or the arrays in `examples` do
      not all have the same number of examples.
  """
  if not client_indices:
    raise ValueError('client_indices must name at least one client.')
  examples = collections.OrderedDict(
      (name, np.asarray(array)) for name, array in examples.items()
  )
  num_examples = {name: len(array) for name, array in examples.items()}
  if len(set(num_examples.values())) != 1:
    raise ValueError(
        f'All arrays in examples need the same length, got {num_examples}.'
    )
  client_ids = list(client_indices)
  flat_indices = np.concatenate([client_indices[c] for c in client_ids])
  offsets = np.concatenate(
      [[0], np.cumsum([len(client_indices[c]) for c in client_ids])]
  )

  # Made once, outside the function (as in
  # `tasks.array_client_data.ArrayClientData`): captured by reference, not
  # copied each time the function runs.
  tensors = None

  def serializable_dataset_fn(client_id) -> tf.data.Dataset:
    nonlocal tensors
    if tf.executing_eagerly():
      if tf.is_tensor(client_id):
        client_id = client_id.numpy().decode()
      indices = client_indices[client_id]
      client_examples = collections.OrderedDict(
          (name, array[indices]) for name, array in examples.items()
      )
    else:
      def make_tensors():
        return (tf.constant(client_ids), tf.constant(offsets),
                tf.constant(flat_indices),
                collections.OrderedDict((name, tf.constant(array))
                                        for name, array in examples.items()))

      with tf.init_scope():  # Eager tensors can be captured by any graph.
        if tensors is None and tf.executing_eagerly():
          tensors = make_tensors()
      ids_tensor, offsets_tensor, indices_tensor, example_tensors = (
          tensors if tensors is not None else make_tensors())
      position = tf.argmax(
          tf.cast(tf.equal(ids_tensor, client_id), tf.int32)
      )
      indices = indices_tensor[
          offsets_tensor[position] : offsets_tensor[position + 1]
      ]
      client_examples = collections.OrderedDict(
          (name, tf.gather(tensor, indices))
          for name, tensor in example_tensors.items()
      )
    return tf.data.Dataset.from_tensor_slices(client_examples)

  client_data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      client_ids, serializable_dataset_fn
  )
  # What `fl_engine.shards.shards_for_round` reads to batch clients in
  # NumPy (as `tasks.synthetic`'s clients offer): the shared arrays and each
  # client's rows of them.
  client_data.arrays = examples
  client_data.client_rows = lambda client_id: client_indices[client_id]
  return client_data
