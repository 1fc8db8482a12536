"""AdaBest, FedDyn and SCAFFOLD on fused cohorts: one TFF client trains a
shard of real clients, each with its own stored state.

`compose_fused` builds the process that `stateful_process.compose_algorithm`
composes per client (broadcast, the stateful client work, the mean, the
algorithm's server update), in which a TFF client stands for a shard of
clients (`fl_engine.shards`) trained one after the other in one TensorFlow
graph (`fl_engine.fused`, which says how and why). The shard's input is
`StatefulClientInput(shard, client_states)` with its clients' states
stacked in the shard's client order; its output carries their new states
stacked the same way, which `stateful_process.run_round` splits back into
the `ClientStateStore`.

Each client runs the algorithm's own `StatefulClientSteps` (`prepare`,
`corrected_sgd`'s step per batch, `conclude`), so its update, weight, new
state and summed values are those of the per-client client work; non-finite
work is discarded by `guarded_client_result` as there, and its training
metrics are kept, as the per-client client work keeps them. The shard sums
its clients' contributions to the aggregator (`fl_common.diagnosed_mean`,
the driver's mean with the paper's diagnostics), their summed values and
their number (FedDyn's `|P^t|`). State, metrics and their structure are the
per-client process's, so checkpoints and client-state stores carry over
(`tests/fl_engine/test_fused_stateful.py`).

The public entry point is `execution=fl_engine.execution.OnShards(...)` of
`build_adabest`, `build_feddyn` and `build_scaffold`.
"""

import collections
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import stateful_process
from fl_common import communication
from fl_common import diagnosed_mean
from fl_engine import execution as fl_execution
from fl_engine import fused
from fl_engine import lanes as fl_lanes

ModelFn = Callable[[], tff.learning.models.VariableModel]


def _program(steps: stateful_process.StatefulClientSteps) -> fused.ProgramFn:
  """The algorithm's client (`StatefulClientSteps`) for `fl_engine.fused`."""

  def program_fn(model, model_weights, initial_weights):
    cloud_model = tf.nest.flatten(initial_weights.trainable)

    def sgd(aux, context):
      return stateful_process.corrected_sgd(
          model, context.learning_rate,
          lambda gradients, trainable: steps.correction(aux, gradients,
                                                        trainable))

    def start(context, client_state, num_examples):
      aux = steps.prepare(client_state, cloud_model, context,
                          lambda: num_examples)
      initial_loop_state, _ = sgd(aux, context)
      return client_state, aux, initial_loop_state()

    def step(state, batch, context):
      client_state, aux, loop_state = state
      _, sgd_step = sgd(aux, context)
      return client_state, aux, sgd_step(loop_state, batch)

    def finish(state, context):
      client_state, aux, (num_examples, num_steps, _) = state
      pseudo_gradient = stateful_process.model_delta(cloud_model, model)
      result, summed_values = steps.conclude(
          client_state, aux, pseudo_gradient,
          stateful_process.LocalTrainingResult(num_examples, num_steps),
          context)
      upload = tf.nest.pack_sequence_as(
          initial_weights.trainable,
          tf.nest.flatten(result.update.model_update))
      counters = collections.OrderedDict(
          summed_values=summed_values, num_clients=tf.constant(1.0))
      # The per-client client work keeps a discarded client's metrics.
      return (upload, result.update_weight, tf.constant(0), counters,
              result.update.client_state)

    return fused.StatefulClientProgram(start, step, finish)

  return program_fn


def compose(model_fn: ModelFn,
            algorithm: stateful_process.StatefulAlgorithm, *,
            execution: fl_execution.Execution = fl_execution.PER_CLIENT,
            **kwargs) -> stateful_process.StatefulClientLearningProcess:
  """`algorithm` run as `execution` says (`fl_engine.execution`):
  `compose_fused` on shards, else `stateful_process.compose_algorithm` (one
  TFF client per client), with the same `kwargs`."""
  if fl_execution.on_shards(execution):
    return compose_fused(model_fn, algorithm,
                         resident_examples=execution.resident_examples,
                         lanes=execution.lanes, **kwargs)
  return stateful_process.compose_algorithm(model_fn, algorithm, **kwargs)


