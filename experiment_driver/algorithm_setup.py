"""What the driver hands an algorithm family, and what it gets back.

Each algorithm family has one module `experiment_driver/<family>_setup.py`
that defines its absl flags and a `Family` record (`FAMILY`), whose
`algorithms` map the name used with `--algorithm` to a function
`BuildContext -> ToBuild`: which builder, with which arguments. The algorithm
itself (`build_<name>(model_fn, ...)`) lives in its paper's package and never
sees flags. How its clients run (one TFF client each, or shards of clients
with lanes and held examples) is decided here, once, for every family
(`realize`, from `ExecutionSettings`).
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import fused
from fl_engine import execution as fl_execution
from fl_engine import lanes
from fl_engine import resident
from fl_engine import shards

# round number (1-based), sampled client ids -> one dataset per client.
ClientDatasetsFn = Callable[[int, Sequence[str]], list[tf.data.Dataset]]
# round number, sampled client ids, the round's metrics -> extra scalars.
RoundMetricsFn = Callable[[int, Sequence[str], Mapping[str, Any]],
                          Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """Everything built from the shared flags, ready for an algorithm builder:
  what the algorithm computes, nothing of how its clients run
  (`ExecutionSettings`, the driver's).

  A family gets only what it honours (its `Family.shared_flags`): the
  others are `None`.
  """

  task_name: str
  task: tff.simulation.baselines.BaselineTask
  # The rates in use: the flags, else the family's defaults
  # (`effective_hparams`), as recorded in hparams.json.
  client_learning_rate: Optional[float]
  server_learning_rate: Optional[float]
  clients_per_round: int
  num_train_clients: int  # the population size |S|
  total_rounds: int
  seed: int
  # Optimizers built from --client_optimizer / --server_optimizer and their
  # hyperparameter flags, with the rates above.
  client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  # The model-update aggregator chosen by --clipping/--zeroing (and the
  # diagnostics), weighted unless --uniform_weighting.
  model_aggregator: Optional[
      Union[tff.aggregators.WeightedAggregationFactory,
            tff.aggregators.UnweightedAggregationFactory]] = None
  client_weighting: tff.learning.ClientWeighting = (
      tff.learning.ClientWeighting.NUM_EXAMPLES)


@dataclasses.dataclass(frozen=True)
class ExecutionSettings:
  """How the driver runs an algorithm's clients (`realize` decides from
  these, in one place): the runtime's settings, not the algorithm's."""

  # --clients_per_shard: None picks one shard per core, 1 is per client.
  clients_per_shard: Optional[int] = None
  # --lanes (on shards): None picks `fl_engine.lanes.auto_lanes`.
  lanes: Optional[int] = None
  # Client computations the runtime runs at once, one shard each: every core
  # of each worker, or the in-process runtime's lanes over its devices
  # (`runtime.in_process.plan_devices`); default: this machine's cores.
  calls_at_once: Optional[int] = None
  # Whether client work runs on GPUs (the in-process runtime's devices):
  # lanes then for a model of any size (`fl_engine.lanes.auto_lanes`).
  on_gpu: bool = False
  # Whether fused processes may hold the population's examples on the
  # workers (`fl_engine.resident.ResidentExamples`, files they memory-map):
  # when they run on this machine, i.e. without --worker_addresses.
  hold_examples: bool = True


@dataclasses.dataclass(frozen=True)
class ToBuild:
  """What a family's algorithm asks the driver to build: its builder
  (`build_<name>(model_fn, ..., execution=...)`) and the arguments, and the
  hooks that need the built process. The driver picks the execution
  (`realize`).

  Attributes:
    build_fn: The paper's builder.
    kwargs: Its arguments beside `model_fn` and `execution`.
    steps_fn: `(round_num, num_clients) -> batches per client` (e.g. GeL's
      step budgets), or None for the task's pipeline as it is.
    per_client_datasets_fn: The client datasets when the clients run one TFF
      client each (e.g. cut to their step budgets); None: the task's.
    round_metrics_fn_of: `process -> RoundMetricsFn`, or None.
    finish_fn: As `AlgorithmSetup.finish_fn`.
  """

  build_fn: Callable[..., Any]
  kwargs: Mapping[str, Any]
  steps_fn: Optional[Callable[[int, int], Sequence[int]]] = None
  per_client_datasets_fn: Optional['ClientDatasetsFn'] = None
  round_metrics_fn_of: Optional[Callable[[Any], 'RoundMetricsFn']] = None
  finish_fn: Optional[Callable[[str], None]] = None


def realize(to_build: ToBuild, ctx: BuildContext,
            settings: ExecutionSettings = ExecutionSettings()
            ) -> 'AlgorithmSetup':
  """Builds `to_build`, its clients on shards when the settings allow (not
  one call per client asked for, `--clients_per_shard=1`) and its
  aggregator is one shards compute (the diagnosed mean, normalized or
  not), else one TFF client per client: the driver's one decision of how
  clients run."""
  if settings.clients_per_shard != 1 and fused.can_fuse(
      to_build.kwargs.get('model_aggregator')):
    process, client_datasets_fn, execution = _on_shards(
        ctx, settings, to_build.build_fn, to_build.steps_fn,
        **to_build.kwargs)
  else:
    process = to_build.build_fn(ctx.task.model_fn, **to_build.kwargs)
    client_datasets_fn, execution = to_build.per_client_datasets_fn, ''
  return AlgorithmSetup(
      process=process, client_datasets_fn=client_datasets_fn,
      round_metrics_fn=(to_build.round_metrics_fn_of(process)
                        if to_build.round_metrics_fn_of else None),
      finish_fn=to_build.finish_fn, execution=execution)


def resident_examples(
    ctx: BuildContext, settings: ExecutionSettings
) -> Optional[resident.ResidentExamples]:
  """The training population's examples for a fused process to hold on
  the workers (`fl_engine.resident.ResidentExamples`), so that rounds send
  the rows of each client's batches instead of their examples: the task's
  shared arrays when its clients are rows of them with a batch recipe
  (Synthetic, the partitioned image tasks without augmentation) and
  `settings.hold_examples`; else None (shards carry examples)."""
  if not settings.hold_examples:
    return None
  data = ctx.task.datasets
  return resident.resident_examples(data.train_data, data.train_preprocess_fn)


def _clients_per_shard(settings: ExecutionSettings, num_clients: int) -> int:
  """`--clients_per_shard`, or the automatic size for `num_clients`: one
  shard per client computation the runtime runs at once."""
  return settings.clients_per_shard or shards.auto_clients_per_shard(
      num_clients, settings.calls_at_once)


def shards_fn(
    ctx: BuildContext,
    settings: ExecutionSettings,
    steps_fn: Optional[Callable[[int, int], Sequence[int]]] = None,
    rows_only: bool = False,
) -> 'ClientDatasetsFn':
  """The `client_datasets_fn` of a fused process: each round's clients in
  shards of `settings.clients_per_shard`, or one per core of every worker,
  cut to at most `shards.MAX_AUTO_SHARD_BYTES` each
  (`fl_engine.shards.shards_for_round`).

  Args:
    ctx: The build context.
    settings: How the clients run.
    steps_fn: `(round_num, num_clients) -> batches per client` (e.g. GeL's
      step budgets), or None for the task's pipeline as it is.
    rows_only: Whether shards are rows of the arrays that the process
      holds (`resident_examples`), not examples.
  """
  data = ctx.task.datasets

  def client_datasets_fn(round_num, client_ids):
    return shards.shards_for_round(
        data.train_data, data.train_preprocess_fn, client_ids,
        _clients_per_shard(settings, len(client_ids)),
        np.random.default_rng([ctx.seed, round_num]),
        steps_fn(round_num, len(client_ids)) if steps_fn else None,
        max_shard_bytes=(None if settings.clients_per_shard else
                         shards.MAX_AUTO_SHARD_BYTES),
        rows_only=rows_only)

  return client_datasets_fn


def _on_shards(ctx: BuildContext, settings: ExecutionSettings,
               build_fn: Callable[..., Any],
               steps_fn: Optional[Callable[[int, int], Sequence[int]]] = None,
               **kwargs) -> tuple[Any, 'ClientDatasetsFn', str]:
  """`(build_fn(model_fn, execution=OnShards(lanes, resident_examples),
  **kwargs), its client_datasets_fn, how its rounds run)`: a process on
  shards (`fl_engine.execution`) holding the
  population's examples when `resident_examples` has them (shards of
  rows), else taking shards of examples, its shards' clients trained
  `--lanes` at a time, by default `fl_engine.lanes.auto_lanes`' for the
  first round's shards."""
  held = resident_examples(ctx, settings)
  num_lanes = settings.lanes or lanes.auto_lanes(
      ctx.task.model_fn, _clients_per_shard(settings, ctx.clients_per_round),
      on_gpu=settings.on_gpu)
  process = build_fn(ctx.task.model_fn,
                     execution=fl_execution.OnShards(
                         lanes=num_lanes, resident_examples=held),
                     **kwargs)
  execution = 'shards of clients, ' + (
      f'{num_lanes} clients side by side (--lanes)' if num_lanes > 1 else
      'one client after the other')
  return (process, shards_fn(ctx, settings, steps_fn,
                             rows_only=held is not None),
          execution)


