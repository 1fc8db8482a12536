"""The public API from a notebook: two rounds each of FedAvg, FedLamb,
AdaBest, SCAFFOLD and FedAvgCM + GeL on LEAF's Synthetic, no flags.

    python docs/notebook.py

The test suite runs this file (`tests/test_docs.py`).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import adabest_tff
from fl_engine import runtime
import gel_tff
import large_cohort
import tasks

task = tasks.create_task('synthetic', num_clients=40)
train = task.datasets.train_data
client_ids = train.client_ids[:5]
datasets = [task.datasets.train_preprocess_fn(
    train.create_tf_dataset_for_client(i)) for i in client_ids]


def two_rounds(name, process):
  state = process.initialize()
  for _ in range(2):
    state, metrics = process.next(state, datasets)
  print(name, 'loss', float(metrics['client_work']['train']['loss']))


with runtime.local_runtime():
  two_rounds('fedavg', large_cohort.build_fedopt(
      task.model_fn,
      client_optimizer=large_cohort.build_optimizer('sgd', 0.1),
      server_optimizer=large_cohort.build_optimizer('sgd', 1.0)))
  two_rounds('fedlamb', large_cohort.build_fedopt(
      task.model_fn,
      client_optimizer=large_cohort.build_optimizer('sgd', 0.1),
      server_optimizer=large_cohort.build_lamb(0.01)))
  # Stateful clients: the runner keeps each client's state between rounds.
  for name, builder in (('adabest', adabest_tff.build_adabest),
                        ('scaffold', adabest_tff.build_scaffold)):
    kwargs = {} if name == 'adabest' else {'population_size': len(
        train.client_ids)}
    runner = adabest_tff.StatefulClientRunner(builder(task.model_fn,
                                                      **kwargs))
    state = runner.initialize()
    for _ in range(2):
      state, metrics = runner.next(state, client_ids, datasets)
    print(name, 'loss', float(metrics['client_work']['train']['loss']))
  # Budget-limited clients: each trains on its budget of batches, then
  # guesses the rest of the steps along its momentum.
  budgets = gel_tff.StepBudgets(4, 13, seed=0)
  client_datasets_fn = gel_tff.build_client_datasets_fn(
      train, task.datasets.train_preprocess_fn, budgets)
  process = gel_tff.build_gel(task.model_fn, base='fedavgcm',
                              client_learning_rate=0.01, expected_steps=18)
  state = process.initialize()
  for round_num in (1, 2):
    state, metrics = process.next(state,
                                  client_datasets_fn(round_num, client_ids))
  print('fedavgcm_gel loss', float(metrics['client_work']['train']['loss']))
