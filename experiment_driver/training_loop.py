"""The training loop: sample, train, evaluate, release metrics, checkpoint.

It follows `tff.simulation.run_training_process` (resume from the latest
program state, evaluate every `rounds_per_eval` rounds, release metrics keyed
by round) and adds what the papers measure per round: round time, examples
processed and their running total, the algorithm's own per-round scalars, a
progress line with ETA, and stateful clients (AdaBest, FedDyn, SCAFFOLD),
whose states are loaded and saved around each round and committed with the
checkpoint. Each round's client datasets are built while the previous round
computes (`round_inputs`). The server state may stay on the worker between
rounds (`worker_state`); it is fetched for each checkpoint. With
`cohort_accuracy`, each round first scores the server model on its cohort
(`Evaluator.cohort_metrics`), the catastrophic-failure detector.

Why one module: the loop and its `Evaluator` share one round's inputs (the
cohort's shards are built with its datasets) and one metrics row; apart,
the evaluator would take the loop's round structure as arguments.
"""

import collections
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import client_state_store
from fl_engine import stateful_runner
from fl_engine import stateful_process
from experiment_driver import algorithm_setup
from experiment_driver import outputs
from experiment_driver import round_inputs
from fl_engine import worker_state
from fl_common import diagnostics
from fl_engine import per_client_evaluation
from fl_engine import resident
from fl_engine import shards

# Per-round metrics whose running totals are kept (as `cumulative_<name>`).
CUMULATIVE_METRICS = ('examples_processed', 'gradient_computations',
                      'bytes_up', 'bytes_down', 'simulated_round_time')
_TRAIN_PREFIX = 'client_work/train/'
# Evaluation clients are sampled with this seed, whatever the run's `--seed`:
# runs of different seeds are scored on the same clients.
EVAL_SAMPLE_SEED = 0


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  total_rounds: int
  cohort_size_fn: Callable[[int], int]  # round number -> cohort size
  rounds_per_eval: int
  rounds_per_checkpoint: int
  max_eval_clients: int
  seed: int
  accuracy_name: str  # the model metric the papers call accuracy
  # Extra per-round scalars beside the algorithm's own (e.g. straggler time).
  extra_metrics_fns: Sequence[algorithm_setup.RoundMetricsFn] = ()
  print_fn: Callable[[str], Any] = print
  # Whether evaluation holds its splits' examples on the worker
  # (`Evaluator`): when the workers run on this machine.
  hold_examples: bool = True
  # Whether each round first evaluates the server model on the round's
  # cohort (`Evaluator.cohort_metrics`: the `cohort/` columns).
  cohort_accuracy: bool = False
  # Whether validation and test clients are scored one by one (`Evaluator`:
  # the test percentiles), or pooled.
  per_client_eval: bool = True


def _preprocessed(client_data: tff.simulation.datasets.ClientData,
                  preprocess_fn: Optional[Callable[[tf.data.Dataset],
                                                   tf.data.Dataset]],
                  client_ids: Sequence[str]) -> list[tf.data.Dataset]:
  datasets = [client_data.create_tf_dataset_for_client(i) for i in client_ids]
  return [preprocess_fn(d) for d in datasets] if preprocess_fn else datasets


def seed_data_pipelines(seed: int, round_num: int) -> None:
  """Seeds the round's data pipelines (shuffling, augmentation, bootstraps).

  The seed depends on `(seed, round_num)` only, not on the rounds this
  process ran before, so a resumed run builds the same datasets as an
  uninterrupted one. `tf.random.set_seed` also clears the eager kernel cache,
  which otherwise keeps the kernels of every client dataset built so far
  with their function libraries: ~0.6 MB per Stack Overflow client dataset
  (the vocabulary table is in its map function), tens of GB over a
  paper-length run.
  """
  tf.random.set_seed(hash((seed, round_num)) % 2**31)


