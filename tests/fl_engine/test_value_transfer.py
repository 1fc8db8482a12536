"""`fl_engine.value_transfer` sends what TFF's serializer would."""

import collections
import gc

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import executor_pb2
from fl_common.tff_private import value_serialization

from fl_engine import value_transfer
from tests import tiny_models

_WEIGHTS = tff.StructType([
    ('trainable', tff.StructWithPythonType(
        [tff.TensorType(np.float32, [2, 3]), tff.TensorType(np.float32, [3])],
        list)),
    ('non_trainable', tff.StructWithPythonType([], list)),
])
_STATE_TYPE = tff.FederatedType(
    tff.StructType([
        ('weights', _WEIGHTS),
        ('empty', tff.StructType([])),
        ('round', tff.TensorType(np.int64)),
        ('norm', tff.TensorType(np.float64)),
        ('counts', tff.TensorType(np.int32, [4])),
        ('names', tff.TensorType(np.str_, [2])),
        ('flags', tff.TensorType(np.bool_, [2])),
        ('unnamed', tff.StructType([(None, tff.TensorType(np.float32, [1]))])),
    ]), tff.SERVER)


def _state():
  return collections.OrderedDict(
      weights=collections.OrderedDict(
          trainable=[np.arange(6, dtype=np.float32).reshape(2, 3),
                     np.array([1.5, -2.0, np.nan], np.float32)],
          non_trainable=[]),
      empty=(),
      round=np.int64(7),
      norm=np.float64(0.25),
      counts=np.array([1, 2, 3, 4], np.int32),
      names=np.array([b'a', b'bc'], object),
      flags=np.array([True, False]),
      unnamed=(np.array([3.0], np.float32),))


def _in_place(value, type_spec) -> executor_pb2.Value:
  proto = executor_pb2.Value()
  value_transfer.serialize_into(value, type_spec, proto)
  return proto


def test_server_state_equals_tff_serialization():
  expected, _ = value_serialization.serialize_value(_state(), _STATE_TYPE)
  assert _in_place(_state(), _STATE_TYPE) == expected


def test_client_values_equal_tff_serialization():
  type_spec = tff.FederatedType(tff.TensorType(np.float32, [2]), tff.CLIENTS)
  values = [np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)]
  expected, _ = value_serialization.serialize_value(values, type_spec)
  assert _in_place(values, type_spec) == expected
  no_clients, _ = value_serialization.serialize_value([], type_spec)
  assert _in_place([], type_spec) == no_clients


def test_learning_process_state_round_trips():
  process = tff.learning.algorithms.build_weighted_fed_avg(
      tiny_models.linear_model_fn(num_features=3),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9))
  state = process.initialize()
  state_type = process.next.type_signature.parameter[0]
  expected, _ = value_serialization.serialize_value(state, state_type)
  assert _in_place(state, state_type) == expected


@pytest.mark.parametrize('value', [
    np.zeros([3, 2], np.float32),  # wrong shape
    np.zeros([2, 3], np.int32),  # wrong dtype
])
def test_mismatched_value_is_refused(value):
  type_spec = tff.TensorType(np.float32, [2, 3])
  with pytest.raises(TypeError):
    _in_place(value, type_spec)


def test_struct_of_wrong_length_is_refused():
  with pytest.raises(TypeError, match='2 elements'):
    _in_place([np.float32(1.0)], tff.StructType(
        [tff.TensorType(np.float32), tff.TensorType(np.float32)]))


def test_client_datasets_keep_elements_without_rewrites():
  datasets = [tf.data.Dataset.range(c, 5 + c).map(lambda x: x * 2).batch(2)
              for c in range(2)]
  type_spec = tff.FederatedType(
      tff.SequenceType(tff.TensorType(np.int64, [None])), tff.CLIENTS)
  sent = _in_place(datasets, type_spec)
  received, _ = value_serialization.deserialize_value(sent, type_spec)
  for original, dataset in zip(datasets, received, strict=True):
    assert dataset.options().autotune.enabled is False
    optimization = dataset.options().experimental_optimization
    assert optimization.apply_default_optimizations is False
    assert [b.tolist() for b in dataset.as_numpy_iterator()] == [
        b.tolist() for b in original.as_numpy_iterator()]


def test_prepared_dataset_is_sent_as_prepared():
  dataset = tf.data.Dataset.range(4).batch(2)
  type_spec = tff.SequenceType(tff.TensorType(np.int64, [None]))
  unprepared = _in_place(dataset, type_spec)
  value_transfer.prepare_datasets(([dataset], 'not a dataset'))
  prepared = value_transfer._PREPARED_DATASETS[dataset][0]
  # The prepared message is the dataset's serialization without preparing,
  # and what is sent is that message itself (a marker added to it arrives).
  assert prepared.sequence.element_type == unprepared.sequence.element_type
  for proto in (prepared, unprepared):
    received, _ = value_serialization.deserialize_value(proto, type_spec)
    assert [b.tolist() for b in received.as_numpy_iterator()] == [[0, 1],
                                                                 [2, 3]]
  prepared.sequence.serialized_graph_def += b'marker'
  assert _in_place(dataset, type_spec).sequence.serialized_graph_def.endswith(
      b'marker')


def test_prepared_dataset_of_another_type_is_refused():
  dataset = tf.data.Dataset.range(3)
  value_transfer.prepare_datasets([dataset])
  with pytest.raises(TypeError, match='Cannot serialize a dataset'):
    _in_place(dataset, tff.SequenceType(tff.TensorType(np.float32)))


def test_prepared_messages_are_dropped_with_their_datasets():
  kept = tf.data.Dataset.range(2)
  value_transfer.prepare_datasets([kept])
  count = len(value_transfer._PREPARED_DATASETS)
  assert kept in value_transfer._PREPARED_DATASETS
  del kept
  gc.collect()
  assert len(value_transfer._PREPARED_DATASETS) < count
