"""The benchmark's rounds compute the same client work, and its code runs.

The limit is checked against a NumPy reference (local SGD of a softmax
regression), and every TFF round the benchmark times against the limit: with
no dropout and equally sized clients, one FedAvg round (server SGD at 1.0)
yields the mean of the clients' final weights, which the limit sums. The
measurement, table and file code runs on a tiny configuration; nothing here
asserts a speed.
"""

import collections
import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf

from bench import cores
from bench import e2e
from bench import evaluation
from bench import gpu
from bench import limit
from bench import memory
from bench import probe
from bench import ratios
from bench import report
from bench import tff_rounds
from bench import timing
from bench import workloads
from fl_engine import runtime
from fl_engine import shards

_FEATURES = 4
_CLASSES = 3


def _tiny_examples(rng, num_clients, examples_per_client):
  x = rng.normal(size=(num_clients, examples_per_client, _FEATURES))
  y = rng.integers(0, _CLASSES, (num_clients, examples_per_client, 1))
  return x.astype(np.float32), y.astype(np.int32)


# Softmax regression, Keras' default (random) kernel initializer; two batches
# per client. Its updates stay far below the adaptive clipping's initial norm
# of 1, so the driver's aggregator averages them unclipped.
TINY = workloads.Workload(
    name='tiny_softmax',
    keras_model_fn=lambda: tf.keras.Sequential([
        tf.keras.layers.Dense(_CLASSES, activation='softmax',
                              input_shape=(_FEATURES,))]),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
    make_examples=_tiny_examples,
    examples_per_client=6,
    batch_size=3,
    learning_rate=0.1,
)


def _numpy_client_weights(kernel, bias, x, y, workload):
  """Local SGD of softmax regression on one client's batches."""
  kernel, bias = kernel.copy(), bias.copy()
  for start in range(0, len(x), workload.batch_size):
    xb = x[start:start + workload.batch_size]
    yb = y[start:start + workload.batch_size, 0]
    logits = xb @ kernel + bias
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    grad_logits = (probs - np.eye(_CLASSES)[yb]) / len(xb)
    kernel -= workload.learning_rate * xb.T @ grad_logits
    bias -= workload.learning_rate * grad_logits.sum(axis=0)
  return kernel, bias


def _numpy_mean_client_weights(start, arrays, workload):
  finals = [_numpy_client_weights(start[0], start[1], arrays.x[c],
                                  arrays.y[c], workload)
            for c in range(arrays.num_clients)]
  return [np.mean([f[i] for f in finals], axis=0) for i in range(2)]