def summarize_training_metrics(flat: dict[str, float],
                               accuracy_name: str) -> dict[str, float]:
  """Adds the canonical columns the papers read to TFF's flat metrics.

  Args:
    flat: The round's metrics, flattened.
    accuracy_name: The task model's metric that the papers call accuracy
      (`tasks.ACCURACY_METRIC_NAME`).
  """
  summary = {}
  loss_key = _TRAIN_PREFIX + 'loss'
  if loss_key in flat:
    summary['train/loss'] = flat[loss_key]
  if _TRAIN_PREFIX + accuracy_name in flat:
    summary['train/accuracy'] = flat[_TRAIN_PREFIX + accuracy_name]
  if _TRAIN_PREFIX + 'num_examples' in flat:
    summary['examples_processed'] = flat[_TRAIN_PREFIX + 'num_examples']
  if summary.get('examples_processed') == 0.0:
    # No client's update reached the model (every one diverged and was
    # discarded): TFF's metrics then read 0, which is no loss at all. Every
    # family reports nan here. The adaptive clipping norm still moves that
    # round, as TFF's quantile estimate counts a discarded (zeroed) update as
    # one below the norm: the norm shrinks, which is what a diverging run
    # needs; it is left as TFF has it.
    summary['train/loss'] = float('nan')
    summary['train/accuracy'] = float('nan')
  # Where aggregators nest (FedNova around the diagnostics), the outermost
  # measurement is the round's: FedNova's `update_norm` is the server's step.
  for key in sorted(flat, key=lambda k: k.count('/'), reverse=True):
    for name in ('clipping_norm', 'update_norm', 'mean_pairwise_cosine',
                 'num_nonfinite_updates', 'num_zero_updates'):
      if key.endswith('/' + name):
        summary[name] = flat[key]
  return summary


