"""fl_common.aggregator_wrappers: weightedness, type checks, plumbing."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import aggregator_wrappers

_VALUE_TYPE = tff.types.StructWithPythonType(
    [tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [3])], list)
_UPDATES = [[np.array([1.0, -2.0], np.float32),
             np.array([0.5, 0.0, 3.0], np.float32)],
            [np.array([4.0, 0.0], np.float32),
             np.array([-1.0, 2.0, 1.0], np.float32)]]


def _flat(value):
  return np.concatenate([np.ravel(t) for t in value]).astype(np.float64)


def _build_counting_next_impl(inner_process, value_type, weight_type):
  """Passes through the inner aggregate and reports if weights were given."""
  del value_type  # The aggregate keeps the inner process's type.

  def next_impl(state, value, weight):
    inner_output = aggregator_wrappers.inner_next(inner_process, state, value,
                                                  weight)
    weighted = tff.federated_value(weight_type is not None, tff.SERVER)
    return tff.templates.MeasuredProcessOutput(
        state=inner_output.state,
        result=inner_output.result,
        measurements=tff.federated_zip(collections.OrderedDict(
            weighted=weighted, inner=inner_output.measurements)))

  return next_impl


def test_global_norm_is_the_l2_norm_of_all_entries():
  value = [tf.constant([3.0, 0.0], tf.float32),
           tf.constant([[0.0], [4.0]], tf.float32)]
  norm = aggregator_wrappers.global_norm(value)
  assert norm.dtype == tf.float64
  assert norm.numpy() == pytest.approx(5.0)


def test_weighted_inner_factory_gives_a_weighted_wrapper():
  factory = aggregator_wrappers.wrap_factory(
      'counting_factory', tff.aggregators.MeanFactory(),
      _build_counting_next_impl)
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory)
  process = factory.create(_VALUE_TYPE, tff.TensorType(np.float32))
  output = process.next(process.initialize(), _UPDATES, [1.0, 3.0])
  expected = (_flat(_UPDATES[0]) + 3.0 * _flat(_UPDATES[1])) / 4.0
  np.testing.assert_allclose(_flat(output.result), expected, rtol=1e-6)
  assert output.measurements['weighted']
  assert set(output.measurements['inner']) == {'mean_value', 'mean_weight'}


def test_unweighted_inner_factory_gives_an_unweighted_wrapper():
  factory = aggregator_wrappers.wrap_factory(
      'counting_factory', tff.aggregators.UnweightedMeanFactory(),
      _build_counting_next_impl)
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  assert not isinstance(factory, tff.aggregators.WeightedAggregationFactory)
  process = factory.create(_VALUE_TYPE)
  output = process.next(process.initialize(), _UPDATES)
  np.testing.assert_allclose(
      _flat(output.result), (_flat(_UPDATES[0]) + _flat(_UPDATES[1])) / 2.0,
      rtol=1e-6)
  assert not output.measurements['weighted']


def test_bad_inner_factory_and_non_float_values_raise_value_errors():
  with pytest.raises(ValueError, match='inner_factory'):
    aggregator_wrappers.wrap_factory('counting_factory', 'mean',
                                     _build_counting_next_impl)
  factory = aggregator_wrappers.wrap_factory(
      'counting_factory', tff.aggregators.SumFactory(),
      _build_counting_next_impl)
  with pytest.raises(ValueError, match='counting_factory.*int32'):
    factory.create(tff.TensorType(np.int32, [2]))
