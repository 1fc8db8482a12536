"""The package's TFF runtime computes and never leaves a worker behind."""

import os
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import context_stack_impl

from fl_engine import runtime
from fl_engine.runtime import stubs
from fl_engine.runtime import workers
from tests import worker_process
import tests

_REPO = tests.REPO


def _worker_pids_of(parent_pid: int) -> list[int]:
  out = subprocess.run(
      ['pgrep', '-P', str(parent_pid), '-f', 'worker_binary'],
      capture_output=True, text=True, check=False,
  ).stdout
  return [int(pid) for pid in out.split()]


def test_federated_mean_runs_on_package_runtime():
  @tff.tensorflow.computation(np.float32)
  def add_one(x):
    return x + 1.0

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean_plus_one(values):
    return tff.federated_mean(tff.federated_map(add_one, values))

  assert mean_plus_one([1.0, 2.0, 6.0]) == 4.0


def test_local_runtime_stops_its_worker():
  with runtime.worker_runtime(max_concurrent_clients=1):
    process = workers._started_workers[-1]
    assert process.poll() is None
  assert process.poll() is not None


def test_worker_dies_with_killed_parent():
  script = textwrap.dedent("""
      import time
      from fl_engine import runtime
      process, address = runtime.start_worker()
      from fl_engine.runtime import stubs
      stubs._connect(address, timeout_seconds=30)  # it is worker_binary now
      print(process.pid, flush=True)
      time.sleep(60)
  """)
  parent = subprocess.Popen(
      [sys.executable, '-c', script], stdout=subprocess.PIPE, text=True,
      cwd=_REPO,
  )
  worker_pid = int(parent.stdout.readline())
  assert _worker_pids_of(parent.pid) == [worker_pid]
  parent.kill()
  parent.wait()
  for _ in range(100):
    if subprocess.run(['kill', '-0', str(worker_pid)],
                      capture_output=True).returncode != 0:
      break
    time.sleep(0.05)
  else:
    raise AssertionError(f'worker {worker_pid} outlived its killed parent')


def test_workers_start_without_forking_grpc_while_calls_are_in_flight():
  # A worker started with a real fork() runs gRPC's fork handlers in the
  # child, which once deadlocked there while another thread was in a gRPC
  # call; gRPC logs each fork it sees ("skipping fork() handlers" when calls
  # are in flight). Workers are started here 200 times while four threads
  # keep calls in flight: before the fix, 2-3 % of the starts forked so.
  script = textwrap.dedent("""
      import threading
      import grpc
      from fl_engine import runtime
      from fl_engine.runtime import stubs
      first, address = runtime.start_worker()
      probe = stubs._health_probe(stubs._connect(address, 30))
      starting = True
      def call_while_starting():
        while starting:
          try:
            probe(b'', timeout=5)
          except grpc.RpcError:
            pass
      callers = [threading.Thread(target=call_while_starting)
                 for _ in range(4)]
      for caller in callers:
        caller.start()
      for _ in range(200):
        runtime.stop_worker(runtime.start_worker()[0])
      starting = False
      for caller in callers:
        caller.join()
      runtime.stop_worker(first)
      print('started 200 workers')
  """)
  finished = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True,
      timeout=120, env={**os.environ, 'GRPC_VERBOSITY': 'INFO'},
      cwd=_REPO,
  )
  assert finished.returncode == 0, finished.stderr[-2000:]
  assert 'started 200 workers' in finished.stdout
  assert 'fork' not in finished.stderr, finished.stderr[-2000:]


def test_worker_needs_setpriv(monkeypatch):
  monkeypatch.setattr(workers.shutil, 'which', lambda name: None)
  started = len(workers._started_workers)
  with pytest.raises(RuntimeError, match='util-linux'):
    runtime.start_worker()
  assert len(workers._started_workers) == started


def _started_worker_environment(**start_settings) -> dict[bytes, bytes]:
  process, address = runtime.start_worker(**start_settings)
  try:
    stubs._connect(address, timeout_seconds=30).close()  # worker_binary now
    return worker_process.environment(process.pid)
  finally:
    runtime.stop_worker(process)