class Evaluator:
  """Evaluates the deployed model on fixed validation and test clients.

  Reports the example-weighted metrics of each split (the clients' metrics
  summed, then finalized, as TFF's `build_fed_eval` does) and, for test
  clients, the percentiles 5/25/50/75/95 of per-client accuracy (the paper's
  fairness measurement, §3.4), from one pass over each split's clients.

  A split with more than `max_clients` clients is scored on a sample of them
  drawn with `sample_seed`, the same sample for every run that uses it.

  With `per_client=False`, each shard of a split is scored as one client
  (`shards.pooled`, batches of `POOLED_BATCH_SIZE` examples): the same
  example-weighted metrics (all but `num_batches`), no percentiles, without
  a loop step per client, which dominates where clients are many and small
  (Synthetic's 1,000 test clients of ~11 examples).
  """

  # Large enough that a split of small clients takes few loop steps, small
  # enough for the largest task's logits (Stack Overflow's 10,004 words x
  # 20 steps: 0.2 GB at 256 sequences).
  POOLED_BATCH_SIZE = 256

  def __init__(self, task: tff.simulation.baselines.BaselineTask,
               accuracy_name: str, max_clients: int, sample_seed: int,
               hold_examples: bool = True, per_client: bool = True):
    # Every split's clients in shards, one per core, each evaluated in one
    # call (`per_client_evaluation.build_fused_per_client_evaluation`); with
    # `hold_examples`, a split's numeric examples held on the worker
    # (`resident.resident_from_shards`): each call then sends their rows.
    self._evaluate = {}
    self._shared_evaluate = None
    self._finalize = per_client_evaluation.MetricsFinalizer(task.model_fn)
    if accuracy_name not in self._finalize.metric_names:
      raise ValueError(
          f'The model has no metric {accuracy_name!r}; its metrics are '
          f'{self._finalize.metric_names}.')
    self._accuracy_name = accuracy_name
    self._splits = {}
    datasets = task.datasets
    preprocess = datasets.eval_preprocess_fn
    rng = np.random.default_rng(sample_seed)
    for name, data in (('validation', datasets.validation_data),
                       ('test', datasets.test_data)):
      if data is None:
        continue
      if isinstance(data, tf.data.Dataset):
        self._splits[name] = shards.shards_from_datasets(
            [preprocess(data) if preprocess else data], 1)
        continue
      ids = list(data.client_ids)
      if max_clients and len(ids) > max_clients:
        ids = sorted(rng.choice(ids, size=max_clients, replace=False))
      self._splits[name] = shards.shards_for_round(
          data, preprocess, ids, shards.auto_clients_per_shard(len(ids)), rng,
          max_shard_bytes=shards.MAX_AUTO_SHARD_BYTES)
    self._per_client = per_client
    if not per_client:
      self._splits = {
          name: [shards.pooled(shard, self.POOLED_BATCH_SIZE)
                 for shard in split_shards]
          for name, split_shards in self._splits.items()}
    # Each split's computation is built at its first evaluation, not
    # before round 1: tracing it takes about as long as a small model's
    # first rounds.
    self._model_fn = task.model_fn
    self._train = (datasets.train_data, preprocess)
    self._examples = {}
    for name, split_shards in self._splits.items():
      held = (resident.resident_from_shards(split_shards) if hold_examples
              else None)
      if held is not None:
        self._examples[name], self._splits[name] = held

  def _evaluation(self, name: str) -> tff.Computation:
    if name not in self._evaluate:
      if name in self._examples:
        self._evaluate[name] = (
            per_client_evaluation.build_fused_per_client_evaluation(
                self._model_fn, resident_examples=self._examples[name]))
      else:
        if self._shared_evaluate is None:
          self._shared_evaluate = (
              per_client_evaluation.build_fused_per_client_evaluation(
                  self._model_fn))
        self._evaluate[name] = self._shared_evaluate
    return self._evaluate[name]

  def cohort_shards(self, client_ids: Sequence[str]) -> list[Any]:
    """The training clients `client_ids` in shards for `cohort_metrics`:
    their whole training data, preprocessed as evaluation data are, pooled
    (`shards.pooled`: only the cohort's aggregate is read)."""
    data, preprocess = self._train
    return [shards.pooled(shard, self.POOLED_BATCH_SIZE)
            for shard in shards.shards_for_round(
                data, preprocess, list(client_ids),
                shards.auto_clients_per_shard(len(client_ids)),
                np.random.default_rng(0),
                max_shard_bytes=shards.MAX_AUTO_SHARD_BYTES)]

  def cohort_metrics(self, model_weights,
                     cohort_shards: Sequence[Any]) -> dict[str, float]:
    """The model's metrics on a round's cohort (`cohort_shards`), under
    `cohort/`: with the server model before the round's local training, the
    catastrophic-failure detector of the paper's Section 3.1 reads
    `cohort/accuracy` (`fl_common.diagnostics.catastrophic_failure_rounds`),
    where `train/accuracy` averages over the clients' local training."""
    return self._split_metrics('cohort', model_weights, cohort_shards)[0]

  def _split_metrics(self, name: str, model_weights, split_shards):
    per_shard = self._evaluation(name)(model_weights, split_shards)
    totals = self._finalize(per_client_evaluation.sum_over_shards(
        [shard['unfinalized'] for shard in per_shard]))
    metrics = {f'{name}/{key}': value for key, value in totals.items()}
    metrics[f'{name}/accuracy'] = totals[self._accuracy_name]
    return metrics, per_shard

  def __call__(self, model_weights) -> dict[str, float]:
    metrics = {}
    for name, split_shards in self._splits.items():
      split, per_shard = self._split_metrics(name, model_weights, split_shards)
      metrics.update(split)
      if name != 'test' or not self._per_client:
        continue
      # Each shard's finalized metrics have a leading client dimension.
      accuracies = np.concatenate([
          np.asarray(shard['finalized'][self._accuracy_name]).reshape(-1)
          for shard in per_shard])
      if len(accuracies) > 1:
        for q, value in per_client_evaluation.accuracy_percentiles(
            accuracies[np.isfinite(accuracies)]).items():
          metrics[f'test/accuracy_p{q}'] = float(value)
    return metrics


def _initial_program_state(server_state) -> dict[str, Any]:
  return {
      'server_state': server_state,
      'totals': {name: np.float64(0.0) for name in CUMULATIVE_METRICS},
      'last_train_accuracy': np.float64(np.nan),
  }


