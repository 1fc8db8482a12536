"""Builds the task, the learning process and the run directory from flags."""

import os
from typing import Any

from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from experiment_driver import algorithm_setup
from experiment_driver import families
from experiment_driver import flag_groups as f
from experiment_driver import flag_rules
from experiment_driver import outputs
from experiment_driver import training_loop
from fl_engine import runtime as tff_runtime
from fl_common import cohort_schedule
from fl_common import diagnosed_mean
from fl_common import diagnostics
from fl_common import lr_schedules
from fl_common import normalized_update
from fl_common import optimizers
from fl_common import straggler
from fl_common import tf_environment
import tasks
from tasks import data_files

FLAGS = flags.FLAGS
ALGORITHMS = families.ALGORITHMS


def check_flags() -> None:
  """Refuses flags the run would not use (`flag_rules`), and devices
  TensorFlow does not see, before any work."""
  flag_rules.check_flags(FLAGS)
  if f.DEVICES.value:
    tff_runtime.in_process.check_devices(f.DEVICES.value)


def hparams() -> dict[str, Any]:
  """What the run records: the flags in use and the values derived."""
  return flag_rules.recorded_hparams(flag_rules.values_of(FLAGS))


def _effective() -> dict[str, Any]:
  return flag_rules.effective_hparams(flag_rules.values_of(FLAGS))


def _honours(name: str) -> bool:
  algorithm = families.ALGORITHM.value
  return name in families.FAMILY_OF[algorithm].shared_flags[algorithm]


def experiment_name() -> str:
  """`--experiment_name`, else task, algorithm, the optimizers it honours,
  cohort size and seed."""
  if f.EXPERIMENT_NAME.value:
    return f.EXPERIMENT_NAME.value
  parts = [f.TASK.value, families.ALGORITHM.value]
  parts += [flag.value for flag in (f.CLIENT_OPTIMIZER, f.SERVER_OPTIMIZER)
            if _honours(flag.name)]
  parts += [f'M{f.CLIENTS_PER_ROUND.value or "default"}', f'seed{f.SEED.value}']
  return '_'.join(parts)


def runtime():
  """The TFF runtime the flags select, a context manager: the remote workers
  of `--worker_addresses`; else this process (`--runtime=in_process`, on
  `--devices`) or a local worker (`--runtime=worker`, one client per core
  unless `--max_concurrent_clients`); workers keep the server state between
  rounds (`worker_state`)."""
  if f.WORKER_ADDRESSES.value:
    return tff_runtime.remote_runtime(f.WORKER_ADDRESSES.value,
                                      keep_state_on_worker=True)
  if f.RUNTIME.value == 'in_process':
    return tff_runtime.local_runtime(
        f.DEVICES.value or None,
        max_clients_per_call=f.MAX_CLIENTS_PER_CALL.value or None)
  return tff_runtime.worker_runtime(
      f.MAX_CONCURRENT_CLIENTS.value,
      max_clients_per_call=f.MAX_CLIENTS_PER_CALL.value or None,
      keep_state_on_worker=True)


def describe_runtime(where: Any) -> str:
  """Where the rounds run, for the driver's output; `where` is what
  `runtime()` yields."""
  if f.WORKER_ADDRESSES.value:
    return 'TFF workers at ' + ', '.join(f.WORKER_ADDRESSES.value)
  if f.RUNTIME.value == 'in_process':
    return 'this process (--runtime=in_process), ' + ', '.join(
        f'{d.name} ({d.lanes} client call{"s" * (d.lanes > 1)} at a time)'
        for d in where) + f', oneDNN {tf_environment.onednn_setting()}'
  return f'TFF\'s worker_binary at {where} (--runtime=worker, CPU)'


def calls_at_once() -> int:
  """Client computations the selected runtime runs at once: one per core of
  each worker, or the in-process runtime's lanes over `--devices`."""
  cores = os.cpu_count() or 1
  if f.WORKER_ADDRESSES.value:
    return len(f.WORKER_ADDRESSES.value) * cores
  if f.RUNTIME.value == 'in_process':
    return tff_runtime.in_process.calls_at_once(f.DEVICES.value or None)
  return cores