@dataclasses.dataclass(frozen=True)
class AlgorithmSetup:
  """A learning process plus the optional per-round hooks it needs."""

  process: tff.learning.templates.LearningProcess
  # Replaces the task's default `train_preprocess_fn` pipeline (e.g. GeL's
  # per-client step budgets). None: the default pipeline.
  client_datasets_fn: Optional[ClientDatasetsFn] = None
  # Extra per-round scalars computed in Python (bytes exchanged, gradient
  # computations, ...). None: no extra metrics.
  round_metrics_fn: Optional[RoundMetricsFn] = None
  # Called with the run directory's path after the last round (e.g. to write
  # a summary of rounds-to-target). None: nothing to do.
  finish_fn: Optional[Callable[[str], None]] = None
  # How the rounds run where the driver chose it (shards, lanes),
  # printed at the start; not what they compute. '': nothing to say.
  execution: str = ''


@dataclasses.dataclass(frozen=True)
class Family:
  """One algorithm family, as the driver sees it (each
  `experiment_driver/<family>_setup.py` declares one, `FAMILY`).

  Attributes:
    algorithms: `--algorithm` name -> `BuildContext -> ToBuild`.
    shared_flags: Per algorithm, which of
      `flag_groups.FAMILY_DEPENDENT_FLAGS` it honours.
    why_not: Per algorithm, why it does not honour the rest (the refusal's
      wording).
    own_flags: Each flag the family defines (or shares with another family)
      -> the algorithms that use it.
    unused_own_flags: `(algorithm, flag values) -> {flag: why}` for own
      flags that other flags' values make moot.
    effective_hparams: `(algorithm, flag values) -> {flag: value}`, the
      values in use that the flags left to the family's defaults (e.g. the
      tuned learning rates).
  """

  algorithms: Mapping[str, Callable[[BuildContext], ToBuild]]
  shared_flags: Mapping[str, frozenset[str]]
  why_not: Mapping[str, str]
  own_flags: Mapping[str, frozenset[str]]
  unused_own_flags: Callable[[str, Mapping[str, Any]], dict[str, str]]
  effective_hparams: Callable[[str, Mapping[str, Any]], dict[str, Any]]

  def __post_init__(self):
    for field in ('shared_flags', 'why_not'):
      keys = set(getattr(self, field))
      if keys != set(self.algorithms):
        raise ValueError(f'{field} names {sorted(keys)}, the family has'
                         f' {sorted(self.algorithms)}')
    for flag, users in self.own_flags.items():
      if not set(users) <= set(self.algorithms):
        extra = sorted(set(users) - set(self.algorithms))
        raise ValueError(f'own flag {flag} is used by {extra}, not of this'
                         ' family')