def _client_state_store(process, run_dir: outputs.RunDirectory
                        ) -> client_state_store.ClientStateStore:
  """The store of a stateful-client process' client states, in
  `<run_dir>/client_states/` (only the cohort is held in memory), owned by
  the run (`RunDirectory.run_id`)."""
  return client_state_store.ClientStateStore(
      run_dir.client_states_dir,
      process.initial_client_state(),
      # One more than the checkpoints: a checkpoint saved and committed but
      # not recorded (`RunDirectory.record_checkpoint`) is dropped on resume.
      keep_commits=run_dir.checkpoints_to_keep + 1,
      owner=run_dir.run_id(), upgrade_command=run_dir.upgrade_command)


def _stateful_clients(process, store: client_state_store.ClientStateStore,
                      start_round: int):
  """`(round_runner, on_checkpoint)` for stateful-client processes.

  The store is committed right after each checkpoint, keeping the states of
  as many checkpoints as the run directory keeps, and restored to the
  checkpoint's round on resume, so a resumed run sees exactly the client
  states of the round it resumes from (also an older checkpoint's, when the
  latest was deleted); the resume verified them first: exactly the states
  the checkpoint recorded (`RunDirectory.load_latest_checkpoint`).
  """
  runner = stateful_runner.StatefulClientRunner(process, store)
  runner.store.restore(start_round)

  def round_runner(process, state, round_num, client_ids, datasets):
    del process  # The runner's.
    output = runner.next(state, client_ids, datasets, round_num)
    metrics = collections.OrderedDict(output.metrics)
    metrics[CLIENT_STATES_METRICS] = collections.OrderedDict(
        mean_norm=mean_state_norm(runner.store.load(client_ids)))
    return tff.learning.templates.LearningProcessOutput(output.state,
                                                        metrics)

  return round_runner, runner.store.commit


CLIENT_STATES_METRICS = 'client_states'


def mean_state_norm(states: Sequence[Any]) -> float:
  """The cohort's mean of `‖s_i‖₂`, each state's float leaves as one vector.

  Logged per round as `client_states/mean_norm`: AdaBest's and FedDyn's
  `h_i`, SCAFFOLD's `c_i`, as saved after the round, so that FedDyn's
  instability (Varno et al. 2022, Figure 1) can be read beside `‖x‖` and the
  server's `‖h‖`.
  """
  norms = [np.sqrt(sum(float(np.sum(np.square(leaf, dtype=np.float64)))
                       for leaf in map(np.asarray, tf.nest.flatten(state))
                       if np.issubdtype(leaf.dtype, np.floating)))
           for state in states]
  return float(np.mean(norms)) if norms else float('nan')


