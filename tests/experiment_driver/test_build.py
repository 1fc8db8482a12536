"""`experiment_driver.build`: which aggregator the flags select, each
measuring what the driver's columns read, and how the local worker they
select shares its cores."""

import re

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow_federated as tff

from experiment_driver import build
from fl_engine import runtime
from fl_engine.runtime import workers
from tests import worker_process

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
  """How many sums from clients to server `process.next` takes."""
  text = process.next.to_building_block().compact_representation()
  return len(re.findall(r'federated_(sum|aggregate)\b', text))


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


def _worker_command_and_threads(**flag_values) -> tuple[list[str], bytes]:
  with flagsaver.flagsaver(runtime='worker', **flag_values):
    with build.runtime():
      pid = workers._started_workers[-1].pid  # pylint: disable=protected-access
      command = worker_process.command_line(pid)
      environment = worker_process.environment(pid)
  return command, environment[b'TF_NUM_INTRAOP_THREADS']


def test_driver_worker_trains_one_client_per_core_by_default():
  command, threads = _worker_command_and_threads()
  cores = runtime.cores_available()
  assert f'--max_concurrent_computation_calls={cores}' in command
  assert threads == b'1'


def test_driver_worker_with_one_client_at_a_time_gives_it_every_core():
  command, threads = _worker_command_and_threads(max_concurrent_clients=1)
  assert '--max_concurrent_computation_calls=1' in command
  assert threads == str(runtime.cores_available()).encode()


@pytest.mark.parametrize('flag_values', [
    {'task': 'synthetic'},
    {'task': 'synthetic_partitioned', 'algorithm': 'adabest',
     'num_clients': 20},
])
def test_the_common_data_are_what_the_drivers_synthetic_tasks_generate(
    flag_values):
  """The prestart server generates `tasks.generate_common_data` once for
  all its runs: a Synthetic task the driver builds at its default flags
  generates nothing more."""
  import tasks  # pylint: disable=g-import-not-at-top
  from tasks import synthetic  # pylint: disable=g-import-not-at-top
  tasks.generate_common_data()
  before = synthetic._generated_clients.cache_info()
  with flagsaver.flagsaver(**flag_values):
    build.create_task()
  after = synthetic._generated_clients.cache_info()
  assert after.misses == before.misses
  assert after.hits > before.hits
