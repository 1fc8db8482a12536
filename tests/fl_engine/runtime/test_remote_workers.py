"""Training on TFF workers over gRPC (`--worker_addresses`), for real.

Two `worker_binary` processes are started on loopback ports for this module
and stopped at its end whatever happens. The driver runs as a subprocess, as
a user runs it, once through the workers and once on its own local runtime;
a worker is killed mid-run and the run resumed. In-process tests check what
the remote runtime itself promises: client-placed results in client order,
busy workers not mistaken for hung ones, hung workers named, bad addresses
refused.
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import runtime
import tests

_REPO = tests.REPO
# A cohort of 5 is split 3 + 2 over the two workers. At most 10 local steps
# per client: long local training amplifies the rounding differences below
# (with all of each client's examples, up to 200 SGD steps at the tuned rate
# 0.1, they reach 1e-4 relative by round 2).
_RUN = ['--task=synthetic', '--clients_per_round=5', '--total_rounds=4',
        '--max_elements_per_client=50', '--rounds_per_eval=2',
        '--rounds_per_checkpoint=1', '--max_eval_clients=20', '--seed=3']
_TIMING_COLUMNS = ('round_time_sec', 'eval_time_sec')
# A remote run adds up each worker's slice of the cohort and then the two
# partial sums; a local run adds the clients one by one. In float32 the two
# orders round differently by a few units in the last place (2^-24 ~ 6e-8
# relative): at most 1.5e-7 relative over these 4 rounds. 1e-6 leaves a
# margin of ~7; a client dropped, counted twice or misweighted moves the
# metrics by orders of magnitude more.
_RTOL = 1e-6
# The mean pairwise cosine of the updates (~0.05) is formed from terms of size
# 1 that largely cancel: its rounding error is on the scale of 1, not of its
# value.
_ATOL = 1e-6


class _Workers:
  """Two loopback workers; a killed one can be restarted on its port."""

  def __init__(self):
    self.processes = {}
    for _ in range(2):
      process, address = runtime.start_worker(portpicker.pick_unused_port())
      self.processes[address] = process

  @property
  def addresses(self) -> list[str]:
    return list(self.processes)

  def restart(self, address: str) -> None:
    runtime.stop_worker(self.processes[address])
    port = int(address.rsplit(':', 1)[1])
    self.processes[address], _ = runtime.start_worker(port)

  def cpu_ticks(self) -> dict[str, int]:
    ticks = {}
    for address, process in self.processes.items():
      with open(f'/proc/{process.pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      ticks[address] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks

  def stop(self) -> None:
    for process in self.processes.values():
      runtime.stop_worker(process)


@pytest.fixture(scope='module')
def workers():
  started = _Workers()
  try:
    yield started
  finally:
    started.stop()


def _command(*args):
  return [sys.executable, os.path.join(_REPO, 'run_experiment.py'), *args]


def _start(*args) -> subprocess.Popen:
  return subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=_REPO,
                          stdin=subprocess.DEVNULL)


def _finish_all(drivers: list[subprocess.Popen]) -> None:
  """Waits for drivers running at the same time; kills any left running."""
  try:
    for driver in drivers:
      _finish(driver)
  finally:
    for driver in drivers:
      if driver.poll() is None:
        driver.kill()
        driver.wait()


def _finish(driver: subprocess.Popen) -> str:
  """Waits for a driver; returns its stdout if it succeeded."""
  try:
    stdout, stderr = driver.communicate(timeout=600)
  finally:
    if driver.poll() is None:
      driver.kill()
      driver.wait()
  if driver.returncode != 0:
    raise AssertionError(f'exit {driver.returncode}:\n{stderr[-3000:]}')
  return stdout


def _metrics(run_dir):
  frame = pd.read_csv(os.path.join(run_dir, 'metrics.csv'))
  return frame.drop(columns=[c for c in _TIMING_COLUMNS if c in frame])


@pytest.fixture(scope='module')
def runs(workers, tmp_path_factory):
  """The same run through the workers and locally (at the same time)."""
  root = tmp_path_factory.mktemp('runs')
  ticks_before = workers.cpu_ticks()
  drivers = [
      _start(*_RUN, f'--root_output_dir={root}', '--experiment_name=remote',
             f'--worker_addresses={",".join(workers.addresses)}'),
      _start(*_RUN, f'--root_output_dir={root}', '--experiment_name=local'),
  ]
  _finish_all(drivers)
  ticks_after = workers.cpu_ticks()
  return root, {a: ticks_after[a] - ticks_before[a] for a in ticks_before}


def test_remote_run_matches_local_run(runs):
  root, worker_cpu_ticks = runs
  remote = _metrics(root / 'remote')
  local = _metrics(root / 'local')

  # Both workers trained: 20-35 CPU ticks each (1/100 s) with fused shards
  # (~150 one call per client), an idle one ~1 a minute.
  assert all(ticks > 8 for ticks in worker_cpu_ticks.values()), (
      worker_cpu_ticks)
  assert list(remote.columns) == list(local.columns)
  assert list(remote['round']) == [1, 2, 3, 4]
  assert remote['test/accuracy'].notna().sum() == 2
  for column in ('examples_processed', 'client_work/train/num_examples',
                 'aggregator/num_clients', 'test/num_examples'):
    np.testing.assert_array_equal(remote[column], local[column], column)
  for column in remote.columns:
    np.testing.assert_allclose(remote[column], local[column], rtol=_RTOL,
                               atol=_ATOL, err_msg=column)


def _last_round(stdout: str) -> int:
  rounds = re.findall(r'^round (\d+)/', stdout, flags=re.MULTILINE)
  return int(rounds[-1])


def test_killed_worker_is_named_and_the_run_resumes(workers, runs, tmp_path):
  root, _ = runs
  args = [*_RUN, f'--root_output_dir={tmp_path}', '--experiment_name=run',
          f'--worker_addresses={",".join(workers.addresses)}']
  killed = workers.addresses[1]
  driver = _start(*args)
  try:
    printed = []
    for line in driver.stdout:
      printed.append(line)
      if line.startswith('round 2/'):  # its checkpoint is being written
        workers.processes[killed].send_signal(signal.SIGKILL)
        break
    stdout, stderr = driver.communicate(timeout=300)
  finally:
    if driver.poll() is None:
      driver.kill()
      driver.wait()
  stdout = ''.join(printed) + stdout

  assert driver.returncode == 2, stderr[-3000:]
  error_lines = [l for l in stderr.splitlines() if l.startswith('error:')]
  assert len(error_lines) == 1, stderr[-3000:]
  assert f'TFF worker at {killed} ' in error_lines[0]
  assert workers.addresses[0] not in error_lines[0]
  last_round = _last_round(stdout)
  assert 2 <= last_round < 4
  checkpoints = os.listdir(tmp_path / 'run' / 'checkpoints')
  assert f'program_state_{last_round}' in checkpoints, checkpoints

  workers.restart(killed)
  stdout = _finish(_start(*args))
  assert f'resuming from the checkpoint of round {last_round}' in stdout
  # The resumed run splits every round as the uninterrupted one did.
  pd.testing.assert_frame_equal(_metrics(tmp_path / 'run'),
                                _metrics(root / 'remote'))


def _build_slow_for_small_inputs():
  """`{x}@CLIENTS -> {x}@CLIENTS`, slow for clients with small `x`.

  The first worker gets the first clients, so with increasing inputs it
  finishes last: a runtime that joins results in the order the workers
  finish puts the second worker's clients first.
  """

  @tff.tensorflow.computation(np.float32)
  def slow_identity(x):
    num_steps = tf.cast(4000.0 / x, tf.int32)
    matrix = tf.eye(64) * 0.5
    _, matrix = tf.while_loop(lambda i, m: i < num_steps,
                              lambda i, m: (i + 1, tf.tanh(m @ m)),
                              (0, matrix))
    return x + 0.0 * tf.reduce_sum(matrix)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def per_client(values):
    return tff.federated_map(slow_identity, values)

  return per_client


def test_client_results_keep_the_client_order(workers):
  per_client = _build_slow_for_small_inputs()
  values = [1.0, 2.0, 3.0, 50.0, 60.0]
  # Probing every 10 ms while the workers compute: a busy worker answers.
  with runtime.remote_runtime(workers.addresses, probe_interval_seconds=0.01,
                              probe_timeout_seconds=5):
    assert per_client(values) == values


def test_dependent_aggregations_run_whole_on_one_worker(workers):
  # The variance needs the mean first: two aggregations, one depending on the
  # other, which TFF's mergeable form cannot split over workers.
  @tff.tensorflow.computation(np.float32, np.float32)
  def squared_distance(x, mean):
    return (x - mean)**2

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def variance(values):
    mean = tff.federated_broadcast(tff.federated_mean(values))
    return tff.federated_mean(
        tff.federated_map(squared_distance, (values, mean)))

  values = [1.0, 2.0, 3.0, 6.0, 8.0]
  with runtime.remote_runtime(workers.addresses):
    assert variance(values) == pytest.approx(np.var(values), rel=1e-6)


def test_hung_worker_is_named(workers):
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)

  hung = workers.addresses[0]
  with runtime.remote_runtime(workers.addresses, probe_interval_seconds=0.1,
                              probe_timeout_seconds=1):
    assert total([1.0, 2.0, 3.0]) == 6.0
    workers.processes[hung].send_signal(signal.SIGSTOP)
    try:
      with pytest.raises(runtime.WorkerUnavailableError,
                         match=f'worker at {hung} stopped answering'):
        total([1.0, 2.0, 3.0])
    finally:
      workers.processes[hung].send_signal(signal.SIGCONT)


@pytest.mark.parametrize('addresses,bad', [
    (['localhost'], "'localhost'"),
    (['localhost:http'], "'localhost:http'"),
    (['localhost:70000'], "'localhost:70000'"),
    (['localhost:8000', 'localhost:8000'], 'localhost:8000'),
    ([], 'empty'),
])
def test_bad_addresses_are_refused(addresses, bad):
  with pytest.raises(ValueError, match=bad):
    with runtime.remote_runtime(addresses):
      pass


def test_unreachable_worker_is_named():
  address = f'localhost:{portpicker.pick_unused_port()}'
  with pytest.raises(runtime.WorkerUnavailableError,
                     match=f'worker at {address} did not answer'):
    with runtime.remote_runtime([address], connect_timeout_seconds=1):
      pass


def test_stateful_clients_on_shards_across_workers(workers, tmp_path):
  # AdaBest on fused shards (the default): each worker takes whole shards
  # with their clients' stacked states; the run equals the local one, and
  # so do the client states it stored.
  args = ['--task=synthetic_partitioned', '--algorithm=adabest',
          '--num_clients=40', '--clients_per_round=8', '--total_rounds=3',
          '--rounds_per_eval=3', '--client_epochs=1', '--seed=2',
          f'--root_output_dir={tmp_path}']
  drivers = [
      _start(*args, '--experiment_name=remote',
             f'--worker_addresses={",".join(workers.addresses)}'),
      _start(*args, '--experiment_name=local')]
  _finish_all(drivers)
  remote, local = _metrics(tmp_path / 'remote'), _metrics(tmp_path / 'local')
  assert list(remote.columns) == list(local.columns)
  for column in remote.columns:
    np.testing.assert_allclose(remote[column], local[column], rtol=_RTOL,
                               atol=_ATOL, err_msg=column)
  states = sorted(os.listdir(tmp_path / 'remote' / 'client_states'))
  assert states == sorted(os.listdir(tmp_path / 'local' / 'client_states'))
  assert len([s for s in states if s.startswith('client-')]) >= 8
  for name in states:
    if name.startswith('client-'):
      np.testing.assert_allclose(
          np.fromfile(tmp_path / 'remote' / 'client_states' / name,
                      np.float32),
          np.fromfile(tmp_path / 'local' / 'client_states' / name,
                      np.float32), rtol=1e-5, atol=1e-6, err_msg=name)
