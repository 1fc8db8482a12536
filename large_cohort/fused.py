"""FedOpt with fused cohorts: one TFF client trains a shard of real clients.

With small models a round's arithmetic per client is microseconds, and the
runtime's per-client cost (a call of the client computation, its arguments
and results as separate values, the aggregator's `accumulate` per client)
is most of the round. `build_fused_fedopt` builds the same algorithm as
`build_fedopt` with the driver's aggregator (`fl_common.diagnosed_mean`:
the mean, adaptive clipping and the paper's diagnostics), in which a TFF
client stands for a *shard*: several real clients' batches, read in the
driver into plain tensors (`fl_common.shards`: every batch's examples
concatenated plus the batch sizes, each client closed by an empty batch).
No tf.data pipeline runs on the worker. One call of the shard computation,
one TensorFlow graph (`tf.while_loop` over the batches, `tf.cond` between
a step and a client's close; no AutoGraph, whose conversion of the model
took seconds of start-up), trains every client of the shard in turn:

* from the broadcast model, with a fresh client optimizer state, one local
  step per batch, as `build_fedopt`'s client work;
* at its closing batch: its update `Δ_k = x − x_k` with TFF's screening
  (a non-finite update becomes zeros with weight 0, and that client's local
  metrics are dropped, as TFF's `build_model_delta_client_work` resets them),
  its weight (examples, or uniform), and its contribution to the diagnosed
  mean's sums, clipped to the broadcast norm `ρ`
  (`diagnosed_mean.client_contribution`: the same function the per-client
  aggregator's `accumulate` runs);
* then the model and optimizer are reset for the next client.

The shard returns its partial sums and its clients' summed unfinalized
metrics; the server sums the shards and finishes exactly as the per-client
aggregator does (`diagnosed_mean.build_server_computation`,
`finish_round`). State, metrics and their structure are those of
`build_fedopt`'s process, so checkpoints and metric names carry over, and a
round on shards equals a round on the same clients one per TFF client, up
to the order of float additions (`tests/test_fused.py`).

Shards are ordinary TFF clients: the same process runs on the local worker
and across `--worker_addresses`, each worker taking whole shards.
"""

import collections
from collections.abc import Callable
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from large_cohort import fedopt

ModelFn = Callable[[], tff.learning.models.VariableModel]
DiagnosedMeanFactory = Union[diagnosed_mean.WeightedDiagnosedMeanFactory,
                             diagnosed_mean.UnweightedDiagnosedMeanFactory]


