"""Flags-to-process for FedOpt and FedSGD (SPEC.md §1).

FedOpt (FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi, FedLARS, FedLamb by
`--server_optimizer`) honours every optimizer, aggregator and server
learning-rate scaling flag. FedSGD takes one full-batch gradient per client
(client rate 1), so it has no client optimizer, batch size, epochs or uniform
weighting. Unset learning rates take the large-cohort paper's tuned rates
(`experiment_driver.tuned_defaults`).
"""

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import flags

from experiment_driver import algorithm_setup
from experiment_driver import flag_groups as f
from experiment_driver import tuned_defaults
from fl_common import diagnosed_mean
from fl_common import shards
from large_cohort import fedopt
from large_cohort import fused

CLIENTS_PER_SHARD = flags.DEFINE_integer(
    'clients_per_shard', None,
    'FedOpt: real clients trained in one call of the client computation'
    ' (large_cohort.fused: a shard, one TensorFlow graph); 1 is one call per'
    ' client. Default: one shard per core of each worker, for the driver\'s'
    ' aggregator without --zeroing (otherwise one call per client).',
    lower_bound=1)

_SERVER_SIDE = (f.SERVER_OPTIMIZER_FLAGS | f.SERVER_LR_SCALING_FLAGS |
                f.AGGREGATOR_FLAGS)
SHARED_FLAGS = {
    'fedopt': (_SERVER_SIDE | f.CLIENT_OPTIMIZER_FLAGS |
               {'uniform_weighting', 'train_batch_size', 'client_epochs'}),
    'fedsgd': _SERVER_SIDE,
}
WHY_NOT = {
    'fedopt': 'FedOpt',
    'fedsgd': ('FedSGD takes one full-batch gradient per client, the mean'
               ' over all its examples, at client rate 1'),
}
OWN_FLAGS = {'clients_per_shard': frozenset({'fedopt'})}


def unused_own_flags(algorithm: str, values: Mapping[str, Any]
                     ) -> dict[str, str]:
  """Own flags that the other flags' values make moot."""
  if algorithm == 'fedopt' and values['zeroing']:
    return {'clients_per_shard': 'cannot be fused with --zeroing (adaptive'
                                 ' zeroing is not part of the fused mean)'}
  if algorithm == 'fedopt' and values['normalize_server_update']:
    return {'clients_per_shard': 'cannot be fused with'
                                 ' --normalize_server_update'}
  return {}


def effective_hparams(algorithm: str, values: Mapping[str, Any]
                      ) -> dict[str, Any]:
  """The learning rates in use: the flags, else the tuned table's."""
  server_lr, client_lr = tuned_defaults.learning_rates(
      values['task'], values['server_optimizer'],
      fedsgd=algorithm == 'fedsgd')
  if values['server_learning_rate'] is not None:
    server_lr = values['server_learning_rate']
  rates = {'server_learning_rate': server_lr}
  if algorithm == 'fedopt':
    rates['client_learning_rate'] = (
        client_lr if values['client_learning_rate'] is None else
        values['client_learning_rate'])
  return rates


def _build_fedopt(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  fusable = isinstance(ctx.model_aggregator, (
      diagnosed_mean.WeightedDiagnosedMeanFactory,
      diagnosed_mean.UnweightedDiagnosedMeanFactory))
  if fusable and CLIENTS_PER_SHARD.value != 1:
    return _build_fused_fedopt(ctx)
  return algorithm_setup.AlgorithmSetup(process=fedopt.build_fedopt(
      ctx.task.model_fn,
      client_optimizer=ctx.client_optimizer,
      server_optimizer=ctx.server_optimizer,
      client_weighting=ctx.client_weighting,
      model_aggregator=ctx.model_aggregator,
  ))


def _build_fused_fedopt(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  """FedOpt on shards: each round's clients grouped `--clients_per_shard` at
  a time, or into one shard per core of each worker."""
  train_data = ctx.task.datasets.train_data
  preprocess = ctx.task.datasets.train_preprocess_fn
  cores = ctx.num_workers * (os.cpu_count() or 1)

  # Array-backed clients with a shuffle-and-batch pipeline (Synthetic) are
  # batched in NumPy; others through their tf.data pipeline.
  recipe = getattr(preprocess, 'batch_recipe', None)
  client_rows = getattr(train_data, 'client_rows', None)

  def client_datasets_fn(round_num, client_ids):
    clients_per_shard = (CLIENTS_PER_SHARD.value or
                         shards.auto_clients_per_shard(len(client_ids), cores))
    if recipe is not None and client_rows is not None:
      return shards.shards_from_arrays(
          train_data.arrays, [client_rows(i) for i in client_ids],
          shards.BatchRecipe(**recipe), clients_per_shard,
          np.random.default_rng([ctx.seed, round_num]))
    return shards.shards_from_client_data(train_data, preprocess, client_ids,
                                         clients_per_shard)

  return algorithm_setup.AlgorithmSetup(
      process=fused.build_fused_fedopt(
          ctx.task.model_fn,
          client_optimizer=ctx.client_optimizer,
          server_optimizer=ctx.server_optimizer,
          client_weighting=ctx.client_weighting,
          model_aggregator=ctx.model_aggregator),
      client_datasets_fn=client_datasets_fn)


def _build_fedsgd(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  return algorithm_setup.AlgorithmSetup(process=fedopt.build_fedsgd(
      ctx.task.model_fn,
      server_optimizer=ctx.server_optimizer,
      model_aggregator=ctx.model_aggregator,
  ))


ALGORITHMS = {'fedopt': _build_fedopt, 'fedsgd': _build_fedsgd}
