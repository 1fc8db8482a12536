"""The TFF rounds the benchmark times against the limit.

Three processes, all FedAvg (client SGD at the workload's rate, server SGD at
1.0, example-weighted mean) on the same client datasets:

* `tff_reduce` — TFF 0.87's `build_weighted_fed_avg` as shipped: its default
  `DATASET_REDUCE` client loop. The "before" of this package's changes.
* `fedavg` — the package's `large_cohort.fedopt.build_fedopt`, TFF's mean
  aggregator.
* `package` — a full round as `run_experiment.py` runs it: the same process
  with the driver's default aggregator, the paper's diagnostics (update norm,
  pairwise cosine, non-finite screening), adaptive clipping and the weighted
  mean in one pass (`fl_common.diagnosed_mean`, what
  `experiment_driver.build.model_aggregator()` returns at its default flags:
  `--clipping`, no `--zeroing`, example weighting), and the
  client datasets built each round from a `ClientData` and the task's
  preprocessing, as `experiment_driver.training_loop` builds them: the next
  round's while a round computes (`experiment_driver.round_inputs`), each
  call waiting for that build to finish.

* `fused` — the full round on fused shards (`large_cohort.build_fedopt` with `execution=OnShards()`): the
  same algorithm and aggregator, the cohort's clients grouped into one shard
  per core (`shards.auto_clients_per_shard`, cut to
  `shards.MAX_AUTO_SHARD_BYTES` as the driver cuts them), each trained in
  one call of one TensorFlow graph, the shards' batches made from the
  clients' arrays in NumPy each round (`shards.shards_from_arrays`, as the driver makes
  Synthetic's), the next round's while a round computes.

* `resident` — the fused round of a process that holds the cohort's
  examples (`fl_engine.fused.shard_source`): each round's shards are the
  rows of the clients' batches, made in NumPy as for `fused`; what the
  driver runs for clients stored as rows of shared arrays (Synthetic, the
  partitioned image tasks: `experiment_driver.algorithm_setup.
  resident_examples`), with the driver's lanes (`fl_engine.lanes.auto_lanes`:
  a small model's clients trained side by side). Built per cohort, since it
  holds its examples.

`tff_reduce` and `fedavg` get the client datasets prebuilt: they measure
TFF's round alone.

Beside them, `floor` (`FloorProcess`, not a FedAvg variant): a round of the
resident round's shape that does no work: its model broadcast to the same
shards, each returning zeros, summed and added on the server. TFF's runtime
cost of such a round is a floor under every TFF round of this shape,
whatever its TensorFlow does.
"""

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np

import tensorflow as tf
import tensorflow_federated as tff

from bench import workloads
from experiment_driver import round_inputs
from fl_common import diagnosed_mean
from fl_engine import execution as fl_execution
from fl_engine import lanes
from fl_engine import shards
from large_cohort import fedopt
from fl_common import optimizers

VARIANTS = ('tff_reduce', 'fedavg', 'package', 'fused', 'resident')
FLOOR = 'floor'
# Variants whose process holds the cohort's examples: built per cohort.
PER_COHORT_VARIANTS = ('resident',)


def driver_default_aggregator() -> tff.aggregators.WeightedAggregationFactory:
  """The driver's aggregator at its default flags (see module docstring)."""
  return diagnosed_mean.diagnosed_mean_factory(clipping=True, weighted=True)


def build_process(
    workload: workloads.Workload, variant: str,
    arrays: Optional[workloads.ClientArrays] = None,
) -> tff.learning.templates.LearningProcess:
  """The FedAvg learning process of `variant` for `workload` (for
  `resident`, holding `arrays`' examples).

  Raises:
    ValueError: If `variant` is not one of `VARIANTS`, or is `resident`
      without `arrays`.
  """
  model_fn = workload.tff_model_fn()
  client_optimizer = optimizers.build_optimizer('sgd', workload.learning_rate)
  server_optimizer = optimizers.build_optimizer('sgd', 1.0)
  if variant == 'tff_reduce':
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer)
  if variant == 'fedavg':
    return fedopt.build_fedopt(model_fn, client_optimizer=client_optimizer,
                               server_optimizer=server_optimizer)
  if variant == 'package':
    return fedopt.build_fedopt(model_fn, client_optimizer=client_optimizer,
                               server_optimizer=server_optimizer,
                               model_aggregator=driver_default_aggregator())
  if variant in ('fused', 'resident'):
    if variant == 'resident' and arrays is None:
      raise ValueError('the resident variant holds the cohort\'s arrays.')
    return fedopt.build_fedopt(
        model_fn, client_optimizer=client_optimizer,
        server_optimizer=server_optimizer,
        model_aggregator=driver_default_aggregator(),
        execution=fl_execution.OnShards(
            resident_examples=(flat_examples(arrays) if variant == 'resident'
                               else None),
            lanes=(lanes.auto_lanes(model_fn)
                   if variant == 'resident' else 1)))
  raise ValueError(f'Unknown variant {variant!r}; expected one of {VARIANTS}.')


