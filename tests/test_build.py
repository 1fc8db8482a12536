"""`experiment_driver.build.model_aggregator`: which aggregator the flags
select, each measuring what the driver's columns read."""

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow_federated as tff

from experiment_driver import build

FLAGS = flags.FLAGS
_VALUE_TYPE = tff.StructWithPythonType([tff.TensorType(np.float32, [3])],
                                       list)
_WEIGHT_TYPE = tff.TensorType(np.float32)


@pytest.fixture(autouse=True, scope='module')
def parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


def _process(**flag_values):
  with flagsaver.flagsaver(**flag_values):
    factory = build.model_aggregator()
  if isinstance(factory, tff.aggregators.WeightedAggregationFactory):
    return factory.create(_VALUE_TYPE, _WEIGHT_TYPE)
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  return factory.create(_VALUE_TYPE)


def _num_sums(process):
  text = process.next.to_building_block().compact_representation()
  return text.count('federated_sum')


def _measurement_names(process):
  measurements = process.next.type_signature.result.measurements.member
  return set(dict(tff.structure.iter_elements(measurements)))


def test_default_is_the_one_pass_weighted_clipped_mean():
  process = _process()
  assert len(process.next.type_signature.parameter) == 3  # weighted
  assert _num_sums(process) == 1
  assert process.initialize() == pytest.approx(1.0)  # ρ_1
  inner = process.next.type_signature.result.measurements.member[
      'inner_aggregator']
  assert 'clipping_norm' in dict(tff.structure.iter_elements(inner))


def test_uniform_weighting_and_no_clipping_stay_one_pass():
  process = _process(uniform_weighting=True, clipping=False)
  assert len(process.next.type_signature.parameter) == 2  # unweighted
  assert _num_sums(process) == 1
  assert 'update_norm' in _measurement_names(process)


def test_zeroing_uses_diagnostics_around_the_robust_aggregator():
  process = _process(zeroing=True)
  assert _num_sums(process) > 1
  inner = process.next.type_signature.result.measurements.member[
      'inner_aggregator']
  assert 'zeroing_norm' in dict(tff.structure.iter_elements(inner))


def test_normalized_update_wraps_the_diagnosed_mean():
  process = _process(normalize_server_update=True)
  assert _num_sums(process) == 1
  inner = process.next.type_signature.result.measurements.member[
      'inner_aggregator']
  assert 'update_norm' in dict(tff.structure.iter_elements(inner))
