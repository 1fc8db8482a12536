"""FedOpt and FedSGD with fused cohorts: one TFF client trains a shard of
real clients.

`build_fused_fedopt` builds the same algorithm as `build_fedopt` with the
driver's aggregator (`fl_common.diagnosed_mean`: the mean, adaptive clipping
and the paper's diagnostics), in which a TFF client stands for a shard of
real clients, trained one after the other in one TensorFlow graph
(`fl_common.fused`, which says how and why). Each client of a shard starts
from the broadcast model with a fresh client optimizer state and takes one
local step per batch, as `build_fedopt`'s client work; its update is
screened, weighted (examples, or uniform) and clipped as the per-client
aggregator does. State, metrics and their structure are `build_fedopt`'s,
so checkpoints and metric names carry over (`tests/large_cohort/test_fused.py`).
`build_fused_fedsgd` is `build_fedsgd` (TFF's FedSGD) on shards in the same
way: each client's gradient is the example-weighted mean of its batch
gradients at the broadcast model.
"""

import collections
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from fl_common import fused
from fl_common import lanes as fl_lanes
from large_cohort import fedopt

ModelFn = Callable[[], tff.learning.models.VariableModel]


def build_fused_fedopt(
    model_fn: ModelFn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[fused.DiagnosedMeanFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    resident_examples: Optional[Any] = None,
    lanes: int = 1,
) -> tff.learning.templates.LearningProcess:
  """Builds FedOpt (Algorithm 1) on shards of clients (module docstring).

  The process has `build_fedopt`'s state and metrics; its client data are
  shards (`fl_common.shards`), not single clients:

      next: (<state@SERVER, {shard}@CLIENTS> -> LearningProcessOutput(
             state@SERVER, metrics@SERVER))

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (`ClientOpt`, rate η_c).
    server_optimizer: The server optimizer (`ServerOpt`, rate η_s).
    client_weighting: `NUM_EXAMPLES` (default) or `UNIFORM`.
    model_aggregator: A `diagnosed_mean.diagnosed_mean_factory` (weighted
      with `NUM_EXAMPLES`, unweighted with `UNIFORM`); default: the mean
      with diagnostics, without clipping.
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    resident_examples: The population's examples held on the worker
      (`fl_common.resident.ResidentExamples`, or NumPy arrays shaped as the
      model's input, one row per example, to hold); each round's shards are
      then rows of them (`shards_from_arrays(..., rows_only=True)`).
      Default: shards carry examples.
    lanes: How many of a shard's clients train side by side, vectorized
      (`fl_common.lanes`; e.g. `lanes.auto_lanes(model_fn)`); 1 (default):
      one after the other. Lanes need a model whose forward pass
      vectorizes and metrics that add over clients.

  Raises:
    TypeError: If `model_aggregator` is not a diagnosed mean of the right
      weighting (the fused shard computes its per-client part itself).
    ValueError: If `lanes` < 1, or `lanes` > 1 with a model or a client
      optimizer that does not vectorize.
  """
  weighted = client_weighting is not tff.learning.ClientWeighting.UNIFORM
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(
        clipping=False, weighted=weighted)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  aggregation = fused.FusedAggregation(model_aggregator,
                                       weights_type.trainable,
                                       weighted=weighted)
  specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in
                tff.types.type_to_tf_tensor_specs(weights_type.trainable))

  @tff.tensorflow.computation()
  def initial_hparams_fn():
    return client_optimizer.get_hparams(client_optimizer.initialize(specs))

  return fused.build_fused_process(
      model_fn,
      initial_hparams_fn=initial_hparams_fn,
      program_fn=fedopt.client_program(client_optimizer, weighted),
      aggregation=aggregation,
      server_optimizer=server_optimizer,
      client_measurements_fn=lambda train, counters: collections.OrderedDict(
          train=train),
      metrics_aggregator=metrics_aggregator,
      shard_model_fn=fedopt.client_model_fn(model_fn),
      resident_examples=resident_examples,
      shard_computation_fn=fl_lanes.shard_computation_fn(lanes))


def build_fused_fedsgd(
    model_fn: ModelFn,
    *,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[fused.DiagnosedMeanFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    resident_examples: Optional[Any] = None,
    lanes: int = 1,
) -> tff.learning.templates.LearningProcess:
  """Builds FedSGD (`build_fedsgd`) on shards of clients (module docstring).

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    server_optimizer: The server optimizer applied to the mean gradient.
    model_aggregator: A weighted `diagnosed_mean.diagnosed_mean_factory`;
      default: the mean with diagnostics, without clipping.
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    resident_examples: The population's examples held on the worker
      (`fl_common.resident.ResidentExamples`, or NumPy arrays shaped as the
      model's input, one row per example, to hold); each round's shards are
      then rows of them (`shards_from_arrays(..., rows_only=True)`).
      Default: shards carry examples.
    lanes: As `build_fused_fedopt`'s.

  Raises:
    TypeError: If `model_aggregator` is not a weighted diagnosed mean.
    ValueError: As `build_fused_fedopt`'s, for `lanes`.
  """
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(clipping=False)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)

  @tff.tensorflow.computation()
  def initial_hparams_fn():  # TFF's FedSGD client work has no state.
    return ()

  return fused.build_fused_process(
      model_fn,
      initial_hparams_fn=initial_hparams_fn,
      program_fn=fedopt.fedsgd_client_program(),
      aggregation=fused.FusedAggregation(
          model_aggregator, weights_type.trainable, weighted=True),
      server_optimizer=server_optimizer,
      client_measurements_fn=lambda train, counters: collections.OrderedDict(
          train=train),
      metrics_aggregator=metrics_aggregator,
      resident_examples=resident_examples,
      shard_computation_fn=fl_lanes.shard_computation_fn(lanes))
