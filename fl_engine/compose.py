"""One composer: a client, an aggregator and a server optimizer, run per
client or on shards of clients.

A stateless algorithm is stated once, as its client (`Client`: the program
each client runs, `fl_engine.fused.ClientProgram`, with its
hyperparameters) plus the server's aggregator and optimizer;
`build_process` composes it into a `tff.learning.templates.LearningProcess`
whichever way its clients run (`fl_engine.execution`):

* `PER_CLIENT`: TFF's five slots (`compose_learning_process`): the initial
  weights, TFF's broadcast, the client work running the program on each
  client's dataset (`fl_engine.client_program.build_client_work`), the
  aggregator, TFF's apply-optimizer finalizer;
* `OnShards(lanes, resident_examples)`: the same process with a TFF client
  training a shard of clients in one graph (`fl_engine.fused`,
  `fl_engine.lanes`, `fl_engine.resident`).

Both take the same aggregator (`model_aggregator`: a weighted factory, or an
unweighted one for a client whose update is unweighted; on shards a
`fl_common.diagnosed_mean` factory, which shards can compute) and have the
same state and metrics, so a checkpoint of one resumes the other
(`tests/test_builders_conformance.py`: their rounds are equal).

A stateful algorithm (clients that keep a state between the rounds they take
part in: `stateful_process.StatefulAlgorithm`, its client steps, server
values and finalizer) is composed by the same call, with its client rate
and decay instead of a server optimizer (its finalizer has one); per client
by `stateful_process.compose_algorithm`, on shards by
`fused_stateful.compose_fused`.

Every builder of the papers is this call with its own client:
`large_cohort.build_fedopt`, `build_fedsgd`, `gel_tff.build_gel`,
`build_budgeted_baseline` (stateless); `adabest_tff.build_adabest`,
`build_feddyn`, `build_scaffold` (stateful).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional, Union

import numpy as np
import tensorflow_federated as tff

from fl_engine import client_program as client_program_lib
from fl_common import diagnosed_mean
from fl_engine import execution as fl_execution
from fl_common import fednova
from fl_engine import fused
from fl_engine import fused_stateful
from fl_engine import lanes as fl_lanes
from fl_engine import stateful_process

ModelFn = Callable[[], tff.learning.models.VariableModel]
_ITERATOR_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


@dataclasses.dataclass(frozen=True)
class Client:
  """What each client of a stateless algorithm does, stated once.

  Attributes:
    program_fn: `(model, model_weights, initial_weights) -> ClientProgram`
      (`fl_engine.fused.ClientProgram`): a client's local steps and upload.
    initial_hparams_fn: A no-arg TFF computation: the hyperparameters the
      program receives (the client work's state).
    measurements_fn: `(train metrics, summed counters)` at the server -> the
      client work's measurements.
    train_model_fn: `model_fn -> the model a client trains` (e.g. one that
      skips its initializers, `large_cohort.fedopt.client_model_fn`); None:
      `model_fn`'s.
    weighted: Whether the client's update is averaged with its weight (False:
      uniformly, through an unweighted aggregator).
    normalizer: Whether the client sends FedNova's normalizer with its update
      (`fl_common.fednova`: the aggregate is normalized averaging).
  """

  program_fn: fused.ProgramFn
  initial_hparams_fn: tff.Computation
  measurements_fn: Callable[[Any, Any], Any] = fused.train_measurements
  train_model_fn: Optional[Callable[[ModelFn], ModelFn]] = None
  weighted: bool = True
  normalizer: bool = False


def build_process(
    model_fn: ModelFn,
    client: Union[Client, stateful_process.StatefulAlgorithm],
    *,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    model_aggregator: Optional[Any] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
    client_learning_rate: Optional[float] = None,
    client_learning_rate_decay: float = 1.0,
) -> tff.learning.templates.LearningProcess:
  """`client`'s algorithm as a learning process (module docstring).

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client: The algorithm's client: a `Client`, or a
      `stateful_process.StatefulAlgorithm` (clients with state).
    server_optimizer: For a `Client`: the finalizer's optimizer, applied to
      the aggregate.
    model_aggregator: Averages the clients' updates: a weighted factory
      (an unweighted one if `client.weighted` is False); on shards a
      `diagnosed_mean.diagnosed_mean_factory`. None: the mean (on shards the
      diagnosed mean without clipping).
    metrics_aggregator: Aggregates the training metrics; TFF's
      `sum_then_finalize` when `None`.
    loop_implementation: TFF's loop over a client's batches, per client.
    execution: How the clients run (`fl_engine.execution`).
    client_learning_rate: For a stateful algorithm: its clients' SGD rate
      `η_1`.
    client_learning_rate_decay: For a stateful algorithm: the per-round
      decay factor of its clients' rate.

  Raises:
    TypeError: If `model_aggregator` is not of the kind above.
    ValueError: On shards, lanes with a model or a client optimizer that
      does not vectorize.
  """
  if isinstance(client, stateful_process.StatefulAlgorithm):
    if server_optimizer is not None or client_learning_rate is None:
      raise TypeError('a stateful algorithm takes client_learning_rate, and'
                      ' its finalizer its server optimizer')
    return fused_stateful.compose(
        model_fn, client, execution=execution,
        client_learning_rate=client_learning_rate,
        client_learning_rate_decay=client_learning_rate_decay,
        model_aggregator=model_aggregator,
        metrics_aggregator=metrics_aggregator)
  if server_optimizer is None or client_learning_rate is not None:
    raise TypeError('a Client takes server_optimizer; its client optimizer'
                    ' is its program\'s')
  train_model_fn = (client.train_model_fn(model_fn) if client.train_model_fn
                    else model_fn)
  if fl_execution.on_shards(execution):
    return _on_shards(model_fn, train_model_fn, client, server_optimizer,
                      model_aggregator, metrics_aggregator, execution)
  return _per_client(model_fn, train_model_fn, client, server_optimizer,
                     model_aggregator, metrics_aggregator, loop_implementation)


def _per_client(model_fn, train_model_fn, client, server_optimizer,
                model_aggregator, metrics_aggregator, loop_implementation):
  """TFF's five slots, as TFF's FedAvg composes its own."""
  if client.weighted:
    expected = tff.aggregators.WeightedAggregationFactory
    model_aggregator = model_aggregator or tff.aggregators.MeanFactory()
  else:
    expected = tff.aggregators.UnweightedAggregationFactory
    model_aggregator = (model_aggregator or
                        tff.aggregators.UnweightedMeanFactory())
  if not isinstance(model_aggregator, expected):
    raise TypeError(
        f'model_aggregator must be a tff.aggregators.{expected.__name__}'
        f' for {"weighted" if client.weighted else "unweighted"} client'
        f' updates, got {type(model_aggregator).__name__}.')
  if not client.weighted:
    model_aggregator = tff.aggregators.as_weighted_aggregator(
        model_aggregator)

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  update_type = weights_type.trainable
  if client.normalizer:
    model_aggregator = fednova.FedNovaAggregationFactory(model_aggregator)
    update_type = fednova.fednova_update_type(update_type)
  client_work = client_program_lib.build_client_work(
      train_model_fn, client.program_fn,
      initial_hparams_fn=client.initial_hparams_fn,
      client_measurements_fn=client.measurements_fn,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      model_aggregator.create(update_type, tff.TensorType(np.float32)),
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer, weights_type))


def _on_shards(model_fn, train_model_fn, client, server_optimizer,
               model_aggregator, metrics_aggregator, execution):
  """The same process, a TFF client per shard (`fl_engine.fused`)."""
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(
        clipping=False, weighted=client.weighted)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  return fused.build_fused_process(
      model_fn,
      initial_hparams_fn=client.initial_hparams_fn,
      program_fn=client.program_fn,
      aggregation=fused.FusedAggregation(
          model_aggregator, weights_type.trainable, weighted=client.weighted,
          fednova=client.normalizer),
      server_optimizer=server_optimizer,
      client_measurements_fn=client.measurements_fn,
      metrics_aggregator=metrics_aggregator,
      shard_model_fn=train_model_fn,
      resident_examples=execution.resident_examples,
      shard_computation_fn=fl_lanes.shard_computation_fn(execution.lanes))
