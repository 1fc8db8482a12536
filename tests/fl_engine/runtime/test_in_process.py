"""The in-process runtime computes what TFF's worker computes, on any device.

Every builder of the conformance suite trains two rounds in this process
(`runtime.local_runtime`) and on TFF's `worker_binary`
(`runtime.worker_runtime`), from the same seed and clients: the server
states, the round metrics and the stateful clients' states agree to float
rounding (the worker is TensorFlow 2.14, this process 2.21). Placement over
several devices runs in a child process with logical CPU devices standing in
for GPUs (TensorFlow fixes its devices when it starts).
"""

import asyncio
import collections
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import runtime
from fl_engine.runtime import in_process
from tests import conformance_builders as conformance
import tests

ROOT = tests.REPO


def _numbers(value):
  """The numeric leaves of a structure, as float64 arrays."""
  return [np.asarray(x, np.float64) for x in tf.nest.flatten(value)
          if np.asarray(x).dtype.kind in 'biuf']


def _two_rounds(name, tmp_path, tag, cohorts=(('a', 'b'), ('b', 'c', 'a'))):
  run = conformance.Run(name, tmp_path / tag, seed=5)
  metrics = [run.round(list(cohort), round_num=round_num)
             for round_num, cohort in enumerate(cohorts, 1)]
  client_states = (None if run.runner is None else
                   run.runner.store.load(['a', 'b', 'c']))
  return run.state, metrics, client_states


@pytest.fixture(scope='module')
def worker():
  with runtime.worker_runtime() as address:
    yield address