def _shard_work(
    model_fn: ModelFn,
    client_optimizer: tff.learning.optimizers.Optimizer,
    weighted: bool,
    clipping: bool,
    weights_type: tff.types.Type,
    hparams_type: tff.types.Type,
    data_type: tff.types.Type,
) -> tff.Computation:
  """`<weights, hparams[, clipping_norm], shard> -> <sums, unfinalized
  metrics>`."""
  arg_types = [('weights', weights_type), ('hparams', hparams_type)]
  if clipping:
    arg_types.append(('clipping_norm', tff.TensorType(np.float32)))
  arg_types.append(('shard', data_type))
  client_model_fn = fedopt.client_model_fn(model_fn)

  @tff.tensorflow.computation(
      tff.StructWithPythonType(arg_types, collections.OrderedDict))
  def shard_work(args):
    clipping_norm = args['clipping_norm'] if clipping else None
    initial_weights, hparams, shard = (args['weights'], args['hparams'],
                                       args['shard'])
    model = client_model_fn()
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    trainable_specs = tuple(tf.TensorSpec(v.shape, v.dtype)
                            for v in tf.nest.flatten(model_weights.trainable))
    metric_variables = list(model.local_variables)

    def contribution(update, weight):
      return diagnosed_mean.client_contribution(
          update, weight if weighted else None, clipping_norm)

    # Written with tf.while_loop and tf.cond, not AutoGraph: converting the
    # model's Python (Keras) for AutoGraph took seconds of every run's
    # start-up.
    @tf.function(autograph=False)
    def train_shard(initial_weights, hparams, examples, batch_sizes):

      def assign(variables, values):
        return [v.assign(t) for v, t in zip(tf.nest.flatten(variables),
                                            tf.nest.flatten(values))]

      def fresh_optimizer_state():
        state = client_optimizer.initialize(trainable_specs)
        if hparams:
          state = client_optimizer.set_hparams(state, hparams)
        return state

      def read_metrics():
        return [v.read_value() for v in metric_variables]

      assign(model_weights, initial_weights)
      zero_update = tf.nest.map_structure(tf.zeros_like,
                                          initial_weights.trainable)
      sums = tf.nest.map_structure(
          tf.zeros_like, contribution(zero_update, tf.constant(0.0)))
      ends = tf.cumsum(batch_sizes)

      def train_on_batch(i, optimizer_state, num_examples, sums, snapshot):
        batch = tf.nest.map_structure(
            lambda t: t[ends[i] - batch_sizes[i]:ends[i]], examples)
        with tf.GradientTape() as tape:
          output = model.forward_pass(batch, training=True)
        gradients = tape.gradient(output.loss, model_weights.trainable)
        optimizer_state, updated = client_optimizer.next(
            optimizer_state,
            tuple(tf.nest.flatten(model_weights.trainable)),
            tuple(tf.nest.flatten(gradients)))
        assign(model_weights.trainable, updated)
        if output.num_examples is None:
          count = tf.shape(output.predictions, out_type=tf.int64)[0]
        else:
          count = tf.cast(output.num_examples, tf.int64)
        return optimizer_state, num_examples + count, sums, snapshot

      def close_client(i, optimizer_state, num_examples, sums, snapshot):
        """The closing batch: the client's update, then a reset."""
        del i, optimizer_state
        update = tf.nest.map_structure(tf.subtract, initial_weights.trainable,
                                       model_weights.trainable)
        update, non_finite = _zero_all_if_any_non_finite(update)
        weight = tf.where(non_finite > 0, 0.0,
                          tf.cast(num_examples, tf.float32))
        sums = tf.nest.map_structure(tf.add, sums,
                                     contribution(update, weight))

        def restore_metrics():  # As TFF resets a non-finite client's.
          with tf.control_dependencies(assign(metric_variables, snapshot)):
            return tf.constant(0)

        with tf.control_dependencies([tf.cond(
            non_finite > 0, restore_metrics, lambda: tf.constant(0))]):
          with tf.control_dependencies(assign(model_weights,
                                              initial_weights)):
            return (fresh_optimizer_state(), tf.zeros([], tf.int64), sums,
                    read_metrics())

      # An outer loop over the clients, an inner one over a client's
      # batches: no branch per step. `markers` are the closing batches.
      markers = tf.cast(tf.reshape(tf.where(tf.equal(batch_sizes, 0)), [-1]),
                        tf.int32)

      def client_body(c, optimizer_state, sums, snapshot):
        first = tf.where(c > 0, markers[tf.maximum(c - 1, 0)] + 1, 0)

        def step(i, optimizer_state, num_examples):
          optimizer_state, num_examples, _, _ = train_on_batch(
              i, optimizer_state, num_examples, None, None)
          return i + 1, optimizer_state, num_examples

        _, optimizer_state, num_examples = tf.while_loop(
            lambda i, *_: i < markers[c], step,
            (first, optimizer_state, tf.zeros([], tf.int64)))
        optimizer_state, _, sums, snapshot = close_client(
            None, optimizer_state, num_examples, sums, snapshot)
        return c + 1, optimizer_state, sums, snapshot

      _, _, sums, _ = tf.while_loop(
          lambda c, *_: c < tf.size(markers), client_body,
          (tf.constant(0), fresh_optimizer_state(), sums, read_metrics()))
      return sums, model.report_local_unfinalized_metrics()

    return train_shard(initial_weights, hparams, shard['examples'],
                       shard['batch_sizes'])

  return shard_work


def _batched_spec(input_spec):
  """The model's input spec as batches: a leading `None` dimension."""
  return tf.nest.map_structure(
      lambda spec: tf.TensorSpec([None, *spec.shape[1:]], spec.dtype),
      input_spec)


def _zero_all_if_any_non_finite(structure):
  """TFF's `tensor_utils.zero_all_if_any_non_finite` (not exported by
  `tff.learning`): `(structure, 0)`, or `(zeros, 1)` if any entry is NaN or
  Inf."""
  flat = tf.nest.flatten(structure)
  all_finite = tf.reduce_all(
      tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in flat]))
  return tf.cond(
      all_finite, lambda: (structure, tf.constant(0)),
      lambda: (tf.nest.map_structure(tf.zeros_like, structure),
               tf.constant(1)))