def test_started_worker_keeps_large_buffers_in_its_heap():
  environment = _started_worker_environment()
  assert int(environment[b'MALLOC_MMAP_THRESHOLD_']) >= 1 << 30
  assert int(environment[b'MALLOC_TRIM_THRESHOLD_']) >= 1 << 30


@pytest.mark.parametrize('cores, concurrent_clients, threads', [
    (2, 2, 1),   # the default: one client per core, one thread each
    (8, 2, 4),
    (8, 3, 2),
    (2, 4, 1),
    (8, 0, 1),   # no limit on concurrent clients
    (8, -1, 1),
])
def test_worker_shares_its_cores_among_concurrent_clients(
    monkeypatch, cores, concurrent_clients, threads):
  monkeypatch.setattr(workers, 'cores_available', lambda: cores)
  environment = _started_worker_environment(
      max_concurrent_clients=concurrent_clients)
  assert environment[b'TF_NUM_INTRAOP_THREADS'] == str(threads).encode()


def test_default_worker_runs_one_single_threaded_client_per_core():
  environment = _started_worker_environment()
  assert environment[b'TF_NUM_INTRAOP_THREADS'] == b'1'


@tff.tensorflow.computation(np.float32, np.float32)
def _scale(x, y):
  return x * y


@tff.tensorflow.computation(np.float32, np.float32)
def _add(x, y):
  return x + y


@tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER),
                           tff.FederatedType(np.float32, tff.CLIENTS))
def _server_results(server_value, client_values):
  scaled = tff.federated_map(
      _scale, (tff.federated_broadcast(server_value), client_values))
  return (tff.federated_map(_add, (server_value, tff.federated_sum(scaled))),
          tff.federated_mean(client_values))


@tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER),
                           tff.FederatedType(np.float32, tff.CLIENTS))
def _client_results(server_value, client_values):
  mean = tff.federated_broadcast(tff.federated_mean(client_values))
  return tff.federated_map(_add, (client_values, mean))


def test_cohort_in_three_slices_computes_the_whole_cohort():
  # 5 clients in slices of at most 2: three partial aggregates are merged in
  # one call, then the rest of the round runs (for a result with client
  # values, on each slice; for a server result, with one client only).
  client_values = [1.0, 2.0, 3.0, 4.0, 5.0]
  with runtime.worker_runtime(max_clients_per_call=2):
    server_total, mean = _server_results(2.0, client_values)
    per_client = _client_results(2.0, client_values)
    splitting_context = context_stack_impl.context_stack.current
    # Both computations were split: one merging computation each.
    assert len(splitting_context._merge_computations) == 2
  assert (server_total, mean) == (2.0 + 2.0 * 15.0, 3.0)
  assert per_client == [4.0, 5.0, 6.0, 7.0, 8.0]


def test_importing_the_runtime_runs_plain_tff_in_process(tmp_path):
  # TFF's own default context starts a worker_binary that outlives Python;
  # once `fl_engine.runtime` is imported, computations outside any
  # runtime run in-process instead. A worker the child started anyway is
  # found by a marker in its environment, stopped, and fails the test.
  marker = f'FL_PAPERS_PLAIN_TFF={uuid.uuid4().hex}'
  script = textwrap.dedent("""
      from fl_common.tff_private import context_stack_impl
      import tensorflow_federated as tff
      before = context_stack_impl.context_stack.current
      import adabest_tff, gel_tff, large_cohort, tasks
      assert context_stack_impl.context_stack.current is before
      from experiment_driver import build, training_loop
      from fl_engine import runtime
      import run_experiment
      assert isinstance(context_stack_impl.context_stack.current,
                        runtime._ManagedDefaultContext)
      import numpy as np

      @tff.tensorflow.computation(np.int32)
      def double(x):
        return x * 2

      print('plain TFF:', double(21), flush=True)
  """)
  key, value = marker.split('=')
  # Files, not pipes: a worker would inherit and hold the child's stdout.
  output = tmp_path / 'output.txt'
  workers = []
  try:
    with open(output, 'w') as out:
      finished = subprocess.run(
          [sys.executable, '-c', script], stdout=out, stderr=out, timeout=300,
          cwd=_REPO, stdin=subprocess.DEVNULL, env={**os.environ, key: value})
  finally:
    for pid in subprocess.run(['pgrep', '-f', 'worker_binary'],
                              capture_output=True, text=True).stdout.split():
      try:
        if worker_process.environment(int(pid)).get(
            key.encode()) == value.encode():
          workers.append(pid)
          os.kill(int(pid), 9)
      except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
  text = output.read_text()
  assert finished.returncode == 0, text[-3000:]
  assert 'plain TFF: 42' in text
  assert not workers