def create_task() -> tff.simulation.baselines.BaselineTask:
  record = tasks.TASKS[f.TASK.value]
  effective = _effective()
  if record.downloads:
    data_files.configure(offline=f.OFFLINE.value or None,
                         progress=f.PROGRESS.value)
  values = flag_rules.values_of()
  extras = tasks.records.builder_arguments(
      record, {**values, **effective},
      set(flag_rules.unused_task_flags(f.TASK.value, values)))
  return tasks.create_task(
      f.TASK.value,
      **extras,
      train_batch_size=effective.get('train_batch_size',
                                     record.train_batch_size),
      eval_batch_size=f.EVAL_BATCH_SIZE.value,
      num_epochs=client_epochs(),
      max_elements_per_client=f.MAX_ELEMENTS_PER_CLIENT.value,
      data_dir=f.DATA_DIR.value,
      use_synthetic_data=f.USE_SYNTHETIC_DATA.value,
      validation_fraction=f.VALIDATION_FRACTION.value,
      seed=f.SEED.value,
  )


def client_epochs() -> int:
  """The local epochs in use (the task's where the algorithm fixes them)."""
  return _effective().get('client_epochs',
                          tasks.TASKS[f.TASK.value].client_epochs)


def accuracy_name() -> str:
  return tasks.TASKS[f.TASK.value].accuracy_metric


def build_context(
    task: tff.simulation.baselines.BaselineTask) -> algorithm_setup.BuildContext:
  """Builds what the selected algorithm honours of the shared flags."""
  num_train_clients = len(task.datasets.train_data.client_ids)
  cohort_size = clients_per_round(num_train_clients)
  effective = _effective()
  client_lr = effective.get('client_learning_rate')
  server_lr = effective.get('server_learning_rate')
  built = {}
  if _honours('client_optimizer'):
    built['client_optimizer'] = optimizers.build_optimizer(
        f.CLIENT_OPTIMIZER.value, client_lr,
        **f.CLIENT.hyperparameter_values())
  if _honours('server_optimizer'):
    server_optimizer = optimizers.build_optimizer(
        f.SERVER_OPTIMIZER.value, server_lr,
        **f.SERVER.hyperparameter_values())
    if f.SERVER_LR_SCALING.value != 'none':
      server_optimizer = tff.learning.optimizers.schedule_learning_rate(
          server_optimizer,
          lr_schedules.build_server_lr_schedule(
              server_lr,
              scaling=f.SERVER_LR_SCALING.value,
              cohort_size=cohort_size_fn(num_train_clients),
              reference_cohort_size=f.REFERENCE_COHORT_SIZE.value,
              warmup_rounds=f.SERVER_WARMUP_ROUNDS.value))
    built['server_optimizer'] = server_optimizer
  if _honours('clipping'):
    built['model_aggregator'] = model_aggregator()
  if _honours('uniform_weighting') and f.UNIFORM_WEIGHTING.value:
    built['client_weighting'] = tff.learning.ClientWeighting.UNIFORM
  return algorithm_setup.BuildContext(
      task_name=f.TASK.value,
      task=task,
      client_learning_rate=client_lr,
      server_learning_rate=server_lr,
      clients_per_round=cohort_size,
      num_train_clients=num_train_clients,
      total_rounds=f.TOTAL_ROUNDS.value,
      seed=f.SEED.value,
      **built,
  )


def execution_settings() -> algorithm_setup.ExecutionSettings:
  """How the clients run, from the runtime and its flags (the algorithm's
  builder is told by `algorithm_setup.realize`)."""
  return algorithm_setup.ExecutionSettings(
      clients_per_shard=f.CLIENTS_PER_SHARD.value,
      lanes=f.LANES.value,
      calls_at_once=calls_at_once(),
      on_gpu=(not f.WORKER_ADDRESSES.value and f.RUNTIME.value == 'in_process'
              and any('GPU' in d for d in tff_runtime.in_process.check_devices(
                  f.DEVICES.value or None))),
      hold_examples=not f.WORKER_ADDRESSES.value)


def model_aggregator():
  """Client-update aggregation: diagnostics see the raw updates, then
  adaptive zeroing/clipping and the mean, then (optionally) normalization.

  Without zeroing, in one pass (`diagnosed_mean`); with it, the diagnostics
  around TFF's robust aggregator.
  """
  weighted = not f.UNIFORM_WEIGHTING.value
  clipping = f.clipping_enabled(families.ALGORITHM.value, f.CLIPPING.value)
  if f.ZEROING.value:
    aggregator = diagnostics.diagnostics_factory(
        tff.learning.robust_aggregator(
            zeroing=True, clipping=clipping, weighted=weighted))
  else:
    aggregator = diagnosed_mean.diagnosed_mean_factory(
        clipping=clipping, weighted=weighted)
  if f.NORMALIZE_SERVER_UPDATE.value:
    aggregator = normalized_update.normalized_update_factory(aggregator)
  return aggregator