@pytest.mark.parametrize('name', sorted(conformance.BUILDERS))
def test_in_process_equals_the_worker(name, worker, tmp_path):
  del worker  # Installed for the module; the in-process runtime nests in it.
  on_worker = _two_rounds(name, tmp_path, 'worker')
  with runtime.local_runtime():
    here = _two_rounds(name, tmp_path, 'here')
  for ours, theirs in zip(here, on_worker):
    ours, theirs = _numbers(ours), _numbers(theirs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', sorted(conformance.BUILDERS))
def test_a_planned_call_equals_the_interpreted_call(name, tmp_path,
                                                    monkeypatch):
  # Every call planned from its first, against every call interpreted; the
  # third round (a cohort of the second's size) replays the second's plan
  # without TFF's context (`shortcuts`).
  cohorts = (('a', 'b'), ('b', 'c', 'a'), ('c', 'a', 'b'))
  monkeypatch.setattr(in_process, 'PLAN_AFTER_CALLS', 0)
  with runtime.local_runtime() as devices:
    planned = _two_rounds(name, tmp_path, 'planned', cohorts)
    calls = dict(devices[0].calls)
  monkeypatch.setattr(in_process, 'PLANS', False)
  with runtime.local_runtime() as devices:
    interpreted = _two_rounds(name, tmp_path, 'interpreted', cohorts)
    assert dict(devices[0].calls) == {
        'interpreted': calls['planned'] + calls.get('interpreted', 0)}
  # The rounds (and whatever else the run calls) were planned, the third
  # through its shortcut.
  assert calls.get('interpreted', 0) == 0 and calls['planned'] >= 3, calls
  assert calls.get('shortcut', 0) >= 1, calls
  for ours, theirs in zip(planned, interpreted):
    assert (ours is None) == (theirs is None)  # Client states, if kept.
    ours, theirs = _numbers(ours), _numbers(theirs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('limit', ['imports', 'plans'])
def test_calls_past_a_plans_limits_stay_interpreted(limit, tmp_path,
                                                    monkeypatch):
  monkeypatch.setattr(in_process, 'PLAN_AFTER_CALLS', 0)
  if limit == 'imports':  # No call may import a TensorFlow computation.
    monkeypatch.setattr(in_process, 'MAX_IMPORTS', 0)
  else:  # One layout planned per computation: cohorts of 2, not of 3.
    monkeypatch.setattr(in_process, 'MAX_PLANS', 1)
  with runtime.local_runtime() as devices:
    run = conformance.Run('fedopt', tmp_path, seed=1)
    for clients in (['a', 'b'], ['a', 'b', 'c'], ['b', 'c', 'a']):
      run.round(clients)
    calls = dict(devices[0].calls)
  if limit == 'imports':
    assert calls.get('planned', 0) == 0, calls
  else:  # Each computation's first layout planned, the rounds of 3 not.
    assert calls['planned'] >= 1 and calls['interpreted'] >= 2, calls


def test_slices_of_a_cohort_equal_the_whole_cohort(tmp_path):
  whole = _two_rounds('fused_adabest', tmp_path, 'whole')
  with runtime.local_runtime(max_clients_per_call=1):
    sliced = _two_rounds('fused_adabest', tmp_path, 'sliced')
  for ours, theirs in zip(sliced, whole):
    for a, b in zip(_numbers(ours), _numbers(theirs)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _workers():
  return {c.pid for c in psutil.Process().children(recursive=True)
          if 'worker_binary' in c.name()}


def test_no_worker_process_is_started(tmp_path):
  before = _workers()  # The module's worker, if it is running.
  with runtime.local_runtime():
    _two_rounds('fedopt', tmp_path, 'x')
    assert _workers() == before


def test_a_computation_is_compiled_once_and_runs_from_a_running_event_loop(
    monkeypatch):
  compile_fn = in_process.compiler.desugar_and_transform_to_native
  compiled = []

  def counting(comp):
    compiled.append(comp)
    return compile_fn(comp)

  monkeypatch.setattr(in_process.compiler, 'desugar_and_transform_to_native',
                      counting)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean_and_count(values):
    return collections.OrderedDict(
        mean=tff.federated_mean(values),
        count=tff.federated_sum(tff.federated_value(1, tff.CLIENTS)))

  async def in_a_notebook(values):  # Jupyter runs cells in an event loop.
    return mean_and_count(values)

  with runtime.local_runtime():
    first = mean_and_count([1.0, 2.0])
    second = mean_and_count([1.0, 2.0, 6.0])
    from_loop = asyncio.run(in_a_notebook([4.0]))
  assert len(compiled) == 1
  # The computation's own Python container, not the compiled one's, of
  # NumPy values (no result transform runs: none is needed).
  assert isinstance(first, collections.OrderedDict)
  assert all(isinstance(v, (np.ndarray, np.generic)) for v in first.values())
  assert (first['mean'], first['count']) == (1.5, 2)
  assert (second['mean'], second['count']) == (3.0, 3)
  assert (from_loop['mean'], from_loop['count']) == (4.0, 1)


Summary = collections.namedtuple('Summary', ['total', 'scaled'])


def test_a_shortcut_replays_only_an_argument_of_the_recorded_structure():

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                             tff.FederatedType(np.float32, tff.SERVER))
  def summarize(values, scale):
    total = tff.federated_sum(values)
    return Summary(total=total, scaled=tff.federated_map(
        tff.tensorflow.computation(lambda x, y: x * y),
        tff.federated_zip((tff.federated_broadcast(scale), values))))

  def arrays(*xs):
    return [np.float32(x) for x in xs]

  with runtime.local_runtime() as devices:
    results = [summarize(arrays(1, 2), np.float32(3)),  # interpreted
               summarize(arrays(2, 4), np.float32(1)),  # planned, recorded
               summarize(arrays(5, 6), np.float32(2))]  # replayed
    calls = dict(devices[0].calls)
    assert calls == {'interpreted': 1, 'planned': 2, 'shortcut': 1}, calls
    # Another cohort size, Python numbers (converted by TFF's context), or
    # a value of another dtype: through TFF's context, with its checks.
    results.append(summarize(arrays(1, 2, 3), np.float32(1)))
    results.append(summarize([1.0, 2.0], 2.0))
    results.append(summarize([np.float64(1), np.float64(2)], np.float32(1)))
    assert devices[0].calls['shortcut'] == 1
  for result in results:
    assert isinstance(result, Summary) and isinstance(result.scaled, list)
  assert [(float(r.total), [float(x) for x in r.scaled]) for r in results] == [
      (3.0, [3.0, 6.0]), (6.0, [2.0, 4.0]), (11.0, [10.0, 12.0]),
      (6.0, [1.0, 2.0, 3.0]), (3.0, [2.0, 4.0]), (3.0, [1.0, 2.0])]


def test_an_intrinsic_it_lacks_is_refused_by_name():

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def secure_sum(values):
    return tff.backends.mapreduce.federated_secure_modular_sum(
        values, np.int32(8))

  with runtime.local_runtime():
    with pytest.raises(in_process.UnsupportedComputationError,
                       match='intrinsic federated_secure_modular_sum'):
      secure_sum([1, 2])


def test_strings_nested_zips_and_empty_results_as_on_the_worker():

  @tff.tensorflow.computation(
      tff.StructType([np.str_, tff.StructType([np.int32])]))
  def describe(pair):
    text, (n,) = pair
    return tf.strings.length(text) + n, tf.strings.join([text, text]), ()

  @tff.federated_computation(tff.FederatedType(np.str_, tff.CLIENTS),
                             tff.FederatedType(np.int32, tff.SERVER))
  def described(texts, n):
    # A nested struct of client values zipped into one.
    zipped = tff.federated_zip((texts, (tff.federated_broadcast(n),)))
    return tff.federated_map(describe, zipped)

  results = []
  for runtime_fn in (runtime.local_runtime, runtime.worker_runtime):
    with runtime_fn():
      results.append(described(['ab', 'xyz'], 3))
  assert results[0] == results[1]
  assert [r[0] for r in results[0]] == [5, 6]


def test_an_invisible_device_is_refused_before_any_work():
  with pytest.raises(ValueError, match=r'device /device:GPU:7 is not visible'
                     r' to TensorFlow \(visible: /device:CPU:0'):
    with runtime.local_runtime(['GPU:7']):
      pytest.fail('the runtime started')
  with pytest.raises(ValueError, match='named twice'):
    in_process.check_devices(['CPU:0', '/device:CPU:0'])


def test_devices_are_planned_per_kind(monkeypatch):
  monkeypatch.setattr(in_process, 'visible_devices', lambda: [
      '/device:CPU:0', '/device:GPU:0', '/device:GPU:1'])
  # GPUs by default: two client calls each, the cores shared for host work.
  gpus = in_process.plan_devices(cores=8)
  assert [(d.name, d.lanes, d.threads_per_lane) for d in gpus] == [
      ('/device:GPU:0', 2, 2), ('/device:GPU:1', 2, 2)]
  cpu = in_process.plan_devices(['cpu'], cores=8)
  assert [(d.name, d.lanes, d.threads_per_lane, d.threads) for d in cpu] == [
      ('/device:CPU:0', 8, 1, 8)]
  for device in gpus + cpu:
    device.close()


_PLACEMENT_SCRIPT = '''
import json, pathlib, sys, tempfile
sys.path.insert(0, {root!r})
import fl_common.tf_environment
import tensorflow as tf
cpu, = tf.config.list_physical_devices('CPU')
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
from fl_engine import runtime
from tests import conformance_builders as conformance

def run(devices):
  with runtime.local_runtime(devices, record_placement=True) as planned:
    run = conformance.Run('fused_fedopt', pathlib.Path(tempfile.mkdtemp()),
                           seed=1)
    for _ in range(2):
      run.round(['a', 'b', 'c'])
    return (run.weights().tolist(),
            {{d.name: d.placement.ops for d in planned}})

print(json.dumps([run(['CPU:1', 'CPU:2']), run(['CPU:0'])]))
'''


def test_shards_run_on_their_device_and_the_server_update_on_the_first():
  result = subprocess.run(
      [sys.executable, '-c', _PLACEMENT_SCRIPT.format(root=ROOT)],
      capture_output=True, text=True, check=True, timeout=600)
  (split_weights, split), (one_weights, one) = json.loads(
      result.stdout.splitlines()[-1])
  np.testing.assert_allclose(split_weights, one_weights, rtol=1e-6)
  first, second = '/device:CPU:1', '/device:CPU:2'
  # Each device's client computations ran on it alone.
  assert list(split[first]['clients']) == [first]
  assert list(split[second]['clients']) == [second]
  # The merge and the server update: on the first device (besides the ops
  # TensorFlow pins to the host's first CPU); the second only prepares its
  # slice.
  first_server = split[first]['server']
  second_server = split[second]['server']
  assert set(second_server) == {second}
  assert first_server[first] > 2 * second_server[second]
  assert set(first_server) <= {first, '/device:CPU:0'}
  assert list(one['/device:CPU:0']['clients']) == ['/device:CPU:0']


_NOTEBOOK_SCRIPT = '''
import os, pathlib, sys, tempfile
sys.path.insert(0, {root!r})
import fl_common.tf_environment
import psutil
from fl_engine import runtime  # noqa: F401  (TFF's default: managed)
from tests import conformance_builders as conformance

run = conformance.Run('fedopt', pathlib.Path(tempfile.mkdtemp()), seed=1)
run.round(['a', 'b'])  # outside any `with runtime...():`, as in a notebook
print('children', len(psutil.Process().children(recursive=True)))
print('weights', run.weights().tolist())
'''


def test_a_computation_outside_any_runtime_runs_in_process_and_leaks_nothing():
  # Piped stdout: a worker that outlived the script would hold it open.
  result = subprocess.run(
      [sys.executable, '-c', _NOTEBOOK_SCRIPT.format(root=ROOT)],
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'children 0' in result.stdout
  with runtime.local_runtime():
    run = conformance.Run('fedopt', pathlib.Path(tempfile.mkdtemp()), seed=1)
    run.round(['a', 'b'])
    expected = run.weights().tolist()
  assert f'weights {expected}' in result.stdout
  assert 'Traceback' not in result.stderr
