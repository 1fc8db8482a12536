"""Peak resident memory of training rounds, driver and worker.

`measure_peak_memory` runs `rounds` rounds of an algorithm through the
package's training loop (`experiment_driver.training_loop.run_training`, the
loop `run_experiment.py` uses, with its evaluation, checkpoints and, for
stateful algorithms, the `fl_engine.client_state_store` on disk), every
client of a population of `num_clients` taking part in every round, and
reports the peak resident set size (Linux `VmHWM`) of this process (the
driver) and of its `worker_binary`. The driver's peak is reset after the
client data are built, so it counts what training adds on top of the data
held in memory (`data_mb`).

Algorithms: `fedavg`, the driver's FedAvg round (`large_cohort.fedopt` with
the driver's default aggregator), stateless; `fused`, the same round on
fused shards as the driver runs it (`build_fedopt(..., execution=OnShards())`, one shard per
core, `fl_engine.shards.shards_for_round`); `adabest`,
`adabest_tff.adabest.build_adabest` at its defaults, whose clients each keep
a model-sized state between rounds; `fused_adabest`, the same on fused
shards (`execution=OnShards()`), the shards' client states stacked;
`resident`, the fused round as the driver runs it on array-backed clients
(Synthetic, the partitioned image tasks): the population's examples held
on the worker (`fl_engine.resident.ResidentExamples`, files it
memory-maps, counted in its resident set as it touches them) and shards of
rows.

Run it in a fresh process per measurement (`run_in_subprocess`), so the peaks
of one measurement do not carry over to the next. `measure_series` runs a
series of growing populations and skips a size whose peak, extrapolated
linearly from the previous size, would take more than three quarters of the
machine's available memory. The extrapolation scales the fixed part of each
peak too (TensorFlow's ~0.3 GB in the worker), so it overestimates: AdaBest
with 1,000 clients of `emnist_linear` in one call is predicted at ~10.7 GB
from its 100-client peaks and measured at ~9 GB, driver and worker together
(with the two-layer EMNIST model it peaks at ~22 GB).
"""

import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import psutil
import tensorflow_federated as tff

from adabest_tff import adabest
from bench import tff_rounds
from bench import timing
from bench import workloads
from experiment_driver import algorithm_setup
from experiment_driver import outputs
from fl_engine import runtime
from experiment_driver import training_loop
from fl_engine import execution
from fl_engine import shards

ALGORITHMS = ('fedavg', 'fused', 'resident', 'adabest', 'fused_adabest')
# The algorithms whose rounds run on shards, one TFF client per core.
ON_SHARDS = ('fused', 'resident', 'fused_adabest')
_NUM_TEST_CLIENTS = 2
# The share of the available memory a measurement may be predicted to take.
_MEMORY_BUDGET_FRACTION = 0.75
_BYTES_PER_MB = 2**20


def _status_kilobytes(pid: int | str, field: str) -> int:
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1])
  raise ValueError(f'/proc/{pid}/status has no {field}.')


def _reset_peak_rss() -> None:
  """Resets this process's `VmHWM` to its current RSS (Linux >= 4.0)."""
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')


def _task(
    workload: workloads.Workload, num_clients: int, array_backed: bool = False
) -> tuple[tff.simulation.baselines.BaselineTask, workloads.ClientArrays]:
  """A task on random client data, and its training arrays. With
  `array_backed`, its training clients are rows of shared arrays and its
  pipeline has a batch recipe, as `tasks.synthetic`'s, which is what a
  fused process can hold (`fl_engine.resident.resident_examples`)."""
  train = workload.client_arrays(num_clients, seed=0)
  train_data = workload.client_data(train)
  preprocess = workload.preprocess
  if array_backed:
    train_data.arrays = tff_rounds.flat_examples(train)
    per_client = train.x.shape[1]
    train_data.client_rows = lambda client_id: np.arange(
        int(client_id) * per_client, (int(client_id) + 1) * per_client)

    def batches_in_order(dataset):  # The workload's pipeline, described.
      return workload.preprocess(dataset)

    batches_in_order.batch_recipe = dict(batch_size=workload.batch_size,
                                         shuffle=False)
    preprocess = batches_in_order
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=workload.client_data(
          workload.client_arrays(_NUM_TEST_CLIENTS, seed=1)),
      train_preprocess_fn=preprocess,
      eval_preprocess_fn=workload.preprocess)
  task = tff.simulation.baselines.BaselineTask(datasets,
                                               workload.tff_model_fn())
  return task, train


