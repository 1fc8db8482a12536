"""Tests for tasks/partition.py: AdaBest/FedDyn client partitions."""

import collections

import numpy as np
import pytest
from scipy import stats
import tensorflow as tf

from tasks import partition


def _balanced_labels(num_classes: int, per_class: int) -> np.ndarray:
  return np.repeat(np.arange(num_classes), per_class)


def _all_clients(result: partition.Partition) -> dict[str, np.ndarray]:
  return {**result.train_clients, **result.validation_clients}


def _label_frequencies(labels: np.ndarray, indices: np.ndarray,
                       num_classes: int) -> np.ndarray:
  return np.bincount(labels[indices], minlength=num_classes) / len(indices)


@pytest.mark.parametrize('dirichlet_alpha', [None, 0.3])
@pytest.mark.parametrize('unbalanced_sigma', [0.0, 0.3])
def test_every_example_goes_to_exactly_one_client(dirichlet_alpha,
                                                  unbalanced_sigma):
  labels = np.random.default_rng(0).integers(0, 7, size=3_001)
  result = partition.partition_dataset(
      labels, num_clients=40, dirichlet_alpha=dirichlet_alpha,
      unbalanced_sigma=unbalanced_sigma, partition_seed=3)
  all_indices = np.concatenate(list(_all_clients(result).values()))
  np.testing.assert_array_equal(np.sort(all_indices), np.arange(labels.size))


def test_balanced_sizes_differ_by_at_most_one_example():
  result = partition.partition_dataset(
      np.zeros(1_003, dtype=np.int64), num_clients=20,
      num_validation_clients=2)
  sizes = [len(v) for v in _all_clients(result).values()]
  assert max(sizes) - min(sizes) == 1  # 1003 = 22 * 45 + 13.
  assert sum(sizes) == 1_003
  # The 13 remainder examples go one each to the first 13 clients.
  assert [len(result.train_clients[str(k)]) for k in range(20)] == (
      [46] * 13 + [45] * 7)


def test_validation_clients_are_ten_percent_and_disjoint():
  result = partition.partition_dataset(
      _balanced_labels(10, 110), num_clients=100, dirichlet_alpha=0.3)
  assert sorted(result.train_clients) == sorted(str(k) for k in range(100))
  assert sorted(result.validation_clients) == sorted(
      f'validation_{k}' for k in range(10))
  train = np.concatenate(list(result.train_clients.values()))
  validation = np.concatenate(list(result.validation_clients.values()))
  assert not set(train) & set(validation)
  assert len(train) + len(validation) == 1_100


@pytest.mark.parametrize('dirichlet_alpha', [None, 0.3])
def test_same_seed_same_partition_other_seed_another(dirichlet_alpha):
  labels = _balanced_labels(5, 200)

  def make(seed):
    return partition.partition_dataset(
        labels, num_clients=10, dirichlet_alpha=dirichlet_alpha,
        unbalanced_sigma=0.3, partition_seed=seed)

  first, again, other = make(4), make(4), make(5)
  for client_id, indices in _all_clients(first).items():
    np.testing.assert_array_equal(indices, _all_clients(again)[client_id])
  assert any(
      not np.array_equal(indices, _all_clients(other)[client_id])
      for client_id, indices in _all_clients(first).items())


def test_log_normal_sizes_have_requested_spread():
  result = partition.partition_dataset(
      np.zeros(400_000, dtype=np.int64), num_clients=2_000,
      num_validation_clients=0, unbalanced_sigma=0.3)
  log_sizes = np.log([len(v) for v in result.train_clients.values()])
  # The standard deviation of 2,000 log-normal draws is within ~0.01 of
  # sigma; rounding to whole examples (mean 200) adds ~0.003.
  assert abs(log_sizes.std() - 0.3) < 0.03
  assert stats.skew(np.exp(log_sizes)) > 0.5  # Log-normal: right-skewed.