class FloorProcess:
  """A round of `process`' shape that does no work (module docstring).

  Its state is `process`' model weights (`ModelWeights` at the server);
  `next(state, shards)` broadcasts them to the shards (`process`' client
  data type), each shard returns zeros of the weights without reading its
  data, and the server adds their sum to the weights. `next` returns a
  `LearningProcessOutput` without metrics.
  """

  def __init__(self, process: tff.learning.templates.LearningProcess):
    weights_type = process.get_model_weights.type_signature.result
    data_type = process.next.type_signature.parameter[1]

    @tff.federated_computation
    def initialize():
      return tff.federated_map(process.get_model_weights,
                               process.initialize())

    @tff.tensorflow.computation(weights_type, data_type.member)
    def no_work(weights, data):
      del data
      return tf.nest.map_structure(tf.zeros_like, weights)

    @tff.tensorflow.computation(weights_type, weights_type)
    def add(weights, total):
      return tf.nest.map_structure(tf.add, weights, total)

    @tff.federated_computation(tff.FederatedType(weights_type, tff.SERVER),
                               data_type)
    def next_fn(weights, data):
      zeros = tff.federated_map(
          no_work, (tff.federated_broadcast(weights), data))
      return tff.federated_map(add, (weights, tff.federated_sum(zeros)))

    self.initialize = initialize
    self._next = next_fn

  def next(self, state, data
           ) -> tff.learning.templates.LearningProcessOutput:
    return tff.learning.templates.LearningProcessOutput(
        state=self._next(state, data), metrics=())


class TffRound:
  """Rounds of one learning process; call it to run the next round.

  Each call gets the round's client datasets from `datasets_fn`, runs
  `process.next` on the current state and keeps the new one, as a training
  loop does; with `overlap_datasets`, the next call's datasets are built
  while `process.next` runs, as the driver's training loop builds them. Must
  be built and called inside a TFF runtime
  (`fl_engine.runtime.local_runtime()`; with `keep_state_on_worker`,
  `self.state` stays on the worker between calls, as in the driver).
  """

  def __init__(self, process: tff.learning.templates.LearningProcess,
               datasets_fn: Callable[[], list[tf.data.Dataset]],
               overlap_datasets: bool = False):
    self.process = process
    self.state = process.initialize()
    self._inputs = round_inputs.OverlappedRoundInputs(lambda _: datasets_fn())
    self._overlap_datasets = overlap_datasets
    self._round_num = 0

  def __call__(self) -> None:
    self._round_num += 1
    self.state = self._inputs.run(
        self._round_num,
        self._round_num + 1 if self._overlap_datasets else None,
        lambda datasets: self.process.next(self.state, datasets)).state


def flat_examples(arrays: workloads.ClientArrays) -> collections.OrderedDict:
  """Every client's examples as rows of two arrays, client after client."""
  return collections.OrderedDict(
      x=arrays.x.reshape((-1,) + arrays.x.shape[2:]),
      y=arrays.y.reshape((-1,) + arrays.y.shape[2:]))


def round_for(process: tff.learning.templates.LearningProcess,
              workload: workloads.Workload, arrays: workloads.ClientArrays,
              variant: str, calls_at_once: Optional[int] = None) -> TffRound:
  """`variant`'s rounds of `process` on `arrays` (module docstring);
  `FLOOR`'s on the resident round's shards. Shards: one per client call
  the runtime runs at once (`calls_at_once`, default one per core)."""
  if variant == FLOOR:
    variant = 'resident'
  return TffRound(process, datasets_fn_for(workload, arrays, variant,
                                           calls_at_once),
                  overlap_datasets=variant in ('package', 'fused',
                                               'resident'))


def datasets_fn_for(workload: workloads.Workload,
                    arrays: workloads.ClientArrays, variant: str,
                    calls_at_once: Optional[int] = None
                    ) -> Callable[[], list[tf.data.Dataset]]:
  """Where `variant`'s rounds get their client datasets (module docstring)."""
  if variant in ('package', 'fused', 'resident'):
    client_data = workload.client_data(arrays)
    client_ids = client_data.client_ids

    def datasets_fn():
      if variant in ('fused', 'resident'):
        # As the driver batches array-backed clients (Synthetic): in NumPy.
        flat = flat_examples(arrays)
        rows = np.arange(len(flat['x'])).reshape(arrays.num_clients, -1)
        round_shards = shards.shards_from_arrays(
            flat, list(rows),
            shards.BatchRecipe(batch_size=workload.batch_size, shuffle=False),
            shards.auto_clients_per_shard(arrays.num_clients, calls_at_once),
            np.random.default_rng(0), rows_only=variant == 'resident')
        if variant == 'resident':
          return round_shards
        return shards.split_shards(round_shards, shards.MAX_AUTO_SHARD_BYTES)
      return [
          workload.preprocess(client_data.create_tf_dataset_for_client(i))
          for i in client_ids]

    return datasets_fn
  datasets = workload.client_datasets(arrays)
  return lambda: datasets