def _process(
    algorithm: str, workload: workloads.Workload,
    train: workloads.ClientArrays) -> tff.learning.templates.LearningProcess:
  if algorithm in ('fedavg', 'fused', 'resident'):
    variant = 'package' if algorithm == 'fedavg' else algorithm
    return tff_rounds.build_process(workload, variant, train)
  return adabest.build_adabest(
      workload.tff_model_fn(),
      execution=(execution.OnShards() if algorithm == 'fused_adabest' else
                 execution.PER_CLIENT))


def _shards_fn(task: tff.simulation.baselines.BaselineTask,
               rows_only: bool = False):
  """The driver's shards of a round's clients (one per core, cut to
  `shards.MAX_AUTO_SHARD_BYTES`; with `rows_only`, rows of the held
  examples)."""
  data = task.datasets

  def client_datasets_fn(round_num, client_ids):
    return shards.shards_for_round(
        data.train_data, data.train_preprocess_fn, client_ids,
        shards.auto_clients_per_shard(len(client_ids)),
        np.random.default_rng(round_num),
        max_shard_bytes=shards.MAX_AUTO_SHARD_BYTES, rows_only=rows_only)

  return client_datasets_fn


def measure_peak_memory(
    algorithm: str, workload: workloads.Workload, num_clients: int,
    rounds: int = 2,
    max_clients_per_call: Optional[int] = None) -> dict[str, Any]:
  """Trains `rounds` rounds with all `num_clients` clients; returns the peaks.

  Args:
    algorithm: One of `ALGORITHMS`.
    workload: The model and client data.
    num_clients: The population, every client of which takes part in every
      round.
    rounds: How many rounds to train.
    max_clients_per_call: The local runtime's cohort slices
      (`fl_engine.runtime.local_runtime`); `None`: no slicing.

  Returns:
    A dict with `algorithm`, `workload`, `clients`, `clients_per_call`,
    `data_mb` (the training arrays), `driver_start_mb` (the driver's RSS once
    the data are built), `driver_peak_mb`, `worker_peak_mb` and
    `worker_file_mb` (the worker's file-backed resident pages at the end).

  Raises:
    ValueError: For an unknown algorithm, or non-positive `num_clients` or
      `rounds`.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(
        f'Unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}.')
  if rounds < 1:
    raise ValueError(f'rounds must be positive, got {rounds}.')
  resident = algorithm == 'resident'
  task, train = _task(workload, num_clients, array_backed=resident)
  with tempfile.TemporaryDirectory() as root, runtime.worker_runtime(
      max_clients_per_call=max_clients_per_call,
      keep_state_on_worker=True) as address:
    worker_pid = timing.worker_pid(address)
    setup = algorithm_setup.AlgorithmSetup(
        process=_process(algorithm, workload, train),
        client_datasets_fn=(
            _shards_fn(task, rows_only=resident)
            if algorithm in ON_SHARDS else None))
    config = training_loop.LoopConfig(
        total_rounds=rounds, cohort_size_fn=lambda _: num_clients,
        rounds_per_eval=rounds, rounds_per_checkpoint=rounds,
        max_eval_clients=_NUM_TEST_CLIENTS, seed=0,
        accuracy_name=workloads.ACCURACY_METRIC_NAME, print_fn=lambda _: None)
    run_dir = outputs.RunDirectory(root, 'memory', {})
    gc.collect()
    driver_start_kb = _status_kilobytes('self', 'VmRSS')
    _reset_peak_rss()
    training_loop.run_training(setup, task, run_dir, config)
    # `VmHWM` is only raised when pages are unmapped, so memory the allocator
    # returned with `madvise` can leave it below an RSS seen earlier.
    driver_peak_kb = max(driver_start_kb,
                         _status_kilobytes('self', 'VmHWM'),
                         _status_kilobytes('self', 'VmRSS'))
    worker_peak_kb = _status_kilobytes(worker_pid, 'VmHWM')
    # Pages of files the worker maps count in its resident set but are the
    # page cache's, shared and reclaimable: their share at the end, between
    # calls (its binary's and libraries'; a `resident` process's examples
    # are mapped only during a call, `ImmutableConst`, so its peak counts up
    # to `data_mb` of them that the end does not show).
    worker_file_kb = _status_kilobytes(worker_pid, 'RssFile')
  return {
      'algorithm': algorithm,
      'workload': workload.name,
      'clients': num_clients,
      'clients_per_call': _clients_per_call(max_clients_per_call),
      'data_mb': (train.x.nbytes + train.y.nbytes) / _BYTES_PER_MB,
      'driver_start_mb': driver_start_kb / 1024,
      'driver_peak_mb': driver_peak_kb / 1024,
      'worker_peak_mb': worker_peak_kb / 1024,
      'worker_file_mb': worker_file_kb / 1024,
  }


def _clients_per_call(max_clients_per_call: Optional[int]) -> str:
  return 'all' if max_clients_per_call is None else str(max_clients_per_call)


def run_in_subprocess(
    algorithm: str, workload_name: str, num_clients: int, rounds: int = 2,
    max_clients_per_call: Optional[int] = None) -> dict[str, Any]:
  """`measure_peak_memory` in a fresh Python process (`bench.probe`)."""
  request = {'kind': 'memory', 'algorithm': algorithm,
             'workload': workload_name, 'clients': num_clients,
             'rounds': rounds, 'max_clients_per_call': max_clients_per_call}
  completed = subprocess.run(
      [sys.executable, '-m', 'bench.probe', json.dumps(request)],
      capture_output=True, text=True, check=False,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if completed.returncode:
    raise RuntimeError(
        f'memory probe {request} failed:\n{completed.stderr[-3000:]}')
  return json.loads(completed.stdout.strip().splitlines()[-1])


def measure_series(
    algorithm: str, workload_name: str, populations: Sequence[int],
    rounds: int = 2,
    max_clients_per_call: Optional[int] = None) -> list[dict[str, Any]]:
  """`run_in_subprocess` for each population, smallest first.

  A population whose total peak (the driver's memory before training, plus
  what training added to it and the worker's peak, both scaled in proportion
  to the clients from the largest population measured) exceeds three
  quarters of the available memory is not run: its row holds `skipped`,
  the reason.
  """
  rows = []
  last = None
  for num_clients in sorted(populations):
    if last is not None:
      growth = num_clients / last['clients']
      predicted_mb = last['driver_start_mb'] + growth * (
          last['driver_peak_mb'] - last['driver_start_mb'] +
          last['worker_peak_mb'])
      budget_mb = (psutil.virtual_memory().available / _BYTES_PER_MB *
                   _MEMORY_BUDGET_FRACTION)
      if predicted_mb > budget_mb:
        rows.append({
            'algorithm': algorithm, 'workload': workload_name,
            'clients': num_clients,
            'clients_per_call': _clients_per_call(max_clients_per_call),
            'skipped': f'predicted {predicted_mb:.0f} MB > 3/4 of the '
                       f'available memory ({budget_mb:.0f} MB)'})
        continue
    last = run_in_subprocess(algorithm, workload_name, num_clients, rounds,
                             max_clients_per_call)
    rows.append(last)
  return rows