def test_iid_clients_follow_the_dataset_label_distribution():
  labels = np.concatenate([np.zeros(6_000, np.int64), np.ones(2_000, np.int64),
                           np.full(2_000, 2, np.int64)])
  result = partition.partition_dataset(labels, num_clients=20,
                                       num_validation_clients=0)
  assert result.label_proportions is None
  for indices in result.train_clients.values():
    frequencies = _label_frequencies(labels, indices, 3)
    # 500 examples per client: 5 standard errors of a frequency is <= 0.11.
    np.testing.assert_allclose(frequencies, [0.6, 0.2, 0.2], atol=0.11)


def test_large_alpha_gives_near_uniform_clients():
  labels = _balanced_labels(10, 2_000)
  result = partition.partition_dataset(
      labels, num_clients=40, num_validation_clients=0,
      dirichlet_alpha=1_000.0)
  for indices in result.train_clients.values():
    # 500 examples: a frequency's standard error is 0.013.
    np.testing.assert_allclose(
        _label_frequencies(labels, indices, 10), 0.1, atol=0.07)


def _fraction_dominated_by_two_labels(dirichlet_alpha: float) -> float:
  labels = _balanced_labels(10, 2_000)
  result = partition.partition_dataset(
      labels, num_clients=100, dirichlet_alpha=dirichlet_alpha)
  top_two_shares = [
      np.sort(_label_frequencies(labels, indices, 10))[-2:].sum()
      for indices in _all_clients(result).values()
  ]
  for proportions in result.label_proportions.values():
    assert proportions.shape == (10,)
    assert proportions.sum() == pytest.approx(1.0)
  return np.mean(np.array(top_two_shares) >= 0.9)


def test_small_alpha_clients_are_dominated_by_one_or_two_labels():
  assert _fraction_dominated_by_two_labels(0.03) > 0.5
  assert _fraction_dominated_by_two_labels(1.0) < 0.1


def test_realized_label_proportions_match_the_drawn_ones():
  labels = _balanced_labels(10, 4_000)
  result = partition.partition_dataset(
      labels, num_clients=100, num_validation_clients=0, dirichlet_alpha=1.0,
      partition_seed=1)
  client_ids = list(result.train_clients)
  own, others, within_error = [], [], []
  for position, client_id in enumerate(client_ids):
    indices = result.train_clients[client_id]
    realized = _label_frequencies(labels, indices, 10)
    drawn = result.label_proportions[client_id]
    other = result.label_proportions[client_ids[position - 1]]
    own.append(np.abs(realized - drawn).sum() / 2)
    others.append(np.abs(realized - other).sum() / 2)
    standard_error = np.sqrt(drawn * (1 - drawn) / len(indices))
    within_error.append(
        np.all(np.abs(realized - drawn) <= 4 * standard_error + 1e-3))
  # Clients filled after a label ran out deviate (FedDyn's construction);
  # the bulk follows its draw within sampling error.
  assert np.mean(within_error) > 0.75
  assert np.median(own) < 0.25 * np.median(others)


def _feddyn_rejection_sampling(labels, sizes, proportions, rng):
  """FedDyn's `utils_dataset.py` Dirichlet loop, literally (reference)."""
  cumulative = np.cumsum(proportions, axis=1)
  by_label = [np.flatnonzero(labels == c) for c in range(proportions.shape[1])]
  unused = [len(pool) for pool in by_label]
  remaining = np.array(sizes)
  clients = [[] for _ in sizes]
  while remaining.sum() != 0:
    client = rng.integers(len(sizes))
    if remaining[client] <= 0:
      continue
    remaining[client] -= 1
    while True:
      label = np.argmax(rng.random() <= cumulative[client])
      if unused[label] <= 0:
        continue
      unused[label] -= 1
      clients[client].append(by_label[label][unused[label]])
      break
  return clients