def compose_fused(
    model_fn: ModelFn,
    algorithm: stateful_process.StatefulAlgorithm,
    *,
    client_learning_rate: float,
    client_learning_rate_decay: float,
    model_aggregator: Optional[diagnosed_mean.WeightedDiagnosedMeanFactory],
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    resident_examples: Optional[Any] = None,
    lanes: int = 1,
) -> stateful_process.StatefulClientLearningProcess:
  """`algorithm` on shards (module docstring), with the per-client
  process's state and metrics:

      next: (<S@SERVER, {StatefulClientInput(shard, stacked C)}@CLIENTS>
             -> StatefulLearningProcessOutput(S@SERVER, M@SERVER,
                                              {stacked C}@CLIENTS))

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    algorithm: The algorithm's parts (`stateful_process.StatefulAlgorithm`).
    client_learning_rate: `η_1`.
    client_learning_rate_decay: The per-round decay factor of `η`.
    model_aggregator: A weighted `diagnosed_mean.diagnosed_mean_factory`
      (without clipping: these algorithms' means are plain); `None` is that
      factory. TFF's `MeanFactory` cannot be split into shards.
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    resident_examples: As `fl_engine.fused.build_fused_process`'s: shards
      are then rows of these arrays.
    lanes: How many of a shard's clients train side by side, vectorized
      (`fl_engine.lanes`); 1: one after the other.

  Raises:
    TypeError: If `model_aggregator` is not a weighted diagnosed mean.
  """
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(clipping=False)
  metrics_aggregator = (metrics_aggregator or
                        tff.learning.metrics.sum_then_finalize)
  weights_type = stateful_process.model_weights_type(model_fn)
  aggregation = fused.FusedAggregation(model_aggregator,
                                       weights_type.trainable, weighted=True)
  client_state_type = algorithm.initial_client_state.type_signature.result
  work_state = stateful_process.client_work_state(
      initial_server_values_fn=algorithm.initial_server_values_fn,
      broadcast_values_fn=algorithm.broadcast_values_fn,
      server_values_update_fn=algorithm.server_values_update_fn,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay)
  initial_model_weights_fn = stateful_process.build_initial_model_weights_fn(
      model_fn)
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  finalizer = algorithm.finalizer

  @tff.federated_computation()
  def initialize_fn():
    return tff.federated_zip(stateful_process.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(),
        tff.federated_eval(work_state.initial, tff.SERVER),
        aggregation.initialize(), finalizer.initialize()))

  state_type = initialize_fn.type_signature.result.member
  resident_examples = fused.as_resident(resident_examples)
  data_type = fused.shard_type(model_fn, resident_examples)
  shard_work = fl_lanes.shard_computation_fn(lanes)(
      model_fn, _program(algorithm.steps), aggregation, weights_type,
      work_state.round_context.type_signature.result, data_type,
      client_state_type, resident_examples=resident_examples)
  metrics_type = shard_work.type_signature.result[1]
  counters_type = shard_work.type_signature.result[2]
  update_work_state = work_state.build_update(counters_type.summed_values)
  aggregate_metrics = metrics_aggregator(model_fn().metric_finalizers(),
                                         metrics_type)
  model_weights = stateful_process.model_weights_functions(
      state_type, algorithm.deployed_model_weights_fn,
      algorithm.with_deployed_model_weights_fn)

  @tff.tensorflow.computation(state_type.client_work, counters_type)
  def update_client_work(work, counters):
    return update_work_state(work, counters['summed_values'])

  @tff.tensorflow.computation(weights_type.trainable, counters_type)
  def cohort_mean(mean, counters):
    return stateful_process.CohortMean(mean, counters['num_clients'])

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(
          tff.StructWithPythonType(
              [('data', data_type),
               ('client_state', fused.stacked_type(client_state_type))],
              stateful_process.StatefulClientInput), tff.CLIENTS))
  def next_fn(state, client_inputs):
    distributor_output = distributor.next(state.distributor,
                                          state.global_model_weights)
    args = collections.OrderedDict(
        weights=distributor_output.result,
        hparams=tff.federated_broadcast(
            tff.federated_map(work_state.round_context, state.client_work)))
    clipping_norm = aggregation.broadcast(state.aggregator)
    if clipping_norm is not None:
      args['clipping_norm'] = clipping_norm
    args['shard'] = client_inputs.data
    args['client_states'] = client_inputs.client_state
    sums, unfinalized_metrics, counters, client_states = tff.federated_map(
        shard_work, tff.federated_zip(args))
    aggregator_output = aggregation.finish(state.aggregator,
                                           tff.federated_sum(sums))
    summed = tff.federated_sum(counters)
    update = aggregator_output.result
    if algorithm.cohort_mean:
      update = tff.federated_map(cohort_mean, (update, summed))
    finalizer_output = finalizer.next(state.finalizer,
                                      state.global_model_weights, update)
    new_state = tff.federated_zip(stateful_process.LearningAlgorithmState(
        finalizer_output.result, distributor_output.state,
        tff.federated_map(update_client_work, (state.client_work, summed)),
        aggregator_output.state, finalizer_output.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributor_output.measurements,
        client_work=tff.federated_zip(collections.OrderedDict(
            train=aggregate_metrics(unfinalized_metrics))),
        aggregator=aggregator_output.measurements,
        finalizer=finalizer_output.measurements,
        model_norms=tff.federated_map(model_weights.norms, new_state)))
    return stateful_process.StatefulLearningProcessOutput(
        new_state, metrics, client_states)

  get_hparams, set_hparams = stateful_process.hparams_functions(
      state_type, finalizer)
  process = stateful_process.StatefulClientLearningProcess(
      initialize_fn, next_fn, model_weights.get, model_weights.set,
      algorithm.initial_client_state, get_hparams_fn=get_hparams,
      set_hparams_fn=set_hparams, on_shards=True)
  # What one client of the per-client process exchanges: the same
  # broadcasts; up, what the per-client aggregator takes from a client,
  # its summed values and its training metrics.
  per_client_aggregator = (
      stateful_process.build_cohort_mean_aggregator(
          model_aggregator, weights_type.trainable)
      if algorithm.cohort_mean else model_aggregator.create(
          weights_type.trainable, tff.TensorType(np.float32)))
  process.client_communication_cost = communication.CommunicationCost(
      bytes_down=communication.communication_cost(process).bytes_down,
      bytes_up=(
          communication.communication_cost(per_client_aggregator).bytes_up +
          communication.type_size_bytes(counters_type.summed_values) +
          communication.type_size_bytes(metrics_type)))
  return process