def clients_per_round(num_train_clients: int) -> int:
  """--clients_per_round, or its default capped by the population."""
  if f.CLIENTS_PER_ROUND.value is None:
    return min(f.DEFAULT_CLIENTS_PER_ROUND, num_train_clients)
  if f.CLIENTS_PER_ROUND.value > num_train_clients:
    raise ValueError(
        f'--clients_per_round={f.CLIENTS_PER_ROUND.value} is larger than the'
        f' {num_train_clients} training clients of --task={f.TASK.value}')
  return f.CLIENTS_PER_ROUND.value


def cohort_size_fn(num_train_clients: int):
  """Round number (1-based) -> cohort size: fixed or doubling."""
  cohort_size = clients_per_round(num_train_clients)
  if not f.ROUNDS_TO_DOUBLE_COHORT.value:
    return lambda _: cohort_size
  return cohort_schedule.DoublingCohortSchedule(
      initial_cohort_size=cohort_size,
      rounds_per_doubling=f.ROUNDS_TO_DOUBLE_COHORT.value,
      max_cohort_size=f.MAX_COHORT_SIZE.value,
      population_size=num_train_clients)


def loop_config(task: tff.simulation.baselines.BaselineTask,
                print_fn=print) -> training_loop.LoopConfig:
  """The training loop's settings from the flags."""
  return training_loop.LoopConfig(
      total_rounds=f.TOTAL_ROUNDS.value,
      cohort_size_fn=cohort_size_fn(len(task.datasets.train_data.client_ids)),
      rounds_per_eval=f.ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=f.ROUNDS_PER_CHECKPOINT.value,
      max_eval_clients=f.MAX_EVAL_CLIENTS.value,
      seed=f.SEED.value,
      accuracy_name=accuracy_name(),
      extra_metrics_fns=[m for m in [straggler_metrics_fn(task)]
                         if m is not None],
      print_fn=print_fn,
      hold_examples=not f.WORKER_ADDRESSES.value,
      cohort_accuracy=f.COHORT_ACCURACY.value,
      per_client_eval=f.PER_CLIENT_EVAL.value,
  )


def straggler_metrics_fn(task: tff.simulation.baselines.BaselineTask):
  """The straggler model's simulated round time (appendix B.5), if asked.

  `N_k` is the number of examples client k trains on this round: its dataset
  size (capped by --max_elements_per_client) times --client_epochs; sizes are
  counted once per client and cached.
  """
  if f.STRAGGLER_LAMBDA.value is None:
    return None
  train_data = task.datasets.train_data
  sizes = {}
  max_elements = f.MAX_ELEMENTS_PER_CLIENT.value

  def client_size(client_id: str) -> int:
    if client_id not in sizes:
      count = int(train_data.create_tf_dataset_for_client(client_id).reduce(
          0, lambda n, _: n + 1))
      sizes[client_id] = min(count, max_elements or count)
    return sizes[client_id] * client_epochs()

  def metrics_fn(round_num, client_ids, metrics):
    del metrics
    rng = np.random.default_rng([f.SEED.value, round_num])
    return {'simulated_round_time': straggler.simulated_round_time(
        [client_size(c) for c in client_ids], f.STRAGGLER_ALPHA.value,
        f.STRAGGLER_LAMBDA.value, rng)}

  return metrics_fn


def build_algorithm(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  # Model initialization inside the process is seeded by the graph seed.
  tf.keras.utils.set_random_seed(f.SEED.value)
  return algorithm_setup.realize(ALGORITHMS[families.ALGORITHM.value](ctx),
                                 ctx, execution_settings())


def run_directory() -> outputs.RunDirectory:
  return outputs.RunDirectory(
      os.path.expanduser(f.ROOT_OUTPUT_DIR.value), experiment_name(),
      hparams(), checkpoints_to_keep=f.CHECKPOINTS_TO_KEEP.value,
      numerics=numerics())


def numerics() -> dict[str, str]:
  """What decides a round's numbers beside the flags and the code: the
  runtime (the in-process TensorFlow, the worker_binary's statically linked
  TensorFlow 2.14, or remote workers), the device kind and the oneDNN
  setting. Runs agree across these only to float rounding, which a
  chaotic trajectory amplifies (`docs/runtime.md`), so a run records them
  and a resume on others is refused (`RunDirectory.check_hparams`)."""
  if f.WORKER_ADDRESSES.value:
    runtime_name, device = 'remote TFF workers', 'CPU'
  elif f.RUNTIME.value == 'worker':
    runtime_name, device = 'worker', 'CPU'
  else:
    runtime_name = 'in_process'
    device = ('GPU' if any('GPU' in d for d in
                           tff_runtime.in_process.check_devices(
                               f.DEVICES.value or None)) else 'CPU')
  return {'runtime': runtime_name, 'device': device,
          'onednn': tf_environment.onednn_setting()}
