"""The training loop's per-round data seeding (reproducible, the driver's
memory stays bounded) and its evaluator."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from experiment_driver import outputs
from experiment_driver import training_loop
from fl_engine import value_transfer
from fl_engine import shards
import tests

_REPO = tests.REPO


# Run in a fresh interpreter: in the test process, memory freed by earlier
# tests hides part of the growth from the resident size.
_MEASURE_GROWTH = """
import gc
import json
import sys
import tasks
from experiment_driver import training_loop

def resident_mb():
  gc.collect()
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024

def growth_over_rounds(task, seeded, rounds=30, clients_per_round=5):
  data = task.datasets
  client_ids = data.train_data.client_ids
  start = resident_mb()
  for round_num in range(rounds):
    if seeded:
      training_loop.seed_data_pipelines(0, round_num)
    for i in range(clients_per_round):
      client_id = client_ids[(round_num + i) % len(client_ids)]
      data.train_preprocess_fn(
          data.train_data.create_tf_dataset_for_client(client_id))
  return resident_mb() - start

task_name, task_kwargs, rounds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
modes = sys.argv[4].split(',')  # 'seeded' and/or 'unseeded'
task = tasks.create_task(task_name, **task_kwargs)
# Warm-up: the allocator's arenas and TensorFlow's caches fill first (half
# as many rounds as measured suffice: the growth after it stays flat).
growth = {'warm_up': growth_over_rounds(task, seeded=True, rounds=rounds // 2)}
for mode in modes:
  growth[mode] = growth_over_rounds(task, mode == 'seeded', rounds)
print(json.dumps(growth))
"""


def _growth_mb(task_name, task_kwargs, rounds, modes):
  """Driver memory growth (MB) over `rounds` rounds of 5 client datasets of
  a task, for each of `modes`: with (`seeded`) or without (`unseeded`) the
  training loop's per-round seeding."""
  result = subprocess.run(
      [sys.executable, '-c', _MEASURE_GROWTH, task_name,
       json.dumps(task_kwargs), str(rounds), ','.join(modes)],
      capture_output=True, text=True, cwd=_REPO, timeout=600,
      stdin=subprocess.DEVNULL, env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_client_datasets_do_not_accumulate_across_rounds():
  # Stack Overflow's preprocessing puts its 10k-word vocabulary in a map
  # function: ~0.6 MB per client dataset. TensorFlow 2.14's kernel cache kept
  # each one (+0.6 MB a dataset) unless something cleared it,
  # as seeding does; 2.21 keeps ~6 MB unseeded. Seeded, nothing may pile up.
  # The bound is a quarter of what that leak would add over these 300
  # datasets (~180 MB): allocator noise alone reached 17.7 MB over 150
  # datasets on a fresh machine.
  growth = _growth_mb('stackoverflow', {'use_synthetic_data': True}, 60,
                      ['seeded'])
  assert growth['seeded'] < 45.0, growth


def test_partitioned_client_datasets_do_not_accumulate_across_rounds():
  # AdaBest's bootstrapped epochs once counted each client's examples with an
  # eager `Dataset.reduce`, whose traced function outlived the dataset even
  # with seeding: ~0.4 MB per round of 5 clients, 28 MB over these 60 rounds.
  growth = _growth_mb('synthetic_partitioned', {'num_clients': 1000}, 60,
                      ['seeded'])
  assert growth['seeded'] < 6.0, growth


def _first_batch_ids(task, round_num):
  training_loop.seed_data_pipelines(7, round_num)
  data = task.datasets
  client_id = data.train_data.client_ids[0]
  dataset = data.train_preprocess_fn(
      data.train_data.create_tf_dataset_for_client(client_id))
  return next(iter(dataset))['x'].numpy()


def test_round_pipelines_depend_only_on_seed_and_round():
  task = tasks.create_task('emnist_l', use_synthetic_data=True, num_clients=4)
  first = _first_batch_ids(task, round_num=3)
  _first_batch_ids(task, round_num=4)  # other work in between
  np.testing.assert_array_equal(_first_batch_ids(task, round_num=3), first)
  assert not np.array_equal(_first_batch_ids(task, round_num=5), first)


def test_summary_takes_the_outermost_of_nested_measurements():
  # FedNova's aggregator around the diagnostics: both report `update_norm`;
  # the outer one is the server's step (after the tau_eff scaling).
  flat = {
      'aggregator/update_norm': 2.0,
      'aggregator/normalized_update/update_norm': 0.5,
      'aggregator/normalized_update/mean_pairwise_cosine': 0.1,
  }
  summary = training_loop.summarize_training_metrics(flat, 'accuracy')
  assert summary['update_norm'] == 2.0
  assert summary['mean_pairwise_cosine'] == 0.1
  # The order of the keys does not matter.
  reversed_flat = dict(reversed(list(flat.items())))
  assert training_loop.summarize_training_metrics(
      reversed_flat, 'accuracy')['update_norm'] == 2.0


def test_evaluator_serializes_its_clients_once(monkeypatch):
  task = tasks.create_task('synthetic')
  evaluator = training_loop.Evaluator(
      task, tasks.TASKS['synthetic'].accuracy_metric, max_clients=20,
      sample_seed=1)
  weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
  weights = tf.nest.map_structure(lambda v: v.numpy(), weights)
  serialized = []
  serialize = value_transfer._serialize_dataset
  monkeypatch.setattr(value_transfer, '_serialize_dataset',
                      lambda d: serialized.append(d) or serialize(d))
  first = evaluator(weights)
  second = evaluator(weights)
  # Every evaluation sends the messages prepared when the evaluator was
  # built, and scores the same clients the same way.
  assert not serialized
  assert first == second
  assert first['validation/num_examples'] > 0
  assert 0.0 <= first['test/accuracy'] <= 1.0


def test_a_round_in_which_no_client_contributed_reads_nan_and_warns():
  # Every client diverged: TFF's sums are 0 over 0 examples.
  flat = {'client_work/train/loss': 0.0,
          'client_work/train/sparse_categorical_accuracy': 0.0,
          'client_work/train/num_examples': 0.0}
  summary = training_loop.summarize_training_metrics(
      flat, 'sparse_categorical_accuracy')
  assert np.isnan(summary['train/loss'])
  assert np.isnan(summary['train/accuracy'])
  assert 'no client update reached the model' in outputs.progress_line(
      1, 10, 0.1, 0.1, summary)
  flat['client_work/train/num_examples'] = 4.0
  summary = training_loop.summarize_training_metrics(
      flat, 'sparse_categorical_accuracy')
  assert summary['train/loss'] == 0.0
  assert 'WARNING' not in outputs.progress_line(1, 10, 0.1, 0.1, summary)


def test_mean_state_norm_is_the_cohorts_mean_over_float_leaves():
  states = [
      {'h': [np.array([3.0, 0.0], np.float32), np.array([[4.0]], np.float32)],
       'last_round': np.int32(7)},  # ints are not part of the norm
      {'h': [np.zeros(2, np.float32), np.zeros((1, 1), np.float32)],
       'last_round': np.int32(0)},
  ]
  assert training_loop.mean_state_norm(states) == pytest.approx(2.5)
  assert np.isnan(training_loop.mean_state_norm([]))


def test_cohort_metrics_score_the_model_on_the_cohorts_training_data():
  task = tasks.create_task('synthetic')
  evaluator = training_loop.Evaluator(
      task, tasks.TASKS['synthetic'].accuracy_metric, max_clients=20,
      sample_seed=1)
  rng = np.random.default_rng(3)
  weights = tf.nest.map_structure(
      lambda v: rng.normal(size=v.shape).astype(np.float32),
      tff.learning.models.ModelWeights.from_model(task.model_fn()))
  ids = task.datasets.train_data.client_ids[5:12]
  metrics = evaluator.cohort_metrics(weights, evaluator.cohort_shards(ids))
  # Synthetic's model is a softmax regression: its prediction, in NumPy, on
  # the clients' training data batched for evaluation.
  kernel, bias = weights.trainable
  correct = examples = 0
  for client_id in ids:
    for batch in task.datasets.eval_preprocess_fn(
        task.datasets.train_data.create_tf_dataset_for_client(client_id)):
      predicted = np.argmax(batch['x'].numpy() @ kernel + bias, axis=-1)
      correct += int(np.sum(predicted == np.reshape(batch['y'].numpy(), -1)))
      examples += len(predicted)
  assert metrics['cohort/num_examples'] == examples
  # Pooled: a batch of up to 256 examples (per shard), not one per client.
  assert metrics['cohort/num_batches'] < len(ids)
  assert metrics['cohort/accuracy'] == pytest.approx(correct / examples)
  assert metrics['cohort/accuracy'] == metrics[
      'cohort/' + tasks.TASKS['synthetic'].accuracy_metric]
  assert 0.0 < metrics['cohort/accuracy'] < 1.0


@pytest.mark.parametrize('hold_examples', [True, False])
def test_pooled_evaluation_gives_the_per_client_evaluations_metrics(
    hold_examples):
  # --noper_client_eval: each shard scored as one client, in large batches.
  # Its example-weighted metrics are the per-client evaluation's sums
  # finalized; only the batch count and the percentiles differ.
  task = tasks.create_task('synthetic')
  name = tasks.TASKS['synthetic'].accuracy_metric
  rng = np.random.default_rng(5)
  weights = tf.nest.map_structure(
      lambda v: rng.normal(size=v.shape).astype(np.float32),
      tff.learning.models.ModelWeights.from_model(task.model_fn()))
  per_client, pooled = (
      training_loop.Evaluator(task, name, max_clients=300, sample_seed=1,
                              hold_examples=hold_examples,
                              per_client=per_client)(weights)
      for per_client in (True, False))
  batch_counts = {key for key in per_client if key.endswith('num_batches')}
  percentiles = {key for key in per_client if '_p' in key}
  assert percentiles == {f'test/accuracy_p{q}' for q in (5, 25, 50, 75, 95)}
  assert set(pooled) == set(per_client) - percentiles
  for key in set(pooled) - batch_counts:
    assert pooled[key] == pytest.approx(per_client[key], rel=1e-5), key
  assert 0.0 < pooled['test/accuracy'] < 1.0
  # 300 clients of ~11 examples: one batch each (and more) one by one; at
  # most a few batches of 256 per shard pooled.
  for key in batch_counts:
    assert per_client[key] >= 300
    assert pooled[key] <= -(-pooled[key.replace('num_batches',
                                                'num_examples')] // 256) + 4


def test_a_pooled_shard_holds_the_same_examples_in_large_batches():
  shard = {'rows': np.arange(7, dtype=np.int64),
           'batch_sizes': np.array([2, 1, 0, 0, 3, 1, 0], np.int64)}
  pooled = shards.pooled(shard, batch_size=3)
  np.testing.assert_array_equal(pooled['rows'], shard['rows'])
  np.testing.assert_array_equal(pooled['batch_sizes'], [3, 3, 1, 0])
  np.testing.assert_array_equal(
      shards.pooled(shard, batch_size=7)['batch_sizes'], [7, 0])
  empty = {'rows': np.zeros(0, np.int64), 'batch_sizes': np.zeros(2, np.int64)}
  np.testing.assert_array_equal(shards.pooled(empty, 4)['batch_sizes'], [0])
  with pytest.raises(ValueError, match='batch_size'):
    shards.pooled(shard, 0)
