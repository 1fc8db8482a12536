"""Bytes per client per round, read off the processes' TFF types."""

import numpy as np
import pytest
import tensorflow_federated as tff

from adabest_tff import adabest
from fl_common import communication
from adabest_tff import feddyn
from adabest_tff import scaffold
from tests import tiny_models


def test_type_size_bytes():
  struct = tff.types.to_type([
      tff.TensorType(np.float32, [3, 2]), np.int64,
      [tff.TensorType(np.float64, [4])]])
  assert communication.type_size_bytes(struct) == 3 * 2 * 4 + 8 + 4 * 8
  assert communication.type_size_bytes(
      tff.FederatedType(struct, tff.CLIENTS)) == 64
  with pytest.raises(ValueError, match='shape'):
    communication.type_size_bytes(tff.TensorType(np.float32, [None]))
  with pytest.raises(ValueError, match='str'):
    communication.type_size_bytes(tff.TensorType(np.str_))


def test_type_size_bytes_sums_tensor_sizes():
  value_type = tff.to_type([
      tff.TensorType(np.float32, [3, 2]),
      [tff.TensorType(np.int64), tff.TensorType(np.float16, [5])],
  ])
  assert communication.type_size_bytes(value_type) == 3 * 2 * 4 + 8 + 5 * 2
  federated = tff.FederatedType(tff.TensorType(np.float32, [7]), tff.CLIENTS)
  assert communication.type_size_bytes(federated) == 28


def test_type_size_bytes_rejects_unknown_shapes():
  with pytest.raises(ValueError, match=r'float32\[\?,3\]'):
    communication.type_size_bytes(tff.TensorType(np.float32, [None, 3]))


def test_counts_broadcasts_down_and_aggregations_up():
  class Process:  # only `next` is read

    @tff.federated_computation(
        tff.FederatedType(tff.TensorType(np.float32, [5]), tff.SERVER),
        tff.FederatedType(np.int32, tff.CLIENTS),
        tff.FederatedType(tff.TensorType(np.float32, [2]), tff.CLIENTS))
    def next(server_value, counts, vectors):
      at_clients = tff.federated_broadcast(server_value)
      local = tff.federated_map(
          tff.tensorflow.computation(
              lambda v: v[:2], tff.TensorType(np.float32, [5])), at_clients)
      return (tff.federated_sum(counts), tff.federated_mean(vectors),
              tff.federated_zip((local, vectors)))

  cost = communication.communication_cost(Process)
  assert cost == communication.CommunicationCost(bytes_down=5 * 4,
                                                 bytes_up=4 + 2 * 4)


def test_scaffold_sends_twice_the_model_bytes_of_the_others():
  """The model-sized part of the cost: the difference between two models."""
  builders = {
      'fedavg': lambda m: tff.learning.algorithms.build_weighted_fed_avg(
          m, tff.learning.optimizers.build_sgdm(0.1)),
      'adabest': adabest.build_adabest,
      'feddyn': lambda m: feddyn.build_feddyn(m, population_size=10),
      'scaffold': lambda m: scaffold.build_scaffold(m, population_size=10),
  }
  small, large = 3, 10
  model_bytes_difference = (large - small) * 4  # kernel entries, float32
  differences = {}
  for name, build in builders.items():
    small_cost = communication.communication_cost(
        build(tiny_models.linear_model_fn(small)))
    large_cost = communication.communication_cost(
        build(tiny_models.linear_model_fn(large)))
    differences[name] = (large_cost.bytes_down - small_cost.bytes_down,
                         large_cost.bytes_up - small_cost.bytes_up)
  one_model = (model_bytes_difference, model_bytes_difference)
  assert differences['fedavg'] == one_model
  assert differences['adabest'] == one_model
  assert differences['feddyn'] == one_model
  assert differences['scaffold'] == (2 * model_bytes_difference,
                                     2 * model_bytes_difference)