def test_dirichlet_assignment_has_feddyn_rejection_sampling_distribution():
  # Unequal sizes: drawing the client in proportion to its free places
  # instead of uniformly among open clients fails this test (p ~ 1e-20).
  labels = np.array([0] * 6 + [1] * 6)
  sizes = np.array([1, 3, 8])
  proportions = np.array([[0.875, 0.125], [0.5, 0.5], [0.25, 0.75]])
  num_runs = 1_500
  rng = np.random.default_rng(0)
  ours = collections.Counter()
  reference = collections.Counter()
  for _ in range(num_runs):
    for client, indices in enumerate(
        partition._assign_by_label_proportions(labels, sizes, proportions,
                                               rng)):
      ours[client, int(np.sum(labels[indices] == 0))] += 1
    for client, indices in enumerate(
        _feddyn_rejection_sampling(labels, sizes, proportions, rng)):
      reference[client, int(np.sum(labels[indices] == 0))] += 1
  for client, size in enumerate(sizes):
    table = np.array([[ours[client, zeros] for zeros in range(size + 1)],
                      [reference[client, zeros] for zeros in range(size + 1)]])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] > 1:
      assert stats.chi2_contingency(table)[1] > 1e-3, (client, table)


@pytest.mark.parametrize('kwargs, message', [
    (dict(num_clients=0), 'num_clients'),
    (dict(num_validation_clients=-1), 'num_validation_clients'),
    (dict(dirichlet_alpha=0.0), 'dirichlet_alpha'),
    (dict(unbalanced_sigma=-0.1), 'unbalanced_sigma'),
    (dict(partition_seed=-1), 'partition_seed'),
    (dict(num_clients=200), 'at least one example'),
])
def test_bad_arguments_raise_value_error(kwargs, message):
  with pytest.raises(ValueError, match=message):
    partition.partition_dataset(np.zeros(100, dtype=np.int64), **kwargs)


@pytest.mark.parametrize('labels', [
    np.array([0.0, 1.0]), np.array([[0, 1]]), np.array([0, -1])])
def test_bad_labels_raise_value_error(labels):
  with pytest.raises(ValueError, match='labels'):
    partition.partition_dataset(labels, num_clients=1)


def _tiny_client_data():
  examples = collections.OrderedDict(
      x=np.arange(20, dtype=np.float32).reshape(10, 2),
      y=np.arange(10, dtype=np.int32))
  indices = {'a': np.array([3, 1]), 'b': np.array([0, 9, 4]),
             'c': np.array([7])}
  return examples, indices, partition.create_client_data(examples, indices)


def test_client_data_holds_each_clients_examples():
  examples, indices, client_data = _tiny_client_data()
  assert client_data.client_ids == ['a', 'b', 'c']
  for client_id, client_indices in indices.items():
    elements = list(client_data.create_tf_dataset_for_client(client_id))
    np.testing.assert_array_equal([e['y'] for e in elements],
                                  examples['y'][client_indices])
    np.testing.assert_array_equal([e['x'] for e in elements],
                                  examples['x'][client_indices])
  assert client_data.element_type_structure == collections.OrderedDict(
      x=tf.TensorSpec([2], tf.float32), y=tf.TensorSpec([], tf.int32))


def test_traced_lookup_gives_the_same_examples():
  _, indices, client_data = _tiny_client_data()
  # `create_tf_dataset_from_all_clients` traces the dataset function.
  pooled = [int(e['y'])
            for e in client_data.create_tf_dataset_from_all_clients()]
  assert sorted(pooled) == sorted(np.concatenate(list(indices.values())))
  assert len(pooled) == 6


def test_client_dataset_serializes_only_the_clients_examples():
  big = np.random.default_rng(0).integers(0, 255, (2_000, 32, 32, 3),
                                          dtype=np.uint8)
  examples = collections.OrderedDict(x=big, y=np.zeros(2_000, np.int32))
  client_data = partition.create_client_data(
      examples, {'small': np.arange(10), 'rest': np.arange(10, 2_000)})
  dataset = client_data.create_tf_dataset_for_client('small')
  serialized_bytes = len(dataset._as_serialized_graph().numpy())
  assert serialized_bytes < 2 * 10 * 32 * 32 * 3 + 10_000
  assert serialized_bytes < big.nbytes / 50


def test_client_data_rejects_mismatched_arrays():
  with pytest.raises(ValueError, match='same length'):
    partition.create_client_data(
        {'x': np.zeros(3), 'y': np.zeros(4)}, {'a': np.array([0])})
  with pytest.raises(ValueError, match='at least one client'):
    partition.create_client_data({'x': np.zeros(3)}, {})