def run_training(
    setup: algorithm_setup.AlgorithmSetup,
    task: tff.simulation.baselines.BaselineTask,
    run_dir: outputs.RunDirectory,
    config: LoopConfig,
) -> dict[str, float]:
  """Trains for `config.total_rounds`, resuming from the latest checkpoint.

  Args:
    setup: The learning process and its per-round hooks.
    task: The task whose training/validation/test data are used.
    run_dir: Where metrics and checkpoints go.
    config: Loop settings.

  Returns:
    The last round's metrics.
  """
  process = setup.process
  train_data = task.datasets.train_data
  sample_clients = tff.simulation.build_uniform_sampling_fn(
      train_data.client_ids, replace=False, random_seed=config.seed)
  client_datasets_fn = setup.client_datasets_fn or (
      lambda _, ids: _preprocessed(train_data,
                                   task.datasets.train_preprocess_fn, ids))
  evaluator = Evaluator(task, config.accuracy_name, config.max_eval_clients,
                        sample_seed=EVAL_SAMPLE_SEED,
                        hold_examples=config.hold_examples,
                        per_client=config.per_client_eval)

  structure = _initial_program_state(process.initialize())
  store = (_client_state_store(process, run_dir) if isinstance(
      process, stateful_process.StatefulClientLearningProcess) else None)
  program_state, start_round = run_dir.load_latest_checkpoint(
      structure, store)
  if start_round >= config.total_rounds:
    config.print_fn(
        f'{run_dir.path} is complete: its checkpoint of round {start_round}'
        f' is at or past --total_rounds={config.total_rounds}; nothing to run'
        ' (raise --total_rounds to train on)')
    return {}
  run_dir.start_writing(start_round)
  if store is not None:
    round_runner, on_checkpoint = _stateful_clients(process, store,
                                                    start_round)
  else:
    round_runner, on_checkpoint = (
        lambda process, state, round_num, ids, datasets: process.next(
            state, datasets)), None
  if program_state is None:
    program_state = structure
    run_dir.save_checkpoint(program_state, 0)
    run_dir.record_checkpoint(
        0, store.summary_as_of(0) if store is not None else None)
  state = program_state['server_state']
  totals = {k: float(v) for k, v in program_state['totals'].items()}
  last_train_accuracy = float(program_state['last_train_accuracy'])
  if start_round:
    config.print_fn(f'resuming from the checkpoint of round {start_round}')

  def build_round_inputs(round_num: int):
    seed_data_pipelines(config.seed, round_num)
    client_ids = sample_clients(round_num, config.cohort_size_fn(round_num))
    cohort = (evaluator.cohort_shards(client_ids) if config.cohort_accuracy
              else None)
    return client_ids, client_datasets_fn(round_num, client_ids), cohort

  def run_round(round_num: int, state, built):
    client_ids, datasets, cohort = built
    before = {}
    if cohort is not None:
      started = time.perf_counter()
      before = evaluator.cohort_metrics(process.get_model_weights(state),
                                        cohort)
      before['cohort_eval_time_sec'] = time.perf_counter() - started
    return client_ids, before, round_runner(process, state, round_num,
                                            client_ids, datasets)

  metrics: dict[str, float] = {}
  round_times = []
  with round_inputs.OverlappedRoundInputs(build_round_inputs) as inputs:
    for round_num in range(start_round + 1, config.total_rounds + 1):
      started = time.perf_counter()
      client_ids, before, output = inputs.run(
          round_num,
          round_num + 1 if round_num < config.total_rounds else None,
          functools.partial(run_round, round_num, state))
      state = output.state
      # The cohort's evaluation is timed apart (`cohort_eval_time_sec`).
      round_seconds = (time.perf_counter() - started -
                       before.get('cohort_eval_time_sec', 0.0))
      round_times.append(round_seconds)

      flat = outputs.flatten_metrics(output.metrics)
      metrics = {'round_time_sec': round_seconds,
                 'clients_per_round': float(len(client_ids))}
      metrics.update(flat)
      metrics.update(before)
      metrics.update(summarize_training_metrics(flat, config.accuracy_name))
      for metrics_fn in (setup.round_metrics_fn, *config.extra_metrics_fns):
        if metrics_fn is not None:
          metrics.update(metrics_fn(round_num, client_ids, metrics))
      for name in CUMULATIVE_METRICS:
        if name in metrics:
          totals[name] += metrics[name]
          metrics[f'cumulative_{name}'] = totals[name]
      train_accuracy = metrics.get('train/accuracy', np.nan)
      if np.isfinite(train_accuracy) and np.isfinite(last_train_accuracy):
        metrics['catastrophic_failure'] = float(
            diagnostics.is_catastrophic_failure(last_train_accuracy,
                                                train_accuracy))
      last_train_accuracy = train_accuracy

      if (round_num % config.rounds_per_eval == 0 or
          round_num == config.total_rounds):
        started = time.perf_counter()
        metrics.update(evaluator(process.get_model_weights(state)))
        metrics['eval_time_sec'] = time.perf_counter() - started
      run_dir.release_metrics(metrics, round_num)
      config.print_fn(outputs.progress_line(
          round_num, config.total_rounds, round_seconds,
          float(np.mean(round_times)), metrics))

      if (round_num % config.rounds_per_checkpoint == 0 or
          round_num == config.total_rounds):
        run_dir.save_checkpoint({
            'server_state': worker_state.fetch(state),
            'totals': {k: np.float64(v) for k, v in totals.items()},
            'last_train_accuracy': np.float64(last_train_accuracy),
        }, round_num)
        if on_checkpoint is not None:
          on_checkpoint(round_num)
        run_dir.record_checkpoint(
            round_num,
            store.summary_as_of(round_num) if store is not None else None)
  return metrics