def test_limit_round_matches_numpy():
  arrays = TINY.client_arrays(3, seed=4)
  rng = np.random.default_rng(5)
  start = [rng.normal(size=(_FEATURES, _CLASSES)).astype(np.float32),
           rng.normal(size=(_CLASSES,)).astype(np.float32)]
  limit_round = limit.LimitRound(TINY, arrays)
  limit_round.set_start_weights(start)
  limit_round()
  expected = _numpy_mean_client_weights(start, arrays, TINY)
  for got, want in zip(limit_round.mean_client_weights(), expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  limit_round()  # every round restarts each client from the start weights
  for got, want in zip(limit_round.mean_client_weights(), expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _tff_round_against_the_limit(variant, arrays):
  """The TFF round's new model and the limit's mean client model."""
  tff_round = tff_rounds.round_for(
      tff_rounds.build_process(TINY, variant, arrays), TINY, arrays, variant)
  start = [np.asarray(w) for w in
           tff_round.process.get_model_weights(tff_round.state).trainable]
  # The server model starts from the model's own initializer, not zeros.
  assert np.abs(start[0]).max() > 0.1
  limit_round = limit.LimitRound(TINY, arrays)
  limit_round.set_start_weights(start)
  limit_round()
  tff_round()
  got = tff_round.process.get_model_weights(tff_round.state).trainable
  return start, got, limit_round.mean_client_weights()


@pytest.mark.parametrize('variant', tff_rounds.VARIANTS)
def test_tff_round_computes_the_limit_client_work(variant):
  start, got, expected = _tff_round_against_the_limit(
      variant, TINY.client_arrays(3, seed=6))
  update_norm = np.sqrt(sum(np.sum((e - s)**2)
                            for e, s in zip(expected, start)))
  assert 0 < update_norm < 1.0  # the premise of TINY: no clipping
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('variant', ['fedavg', 'package', 'fused',
                                     'resident'])
def test_tff_round_in_cohort_slices_computes_the_limit_client_work(variant):
  # 5 clients in slices of at most 2: three partial aggregates merged.
  with runtime.worker_runtime(max_clients_per_call=2):
    _, got, expected = _tff_round_against_the_limit(
        variant, TINY.client_arrays(5, seed=7))
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-6)


def test_the_shard_limit_does_the_limits_client_work():
  arrays = TINY.client_arrays(3, seed=4)
  limit_round = limit.LimitRound(TINY, arrays)
  flat = collections.OrderedDict(
      x=arrays.x.reshape((-1,) + arrays.x.shape[2:]),
      y=arrays.y.reshape((-1,) + arrays.y.shape[2:]))
  [shard] = shards.shards_from_arrays(
      flat, list(np.arange(len(flat['x'])).reshape(3, -1)),
      shards.BatchRecipe(batch_size=TINY.batch_size, shuffle=False), 3,
      np.random.default_rng(0))
  shard_round = limit.ShardLimitRound(TINY.keras_model_fn, TINY.loss_fn,
                                      TINY.learning_rate, shard)
  start = [np.full(v.shape, 0.1, np.float32)
           for v in TINY.keras_model_fn().trainable_variables]
  for round_fn in (limit_round, shard_round):
    round_fn.set_start_weights(start)
    round_fn()
  for a, b in zip(limit_round.mean_client_weights(),
                  shard_round.mean_client_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert not np.allclose(shard_round.mean_client_weights()[0], start[0])


def test_e2e_row_runs_the_driver_and_projects(monkeypatch):
  monkeypatch.setattr(e2e, '_LIMIT_ROUNDS', 1)
  row = e2e.measure_e2e(clients_per_round=5, rounds=2, rounds_per_eval=2)
  assert row['clients'] == 5 and row['rounds'] == 2
  assert 0 < row['startup_s'] < row['wall_s']
  # Round 1 starts after the imports and the build, before the rounds end.
  assert 2 < row['first_round_s'] < row['wall_s'] - row['round_s']
  assert 0 < row['eval_s'] < row['wall_s'] - row['startup_s']
  assert row['first_eval_s'] == row['eval_s']  # one evaluation: the first
  assert row['projected_s'] == pytest.approx(
      row['wall_s'] + (e2e.PROJECTED_ROUNDS - 2) * row['round_s'])
  assert row['ratio'] == pytest.approx(row['round_s'] / row['limit_round_s'])
  assert row['limit_onednn'] in ('default', 'on', 'off')


def test_eval_rows_score_the_same_model_per_client_and_pooled():
  rows = evaluation.measure_evaluation(rounds=2, clients_per_round=5)
  assert [r['evaluation'] for r in rows] == ['per client', 'pooled']
  # The same seed trains the same model; only the scoring's batching differs.
  assert rows[1]['test_accuracy'] == pytest.approx(rows[0]['test_accuracy'],
                                                   rel=1e-6)
  assert rows[1]['test_loss'] == pytest.approx(rows[0]['test_loss'], rel=1e-5)
  assert 0 < rows[0]['test_accuracy'] < 1
  assert rows[0]['ratio'] == 1.0
  assert rows[1]['ratio'] == pytest.approx(rows[1]['eval_s']
                                           / rows[0]['eval_s'])


def test_limit_rejects_partial_batches():
  uneven = workloads.Workload(
      name='uneven', keras_model_fn=TINY.keras_model_fn,
      loss_fn=TINY.loss_fn, make_examples=_tiny_examples,
      examples_per_client=5, batch_size=3)
  with pytest.raises(ValueError, match='examples_per_client=5'):
    limit.LimitRound(uneven, uneven.client_arrays(2))


@pytest.mark.parametrize('name', sorted(workloads.WORKLOADS))
def test_workload_data_match_their_element_spec(name):
  workload = workloads.get_workload(name)
  arrays = workload.client_arrays(2)
  assert arrays.x.shape[:2] == (2, workload.examples_per_client)
  assert workload.examples_per_client % workload.batch_size == 0
  dataset = workload.client_datasets(arrays)[1]
  assert dataset.element_spec == workload.element_spec()
  batches = list(dataset)
  assert len(batches) == workload.batches_per_client
  np.testing.assert_array_equal(batches[0]['x'],
                                arrays.x[1, :workload.batch_size])
  client_data = workload.client_data(arrays)
  assert sorted(client_data.client_ids) == ['0', '1']


def test_stackoverflow_labels_are_the_next_words():
  arrays = workloads.STACKOVERFLOW_LSTM.client_arrays(1)
  assert arrays.x.shape[-1] == workloads.STACKOVERFLOW_SEQUENCE_LENGTH
  np.testing.assert_array_equal(arrays.x[..., 1:], arrays.y[..., :-1])
  assert arrays.x.min() >= 1 and arrays.y.max() < workloads.STACKOVERFLOW_VOCAB


def test_bad_workload_requests_are_rejected():
  with pytest.raises(ValueError, match="'no_such_workload'"):
    workloads.get_workload('no_such_workload')
  with pytest.raises(ValueError, match='num_clients must be positive, got 0'):
    TINY.client_arrays(0)
  with pytest.raises(ValueError, match="'no_such_variant'"):
    tff_rounds.build_process(TINY, 'no_such_variant')


def test_time_interleaved_warms_up_then_alternates():
  calls = []
  functions = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
  timings = timing.time_interleaved(functions, repeats=3)
  assert calls == ['a', 'b'] * (timing.WARMUP_CALLS + 3)
  for t in timings.values():
    assert len(t.wall_samples) == 3
    assert t.wall_seconds == min(t.wall_samples)
    assert t.cpu_seconds >= 0
  with pytest.raises(ValueError, match='repeats must be positive, got 0'):
    timing.time_interleaved(functions, repeats=0)


def test_time_interleaved_takes_more_samples_within_its_budget():
  calls = []

  def sleeper(name, seconds):
    return lambda: (calls.append(name), time.sleep(seconds))

  functions = {'a': sleeper('a', 0.01), 'b': sleeper('b', 0.01)}
  # A timed round takes ~0.02 s: a 0.2 s budget affords ~10, capped at 6.
  timings = timing.time_interleaved(functions, repeats=2, budget_seconds=0.2,
                                    max_repeats=6)
  # The warm-ups, then 6 timed rounds.
  assert calls == ['a', 'b'] * (timing.WARMUP_CALLS + 6)
  assert all(len(t.wall_samples) == 6 for t in timings.values())
  # A budget that affords less than `repeats` still takes `repeats`.
  calls.clear()
  timing.time_interleaved(functions, repeats=3, budget_seconds=0.001)
  assert calls == ['a', 'b'] * (timing.WARMUP_CALLS + 3)
  with pytest.raises(ValueError, match='max_repeats=2 is below repeats=3'):
    timing.time_interleaved(functions, repeats=3, max_repeats=2)


def test_worker_pid_finds_the_worker_serving_an_address():
  with runtime.worker_runtime() as address:
    pid = timing.worker_pid(address)
    assert psutil.Process(pid).name() == timing.WORKER_PROCESS_NAME
  with pytest.raises(RuntimeError, match='serving localhost:1'):
    timing.worker_pid('localhost:1')


def test_measure_ratios_reports_each_round_against_the_limit():
  rows = ratios.measure_ratios(TINY, [2, 4], repeats=1, variants=['fedavg'],
                               limit_in_child=False)
  assert [r['clients'] for r in rows] == [2, 4]
  for row in rows:
    assert row['workload'] == 'tiny_softmax'
    assert row['limit_s'] > 0 and row['fedavg_s'] > 0
    assert row['fedavg_ratio'] == row['fedavg_s'] / row['limit_s']
    if row['limit_cpu_s'] > 0:  # else below the CPU clock's resolution
      assert row['fedavg_cpu_ratio'] == (row['fedavg_cpu_s'] /
                                         row['limit_cpu_s'])
    else:
      assert np.isnan(row['fedavg_cpu_ratio'])
  with pytest.raises(ValueError, match='Cohort sizes must be positive'):
    ratios.measure_ratios(TINY, [0], repeats=1)
  # The child builds the workload by name: TINY is not registered.
  with pytest.raises(ValueError, match='tiny_softmax'):
    ratios.measure_ratios(TINY, [2], repeats=1, variants=['fedavg'])


def test_the_local_round_is_the_resident_round_in_process():
  """`local` times the resident process in this process, beside the rounds
  on the worker (that both compute the same: `tests/fl_engine/runtime/test_in_process.py`)."""
  with runtime.local_context() as (local_context, _), \
      runtime.worker_runtime(keep_state_on_worker=True):
    rows = ratios.measure_ratios(TINY, [4], repeats=1, variants=['resident'],
                                 limit_in_child=False,
                                 local_context=local_context)
  row, = rows
  assert row['local_s'] > 0
  assert row['local_ratio'] == row['local_s'] / row['limit_s']


def test_measure_ratios_takes_the_faster_local_setting():
  """`local` is the faster of the local round here and in a child with
  oneDNN off, as the driver picks the setting per task."""
  with runtime.local_context() as (local_context, _), \
      runtime.worker_runtime(keep_state_on_worker=True):
    [row] = ratios.measure_ratios(workloads.get_workload('synthetic_lr'), [2],
                                  repeats=1, variants=['resident'],
                                  local_context=local_context)
  here, off = row['local_here_s'], row['local_onednn_off_s']
  assert row['local_s'] == min(here, off) > 0
  assert row['local_onednn'] == (limit.onednn_setting() if here <= off
                                 else 'off')
  assert row['local_ratio'] == row['local_s'] / row['limit_s']
  assert 'local_here_ratio' not in row


def test_the_local_round_in_a_child_runs_without_onednn():
  with limit.RoundInChild(limit.LOCAL, 'synthetic_lr', 3) as child:
    assert child.setting() == 'off'
    child()
    child()
  with pytest.raises(RuntimeError, match='local round.s child process ended'):
    child()
  with pytest.raises(ValueError, match='kind must be'):
    limit.RoundInChild('remote', 'synthetic_lr', 3)


def test_the_floor_round_takes_the_resident_shards_and_does_no_work():
  arrays = TINY.client_arrays(5, seed=3)
  resident = tff_rounds.build_process(TINY, 'resident', arrays)
  floor_round = tff_rounds.round_for(tff_rounds.FloorProcess(resident), TINY,
                                     arrays, tff_rounds.FLOOR)
  start = resident.get_model_weights(resident.initialize())
  for _ in range(2):
    floor_round()
  for a, b in zip(start.trainable, floor_round.state.trainable):
    np.testing.assert_array_equal(a, b)
  assert np.abs(start.trainable[0]).max() > 0.1
  [row] = ratios.measure_ratios(TINY, [3], repeats=1, variants=['resident'],
                                limit_in_child=False)
  assert row['floor_s'] > 0
  assert row['floor_ratio'] == row['floor_s'] / row['limit_s']
  [row] = ratios.measure_ratios(TINY, [3], repeats=1, variants=['fedavg'],
                                limit_in_child=False)
  assert 'floor_s' not in row


def test_the_limit_in_a_child_without_onednn_does_the_same_work():
  workload = workloads.get_workload('synthetic_lr')
  here = limit.LimitRound(workload, workload.client_arrays(3, seed=2))
  start = [np.full(w.shape, 0.01 * k, np.float32)
           for k, w in enumerate(here.mean_client_weights())]
  here.set_start_weights(start)
  here()
  with limit.LimitInChild('synthetic_lr', 3, seed=2) as child:
    assert child.setting() == 'off'
    child.set_start_weights(start)
    child()
    for got, want in zip(child.mean_client_weights(),
                         here.mean_client_weights(), strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(child.mean_client_weights()[0], start[0])
  with pytest.raises(RuntimeError, match='child process ended'):
    child()
  with pytest.raises(ValueError, match='Unknown workload'):
    limit.LimitInChild('no_such_workload', 1)


def test_measure_ratios_takes_the_faster_limit_setting():
  [row] = ratios.measure_ratios(workloads.get_workload('synthetic_lr'), [2],
                                repeats=1, variants=['fedavg'])
  here, off = row['limit_here_s'], row['limit_onednn_off_s']
  assert row['limit_s'] == min(here, off) > 0
  assert row['limit_onednn'] == (limit.onednn_setting() if here <= off
                                 else 'off')
  assert row['fedavg_ratio'] == row['fedavg_s'] / row['limit_s']


def test_environment_is_restored_after_the_block(monkeypatch):
  monkeypatch.setenv(limit.ONEDNN_VARIABLE, '1')
  monkeypatch.delenv('FL_BENCH_UNSET', raising=False)
  with limit.environment({limit.ONEDNN_VARIABLE: '0', 'FL_BENCH_UNSET': 'x'}):
    assert limit.onednn_setting() == 'off'
    assert os.environ['FL_BENCH_UNSET'] == 'x'
  assert limit.onednn_setting() == 'on'
  assert 'FL_BENCH_UNSET' not in os.environ


def test_per_client_rows_normalize_by_the_smallest_cohort():
  rows = [{'workload': 'w', 'clients': 50, 'limit_s': 5.0, 'package_s': 6.0},
          {'workload': 'w', 'clients': 10, 'limit_s': 1.0, 'package_s': 1.5},
          {'workload': 'v', 'clients': 20, 'limit_s': 4.0, 'package_s': 4.0}]
  scaling = ratios.per_client_rows(rows, ('limit', 'package'))
  assert scaling[0]['limit_ms_per_client'] == pytest.approx(100.0)
  assert scaling[0]['limit_vs_smallest'] == pytest.approx(1.0)
  assert scaling[0]['package_vs_smallest'] == pytest.approx(0.12 / 0.15)
  assert scaling[1]['package_vs_smallest'] == pytest.approx(1.0)
  assert scaling[2]['package_ms_per_client'] == pytest.approx(200.0)
  assert scaling[2]['package_vs_smallest'] == pytest.approx(1.0)


def test_format_table_aligns_columns_and_leaves_missing_cells_blank():
  text = report.format_table(
      'T', [{'name': 'a', 'x': 1.23456}, {'name': 'long name'}],
      [('name', 'name', 's'), ('x', 'x value', '.2f')])
  lines = text.splitlines()
  assert lines[:2] == ['T', '-']
  assert lines[2].split() == ['name', 'x', 'value']
  assert lines[3].split() == ['a', '1.23']
  assert lines[4].strip() == 'long name'
  assert len({len(line) for line in lines[2:]}) == 1


def test_write_tables_as_json_and_csv(tmp_path):
  tables = {'ratios': [{'clients': 10, 'limit_s': 0.5}],
            'memory': [{'algorithm': 'fedavg', 'driver_peak_mb': 12.0}]}
  json_path = os.path.join(tmp_path, 'sub', 'bench.json')
  report.write_tables(json_path, tables)
  with open(json_path) as f:
    assert json.load(f) == tables
  csv_path = os.path.join(tmp_path, 'bench.csv')
  report.write_tables(csv_path, tables)
  with open(csv_path) as f:
    rows = list(csv.reader(f))
  assert rows[0] == ['table', 'row', 'field', 'value']
  assert ['ratios', '0', 'limit_s', '0.5'] in rows
  assert ['memory', '0', 'algorithm', 'fedavg'] in rows
  assert len(rows) == 5
  with pytest.raises(ValueError, match="'bench.txt'"):
    report.write_tables('bench.txt', tables)


def test_peak_memory_of_stateful_rounds_through_the_training_loop():
  result = memory.measure_peak_memory('adabest', TINY, num_clients=3,
                                      rounds=1)
  assert result['algorithm'] == 'adabest'
  assert result['clients'] == 3
  assert result['data_mb'] == pytest.approx(3 * 6 * (4 * 4 + 4) / 2**20)
  assert result['driver_peak_mb'] >= result['driver_start_mb'] > 0
  assert result['worker_peak_mb'] > 0
  with pytest.raises(ValueError, match="'sgd'"):
    memory.measure_peak_memory('sgd', TINY, num_clients=3)


@pytest.mark.parametrize('algorithm', ['fused', 'resident', 'fused_adabest'])
def test_peak_memory_of_fused_rounds_through_the_training_loop(algorithm):
  result = memory.measure_peak_memory(algorithm, TINY, num_clients=3,
                                      rounds=1)
  assert result['algorithm'] == algorithm and result['clients'] == 3
  assert result['driver_peak_mb'] >= result['driver_start_mb'] > 0
  assert result['worker_peak_mb'] > result['worker_file_mb'] > 0


def test_memory_series_skips_sizes_predicted_to_exhaust_memory(monkeypatch):
  measured = []

  def fake_run(algorithm, workload_name, num_clients, rounds,
               max_clients_per_call):
    del rounds, max_clients_per_call
    measured.append(num_clients)
    # 100 MB before training, +1 MB (driver) and +2 MB (worker) per client.
    return {'algorithm': algorithm, 'workload': workload_name,
            'clients': num_clients, 'driver_start_mb': 100.0,
            'driver_peak_mb': 100.0 + num_clients,
            'worker_peak_mb': 2.0 * num_clients}

  monkeypatch.setattr(memory, 'run_in_subprocess', fake_run)
  available = type('Memory', (), {'available': 2000 * 2**20})
  monkeypatch.setattr(psutil, 'virtual_memory', lambda: available)
  # Budget 3/4 of 2,000 MB: 400 clients predict 100 + 3 * 400 = 1,300 MB
  # (run), 500 clients 1,600 MB (skipped), and 600, predicted from 400
  # measured, 1,900 MB (skipped).
  rows = memory.measure_series('fedavg', 'w', [400, 100, 600, 300, 500],
                               max_clients_per_call=50)
  assert measured == [100, 300, 400]
  assert [r['clients'] for r in rows] == [100, 300, 400, 500, 600]
  assert 'skipped' not in rows[2]
  assert rows[3]['skipped'] == (
      'predicted 1600 MB > 3/4 of the available memory (1500 MB)')
  assert rows[4]['skipped'].startswith('predicted 1900 MB')
  assert rows[4]['clients_per_call'] == '50'


def test_speedup_keeps_each_setting_fastest_of_alternating_trials(
    monkeypatch):
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
  times = iter([4.0, 8.0, 2.0, 3.0, 5.0, 6.0, 1.5, 4.0])
  calls = []

  def fake_measure(cpus, workload_name, num_clients, repeats,
                   max_clients_per_call):
    del workload_name, num_clients, repeats, max_clients_per_call
    calls.append(list(cpus))
    return {'limit_s': next(times), 'package_s': next(times)}

  monkeypatch.setattr(cores, '_measure_with_cpus', fake_measure)
  rows = cores.measure_speedup('emnist_cnn', 10, repeats=1, trials=2)
  assert calls == [[0], [0, 1], [0], [0, 1]]
  limit_row, package_row = rows
  assert (limit_row['one_core_s'], limit_row['all_cores_s']) == (4.0, 1.5)
  assert limit_row['speedup'] == pytest.approx(4.0 / 1.5)
  assert (package_row['one_core_s'], package_row['all_cores_s']) == (6.0, 3.0)
  assert package_row['cores'] == 2
  with pytest.raises(ValueError, match='trials must be positive, got 0'):
    cores.measure_speedup('emnist_cnn', 10, repeats=1, trials=0)


def test_speedup_needs_two_cores(monkeypatch):
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {3})
  with pytest.raises(ValueError, match=r'Only CPU \[3\]'):
    cores.measure_speedup('emnist_cnn', 10, repeats=1)


def test_probe_rejects_unknown_requests():
  with pytest.raises(ValueError, match="'timing'"):
    probe.run({'kind': 'timing'})


def test_bench_gpu_times_each_device_and_says_where_ops_ran(tmp_path):
  """Without a GPU: one line says so and the CPU is timed, with the ops it
  ran; above `cpu_max_clients` the CPU's time per client stands in."""
  lines = []
  head, rows = gpu.run(['emnist_cnn'], [2, 3], rounds=1, cpu_max_clients=2,
                       print_fn=lines.append)
  assert head.startswith('no GPU visible to TensorFlow: timing the CPU')
  assert lines[0] == head and len(lines) == 3
  measured, extrapolated = rows
  assert measured['device'] == '/device:CPU:0'
  assert measured['basis'] == 'measured' and measured['round_s'] > 0
  assert measured['ops'].startswith('CPU:0: ')
  assert int(measured['ops'].split(': ')[1]) > 100
  assert extrapolated['basis'] == 'per client of 2'
  assert extrapolated['round_s'] == pytest.approx(measured['round_s'] * 1.5)
  path = gpu.write_report(str(tmp_path / 'gpu'), 'python -m bench.gpu', head,
                          rows)
  text = open(path).read()
  assert head in text and 'emnist_cnn' in text and 'per client of 2' in text


@pytest.mark.parametrize('args', [['--sections=ratios'], ['--quick']])
def test_eval_rounds_is_refused_where_it_would_do_nothing(args):
  result = subprocess.run(
      [sys.executable, '-m', 'bench.round_time', '--eval_rounds=3', *args],
      capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
          os.path.dirname(os.path.abspath(__file__)))), check=False)
  assert result.returncode != 0
  assert '--eval_rounds only sets the eval section' in result.stderr


def test_long_run_samples_the_drivers_memory_and_its_growth_after_warm_up():
  from bench import long_run  # pylint: disable=g-import-not-at-top
  rows = long_run.measure_long_run(rounds=30, clients_per_round=3,
                                   sample_every=10, warm_up=10)
  assert [row['round'] for row in rows] == [10, 20, 30]
  assert all(200 < row['rss_mb'] < 20_000 for row in rows)
  assert rows[0]['growth_mb'] == 0.0
  assert rows[2]['growth_mb'] == rows[2]['rss_mb'] - rows[0]['rss_mb']
  assert rows[2]['within_bound'] == (
      'yes' if rows[2]['growth_mb'] <= long_run.BOUND_MB else 'NO')
  with pytest.raises(ValueError, match='warm_up'):
    long_run.measure_long_run(rounds=30, sample_every=10, warm_up=15)
