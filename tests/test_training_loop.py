"""The training loop's per-round data seeding: reproducible, and the driver's
memory stays bounded."""

import gc

import numpy as np

import tasks
from experiment_driver import training_loop


def _resident_mb() -> float:
  gc.collect()
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise AssertionError('no VmRSS in /proc/self/status')


def _growth_over_rounds(task, seeded: bool, rounds: int = 30,
                        clients_per_round: int = 5) -> float:
  data = task.datasets
  client_ids = data.train_data.client_ids
  start = _resident_mb()
  for round_num in range(rounds):
    if seeded:
      training_loop.seed_data_pipelines(0, round_num)
    for i in range(clients_per_round):
      client_id = client_ids[(round_num + i) % len(client_ids)]
      data.train_preprocess_fn(
          data.train_data.create_tf_dataset_for_client(client_id))
  return _resident_mb() - start


def test_client_datasets_do_not_accumulate_across_rounds():
  # Stack Overflow's preprocessing puts its 10k-word vocabulary in a map
  # function: ~0.6 MB per client dataset that TensorFlow's kernel cache keeps
  # unless something clears it, as seeding does.
  task = tasks.create_task('stackoverflow', use_synthetic_data=True)
  # Warm-up: the allocator's arenas and TensorFlow's caches fill first.
  warm_up = [_growth_over_rounds(task, seeded=True) for _ in range(2)]
  bounded = _growth_over_rounds(task, seeded=True)
  accumulated = _growth_over_rounds(task, seeded=False)
  assert accumulated > 50.0  # 150 datasets kept: the check can fail
  assert bounded < 15.0, (warm_up, bounded, accumulated)


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