@tff.tensorflow.computation(tff.TensorType(np.float32, [256]))
def _reduce_sum(array):
  return tf.reduce_sum(array)


@tff.federated_computation(
    tff.FederatedType(np.float32, tff.SERVER),
    tff.FederatedType(tff.TensorType(np.float32, [256]), tff.CLIENTS))
def _sum_of_client_arrays(server_value, client_arrays):
  sums = tff.federated_map(_reduce_sum, client_arrays)
  return tff.federated_map(_add, (server_value, tff.federated_sum(sums)))


def test_clients_arrays_past_the_byte_cap_are_sent_in_slices(monkeypatch):
  # 5 clients of 1 KB with a 2.5 KB cap: 2 slices would hold 3 KB, so 3.
  monkeypatch.setattr(runtime.contexts, 'MAX_BYTES_PER_SLICE', 2560)
  arrays = [np.full([256], k, np.float32) for k in range(1, 6)]
  with runtime.worker_runtime(keep_state_on_worker=True):
    splitting_context = context_stack_impl.context_stack.current
    assert splitting_context._num_slices(
        [np.float32(1.0), arrays],
        _sum_of_client_arrays.type_signature.parameter) == 3
    total = _sum_of_client_arrays(1.0, arrays)
    assert len(splitting_context._merge_computations) == 1
    # Scalars per client are under the cap: one call, unsplit.
    assert _server_results(2.0, [1.0, 2.0])[1] == 1.5
    assert len(splitting_context._merge_computations) == 1
  assert total == 1.0 + 256 * 15


@pytest.mark.parametrize('module, args, message', [
    ('reproduce.sweep', ['--total_rounds=1', '--bogus'],
     'error: unrecognized arguments: --bogus'),
    ('reproduce', ['--bogus'], 'error: unrecognized arguments: --bogus'),
    ('bench.round_time', ['--bogus'], "Unknown command line flag 'bogus'"),
    ('bench.round_time', ['--budget_seconds=inf'],
     '--budget_seconds must be finite, got inf'),
    ('bench.round_time', ['--sections=e2e', '--budget_seconds=5'],
     '--budget_seconds only sets the ratios section'),
    ('bench.round_time', ['--quick', '--budget_seconds=5'],
     '--budget_seconds only sets the ratios section'),
])
def test_command_line_tools_refuse_bad_flags_without_tffs_exit_traceback(
    module, args, message):
  # TFF's default context, alive at exit, prints a ServiceManager.__del__
  # traceback after the tool's own error line: each tool drops it first.
  finished = subprocess.run(
      [sys.executable, '-m', module, *args],
      capture_output=True, text=True, timeout=120, cwd=_REPO)
  assert finished.returncode != 0
  assert message in finished.stderr
  assert 'Traceback' not in finished.stderr, finished.stderr[-2000:]




_LEFT_OPEN = '''
import sys
import tasks, large_cohort
from fl_engine import runtime
getattr(runtime, sys.argv[1])().__enter__()  # never exited, as in a notebook
task = tasks.create_task('synthetic')
ids = task.datasets.train_data.client_ids[:3]
data = [task.datasets.train_preprocess_fn(
    task.datasets.train_data.create_tf_dataset_for_client(i)) for i in ids]
process = large_cohort.build_fedopt(
    task.model_fn, client_optimizer=large_cohort.build_optimizer('sgd', 0.1),
    server_optimizer=large_cohort.build_lamb(0.01))
process.next(process.initialize(), data)
print('trained')
'''


@pytest.mark.parametrize('which', ['local_runtime', 'worker_runtime'])
def test_a_runtime_left_open_closes_at_exit_without_a_traceback(which):
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  result = subprocess.run([sys.executable, '-c', _LEFT_OPEN, which],
                          capture_output=True, text=True, cwd=repo,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('trained')
  assert 'Exception ignored' not in result.stderr, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
