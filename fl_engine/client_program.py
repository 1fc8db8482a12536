"""A client program run one TFF client per client: the per-client half of
"one client definition, composed two ways".

An algorithm states what one client does once, as a `fl_engine.fused.
ClientProgram` (`start` from the client work's hyperparameters, a `step` per
batch that updates the model, `finish` giving the upload, its weight, whether
it was non-finite and counters). It is then composed either way:

* `build_client_work` (here): a `tff.learning.templates.ClientWorkProcess`
  in which each TFF client is one client and runs the program over its
  `tf.data` dataset, as TFF's own client works do
  (`tff.learning.templates.build_model_delta_client_work`, whose behaviour it
  keeps: an example-counting iterator loop, a non-finite client's metrics
  reset, its upload zero and its weight 0);
* `fl_engine.fused.build_fused_process`: a TFF client is a shard of clients,
  each running the same program in one graph.

Which one is chosen where the process is composed, not in the program; the
conformance suite (`tests/test_builders_conformance.py`) checks for every
builder that the two give the same round.
"""

import collections
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import fused

ModelFn = Callable[[], tff.learning.models.VariableModel]
_ITERATOR_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


def optimizer_hparams_fn(optimizer: tff.learning.optimizers.Optimizer
                         ) -> tff.Computation:
  """A client work's state when it is `optimizer`'s hyperparameters (which
  do not depend on the weights' shapes: TFF's client works read them off a
  scalar's optimizer state too)."""

  @tff.tensorflow.computation()
  def initial_hparams_fn():
    return optimizer.get_hparams(
        optimizer.initialize(tf.TensorSpec([], tf.float32)))

  return initial_hparams_fn


def build_client_update_fn(
    model_fn: ModelFn,
    program_fn: fused.ProgramFn,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
) -> Callable[[Any, Any, tf.data.Dataset], tuple[Any, Any, Any]]:
  """One client's round as a `tf.function` on a new model of `model_fn`:
  `(hparams, initial weights, dataset) -> (ClientResult, unfinalized
  metrics, counters)`, the program run over the dataset's batches (what
  `build_client_work` runs on each client; callable eagerly, e.g. on a
  probe)."""
  model = model_fn()
  training_loop = tff.learning.loop_builder.build_training_loop(
      loop_implementation)

  @tf.function
  def client_update(hparams, initial_weights, dataset):
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), model_weights,
                          initial_weights)
    program = program_fn(model, model_weights, initial_weights)
    state = training_loop(
        lambda state, batch: program.step(state, batch, hparams), dataset,
        lambda: program.start(hparams))
    upload, weight, non_finite, counters = program.finish(state, hparams)
    if non_finite > 0:  # TFF's client works drop such a client's metrics.
      model.reset_metrics()
    return (tff.learning.templates.ClientResult(update=upload,
                                                update_weight=weight),
            model.report_local_unfinalized_metrics(), counters)

  return client_update


def build_client_work(
    model_fn: ModelFn,
    program_fn: fused.ProgramFn,
    *,
    initial_hparams_fn: tff.Computation,
    client_measurements_fn: Optional[
        Callable[[Any, Any], collections.OrderedDict]] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
) -> tff.learning.templates.ClientWorkProcess:
  """The client work that runs `program_fn`'s program on each client.

  Its state is the program's hyperparameters (`initial_hparams_fn`), read
  and replaced by `get_hparams` / `set_hparams` as in TFF's client works:

      next: (<hparams@SERVER, weights@CLIENTS, {D*}@CLIENTS> ->
             MeasuredProcessOutput(hparams@SERVER, ClientResult@CLIENTS,
                                   measurements@SERVER))

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`
      built from scratch on each call; the model each client trains, its
      weights first set to the broadcast ones.
    program_fn: `(model, model_weights, initial_weights) -> ClientProgram`
      (`fl_engine.fused.ClientProgram`).
    initial_hparams_fn: A no-arg TFF computation: the hyperparameters the
      program's `start`, `step` and `finish` receive.
    client_measurements_fn: `(train metrics, summed counters)` at the server
      -> the measurements (an `OrderedDict`); default `train=` the metrics.
      The same function as `build_fused_process`'s.
    metrics_aggregator: Aggregates the model's training metrics;
      `tff.learning.metrics.sum_then_finalize` when `None`.
    loop_implementation: TFF's loop over a client's batches; the iterator
      loop by default (`large_cohort.fedopt` says why).
  """
  metrics_aggregator = (metrics_aggregator or
                        tff.learning.metrics.sum_then_finalize)
  client_measurements_fn = client_measurements_fn or fused.train_measurements
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = metrics_aggregator(model.metric_finalizers())
    weights_type = tff.learning.models.weights_type_from_model(model)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  hparams_type = initial_hparams_fn.type_signature.result

  @tff.federated_computation()
  def init_fn():
    return tff.federated_eval(initial_hparams_fn, tff.SERVER)

  @tff.tensorflow.computation(hparams_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(hparams_type, hparams_type)
  def set_hparams_fn(state, hparams):
    del state
    return hparams

  @tff.tensorflow.computation(hparams_type, weights_type, data_type)
  def client_update_computation(hparams, initial_weights, dataset):
    client_update = build_client_update_fn(model_fn, program_fn,
                                           loop_implementation)
    return client_update(hparams, initial_weights, dataset)

  counters_type = client_update_computation.type_signature.result[2]

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    client_result, model_outputs, counters = tff.federated_map(
        client_update_computation,
        (tff.federated_broadcast(state), weights, client_data))
    summed_counters = fused.sum_counters(counters, counters_type)
    measurements = tff.federated_zip(client_measurements_fn(
        metrics_aggregation_fn(model_outputs), summed_counters))
    return tff.templates.MeasuredProcessOutput(state, client_result,
                                               measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn, get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn)
