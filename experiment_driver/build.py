"""Builds the task, the learning process and the run directory from flags."""

import os
from typing import Any

from absl import flags
import tensorflow as tf
import tensorflow_federated as tff

from experiment_driver import algorithm_setup
from experiment_driver import fedopt_setup
from experiment_driver import flag_groups as f
from experiment_driver import outputs
from experiment_driver import tuned_defaults
from large_cohort import optimizers
import tasks

FLAGS = flags.FLAGS
ALGORITHMS = {**fedopt_setup.ALGORITHMS}
# Flags that change where or how fast a run goes, not what it computes: a run
# may be resumed with other values of these.
_NOT_HPARAMS = frozenset({
    'root_output_dir', 'experiment_name', 'total_rounds',
    'rounds_per_checkpoint', 'max_concurrent_clients',
})


def hparams() -> dict[str, Any]:
  """The values of every flag defined by this package's driver modules."""
  values = {}
  for module, module_flags in FLAGS.flags_by_module_dict().items():
    if 'experiment_driver' not in module:
      continue
    for flag in module_flags:
      if flag.name not in _NOT_HPARAMS:
        values[flag.name] = flag.value
  return dict(sorted(values.items()))


def experiment_name() -> str:
  return f.EXPERIMENT_NAME.value or (
      f'{f.TASK.value}_{f.ALGORITHM.value}_{f.CLIENT_OPTIMIZER.value}_'
      f'{f.SERVER_OPTIMIZER.value}_M{f.CLIENTS_PER_ROUND.value}_'
      f'seed{f.SEED.value}')


def create_task() -> tff.simulation.baselines.BaselineTask:
  if f.TASK.value not in tasks.TASK_NAMES:
    raise ValueError(f'unknown --task={f.TASK.value!r}; choose one of '
                     f'{", ".join(tasks.TASK_NAMES)}')
  batch_size = (f.TRAIN_BATCH_SIZE.value or
                tasks.DEFAULT_TRAIN_BATCH_SIZE[f.TASK.value])
  return tasks.create_task(
      f.TASK.value,
      train_batch_size=batch_size,
      eval_batch_size=f.EVAL_BATCH_SIZE.value,
      num_epochs=f.CLIENT_EPOCHS.value,
      max_elements_per_client=f.MAX_ELEMENTS_PER_CLIENT.value,
      data_dir=f.DATA_DIR.value,
      use_synthetic_data=f.USE_SYNTHETIC_DATA.value,
      validation_fraction=f.VALIDATION_FRACTION.value,
      seed=f.SEED.value,
  )


def build_context(
    task: tff.simulation.baselines.BaselineTask) -> algorithm_setup.BuildContext:
  """Builds the optimizers and aggregator shared by every algorithm."""
  num_train_clients = len(task.datasets.train_data.client_ids)
  if f.CLIENTS_PER_ROUND.value > num_train_clients:
    raise ValueError(
        f'--clients_per_round={f.CLIENTS_PER_ROUND.value} is larger than the'
        f' {num_train_clients} training clients of --task={f.TASK.value}')
  server_lr, client_lr = tuned_defaults.learning_rates(
      f.TASK.value, f.SERVER_OPTIMIZER.value,
      fedsgd=f.ALGORITHM.value == 'fedsgd')
  if f.SERVER_LEARNING_RATE.value is not None:
    server_lr = f.SERVER_LEARNING_RATE.value
  if f.CLIENT_LEARNING_RATE.value is not None:
    client_lr = f.CLIENT_LEARNING_RATE.value
  client_optimizer = optimizers.build_optimizer(
      f.CLIENT_OPTIMIZER.value, client_lr, momentum=f.CLIENT_MOMENTUM.value,
      beta_1=f.CLIENT_BETA_1.value, beta_2=f.CLIENT_BETA_2.value,
      epsilon=f.CLIENT_EPSILON.value)
  server_optimizer = optimizers.build_optimizer(
      f.SERVER_OPTIMIZER.value, server_lr, momentum=f.SERVER_MOMENTUM.value,
      beta_1=f.SERVER_BETA_1.value, beta_2=f.SERVER_BETA_2.value,
      epsilon=f.SERVER_EPSILON.value)
  model_aggregator = tff.learning.robust_aggregator(
      zeroing=f.ZEROING.value, clipping=f.CLIPPING.value,
      weighted=not f.UNIFORM_WEIGHTING.value)
  return algorithm_setup.BuildContext(
      task_name=f.TASK.value,
      task=task,
      client_optimizer=client_optimizer,
      server_optimizer=server_optimizer,
      client_learning_rate=client_lr,
      server_learning_rate=server_lr,
      model_aggregator=model_aggregator,
      uniform_weighting=f.UNIFORM_WEIGHTING.value,
      clients_per_round=f.CLIENTS_PER_ROUND.value,
      num_train_clients=num_train_clients,
      total_rounds=f.TOTAL_ROUNDS.value,
      seed=f.SEED.value,
  )


def build_algorithm(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  if f.ALGORITHM.value not in ALGORITHMS:
    raise ValueError(f'unknown --algorithm={f.ALGORITHM.value!r}; choose one'
                     f' of {", ".join(sorted(ALGORITHMS))}')
  # Model initialization inside the process is seeded by the graph seed.
  tf.keras.utils.set_random_seed(f.SEED.value)
  return ALGORITHMS[f.ALGORITHM.value](ctx)


def run_directory() -> outputs.RunDirectory:
  return outputs.RunDirectory(
      os.path.expanduser(f.ROOT_OUTPUT_DIR.value), experiment_name())