def build_fused_fedopt(
    model_fn: ModelFn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[DiagnosedMeanFactory] = None,
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

  Raises:
    TypeError: If `model_aggregator` is not a diagnosed mean of the right
      weighting (the fused shard computes its per-client part itself).
  """
  uniform = client_weighting is tff.learning.ClientWeighting.UNIFORM
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(
        clipping=False, weighted=not uniform)
  expected = (diagnosed_mean.UnweightedDiagnosedMeanFactory if uniform else
              diagnosed_mean.WeightedDiagnosedMeanFactory)
  if not isinstance(model_aggregator, expected):
    raise TypeError(
        f'fused shards need a {expected.__name__} (diagnosed_mean_factory('
        f'weighted={not uniform})) with client_weighting={client_weighting},'
        f' got {model_aggregator!r}.')
  settings = model_aggregator.settings
  clipping = settings['clipping']

  # build_fedopt's state, from the same parts, without tracing its client
  # work (seconds of AutoGraph conversion): what the per-client process
  # would start from, so that states and checkpoints carry over.
  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  trainable_specs = tuple(
      tf.TensorSpec(t.shape, t.dtype)
      for t in tff.types.type_to_tf_tensor_specs(weights_type.trainable))

  @tff.tensorflow.computation()
  def initial_hparams_fn():
    return client_optimizer.get_hparams(
        client_optimizer.initialize(trainable_specs))

  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  if uniform:
    aggregator = model_aggregator.create(weights_type.trainable)
  else:
    aggregator = model_aggregator.create(weights_type.trainable,
                                         tff.TensorType(np.float32))
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)

  @tff.federated_computation()
  def initialize_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(),
        tff.federated_eval(initial_hparams_fn, tff.SERVER),
        aggregator.initialize(), finalizer.initialize()))

  state_type = initialize_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, model_weights):
    return tff.learning.templates.LearningAlgorithmState(
        model_weights, state.distributor, state.client_work, state.aggregator,
        state.finalizer)

  element_type = tff.types.tensorflow_to_type(
      _batched_spec(model_fn().input_spec))
  data_type = tff.StructWithPythonType(
      [('examples', element_type),
       ('batch_sizes', tff.TensorType(np.int64, [None]))],
      collections.OrderedDict)
  shard_work = _shard_work(model_fn, client_optimizer, not uniform, clipping,
                           weights_type, state_type.client_work, data_type)
  sums_type = shard_work.type_signature.result[0]
  server_computation = diagnosed_mean.build_server_computation(
      sums_type, not uniform, clipping, settings['target_quantile'],
      settings['clipping_learning_rate'])
  model = model_fn()
  metrics_type = shard_work.type_signature.result[1]
  aggregate_metrics = tff.learning.metrics.sum_then_finalize(
      model.metric_finalizers(), metrics_type)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, shards):
    distributor_output = distributor.next(state.distributor,
                                          state.global_model_weights)
    args = collections.OrderedDict(
        weights=distributor_output.result,
        hparams=tff.federated_broadcast(state.client_work))
    if clipping:
      args['clipping_norm'] = tff.federated_broadcast(state.aggregator)
    args['shard'] = shards
    sums, unfinalized_metrics = tff.federated_map(shard_work,
                                                  tff.federated_zip(args))
    summed = tff.federated_sum(sums)
    outputs = tff.federated_map(
        server_computation,
        tff.federated_zip((summed, state.aggregator)) if clipping else summed)
    aggregator_output = diagnosed_mean.finish_round(
        state.aggregator, outputs, weighted=not uniform, clipping=clipping)
    client_work_measurements = tff.federated_zip(collections.OrderedDict(
        train=aggregate_metrics(unfinalized_metrics)))
    finalizer_output = finalizer.next(state.finalizer,
                                      state.global_model_weights,
                                      aggregator_output.result)
    new_state = tff.federated_zip(
        tff.learning.templates.LearningAlgorithmState(
            finalizer_output.result, distributor_output.state,
            state.client_work, aggregator_output.state,
            finalizer_output.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributor_output.measurements,
        client_work=client_work_measurements,
        aggregator=aggregator_output.measurements,
        finalizer=finalizer_output.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  return tff.learning.templates.LearningProcess(
      initialize_fn, next_fn, get_model_weights, set_model_weights)
