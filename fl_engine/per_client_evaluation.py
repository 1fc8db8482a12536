"""Per-client evaluation and its percentiles (Charles et al. 2021, §3.4, B.4).

The paper's fairness measurement: evaluate the trained model on every test
client separately and report the 5th, 25th, 50th, 75th and 95th percentiles
of the per-client accuracies (Figure 6, Tables 6-9).

`build_per_client_evaluation(model_fn)` returns a federated computation
`(model_weights@SERVER, {dataset}@CLIENTS) -> {metrics}@CLIENTS`: the server
broadcasts the weights, each client evaluates them on its own data
(`forward_pass(training=False)` over every batch) and returns its metrics
both finalized (`finalized`, e.g. its accuracy) and unfinalized
(`unfinalized`, e.g. accuracy as `[correct, count]`). Called from Python with
a list of datasets, it returns one structure per client, in the same order.
The unfinalized metrics summed over clients (`sum_over_clients`, or
`sum_over_shards` of a fused evaluation) and
finalized (`MetricsFinalizer`) are the cohort's example-weighted metrics:
TFF's `sum_then_finalize`, the aggregation of
`tff.learning.algorithms.build_fed_eval`. One pass over the clients thus gives
both the aggregate and the per-client values. `accuracy_percentiles`
summarizes the latter.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import fused

DEFAULT_PERCENTILES = (5, 25, 50, 75, 95)

ModelFn = Callable[[], tff.learning.models.VariableModel]


def _check_model(model: Any) -> tff.learning.models.VariableModel:
  if not isinstance(model, tff.learning.models.VariableModel):
    raise ValueError(
        'model_fn must return a tff.learning.models.VariableModel, got '
        f'{type(model).__name__}.')
  return model


def build_per_client_evaluation(model_fn: ModelFn) -> tff.Computation:
  """Builds the evaluation that returns each client's metrics.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel` (e.g. a `BaselineTask.model_fn`).

  Returns:
    A `tff.Computation` of type
    `(<M@SERVER, {B*}@CLIENTS> -> {<finalized=F, unfinalized=U>}@CLIENTS)`,
    with `M` the model weights type (`tff.learning.models.ModelWeights`), `B`
    the batch type, `U` the model's `report_local_unfinalized_metrics()` and
    `F` those finalized by its `metric_finalizers()`.

  Raises:
    ValueError: If `model_fn` does not return a `VariableModel`.
  """
  with tf.Graph().as_default():
    model = _check_model(model_fn())
    weights_type = tff.learning.models.weights_type_from_model(model)
    batch_type = tff.types.tensorflow_to_type(model.input_spec)

  @tff.tensorflow.computation(weights_type, tff.SequenceType(batch_type))
  @tf.function
  def evaluate_client(incoming_weights, dataset):
    with tf.init_scope():
      client_model = model_fn()
    tf.nest.map_structure(
        lambda variable, value: variable.assign(value),
        tff.learning.models.ModelWeights.from_model(client_model),
        incoming_weights)

    # An iterator loop, not `dataset.reduce`, as in FedOpt's client work
    # (`large_cohort/fedopt.py`): the forward pass then sits in the main
    # graph instead of a tf.data function the worker re-instantiates for
    # every client.
    for batch in iter(dataset):
      client_model.forward_pass(batch, training=False)
    unfinalized = client_model.report_local_unfinalized_metrics()
    finalized = collections.OrderedDict(
        (name, finalizer(unfinalized[name]))
        for name, finalizer in client_model.metric_finalizers().items())
    return collections.OrderedDict(finalized=finalized,
                                   unfinalized=unfinalized)

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(tff.SequenceType(batch_type), tff.CLIENTS))
  def per_client_evaluation(model_weights, datasets):
    return tff.federated_map(
        evaluate_client, (tff.federated_broadcast(model_weights), datasets))

  return per_client_evaluation


def build_fused_per_client_evaluation(
    model_fn: ModelFn,
    resident_examples: Optional[Any] = None) -> tff.Computation:
  """`build_per_client_evaluation` for shards of clients (`fl_engine.shards`):
  one call evaluates every client of a shard, in one TensorFlow graph.

  Returns:
    A `tff.Computation` of type `(<M@SERVER, {shard}@CLIENTS> ->
    {<finalized=F, unfinalized=U>}@CLIENTS)` whose every tensor has a
    leading dimension over the shard's clients, in order (`split_clients`
    turns a call's result into `build_per_client_evaluation`'s list).
    With `resident_examples` (the population's examples held on the worker:
    `fl_engine.resident.ResidentExamples`, or NumPy arrays to hold), a shard
    is `<rows, batch_sizes>`.

  Raises:
    ValueError: If `model_fn` does not return a `VariableModel`.
  """
  with tf.Graph().as_default():
    model = _check_model(model_fn())
    weights_type = tff.learning.models.weights_type_from_model(model)
  resident_examples = fused.as_resident(resident_examples)
  model_fn = fused.with_called_predictions(model_fn)
  shard_type = fused.shard_type(model_fn, resident_examples)

  @tff.tensorflow.computation(weights_type, shard_type)
  def evaluate_shard(incoming_weights, shard):
    client_model = model_fn()
    metric_variables = list(client_model.local_variables)
    finalizers = client_model.metric_finalizers()

    # tf.while_loop and tf.cond rather than AutoGraph (as in
    # `fl_engine.fused`): converting the model's Python costs seconds; the
    # model's functions inlined in the loop (`fused.trace_inlined`).
    def evaluate_clients(incoming_weights, examples, rows, batch_sizes):
      tf.nest.map_structure(
          lambda variable, value: variable.assign(value),
          tff.learning.models.ModelWeights.from_model(client_model),
          incoming_weights)
      ends = tf.cumsum(batch_sizes)
      num_clients = tf.reduce_sum(tf.cast(tf.equal(batch_sizes, 0),
                                          tf.int32))

      def client_metrics():
        unfinalized = client_model.report_local_unfinalized_metrics()
        finalized = collections.OrderedDict(
            (name, finalizer(unfinalized[name]))
            for name, finalizer in finalizers.items())
        return collections.OrderedDict(finalized=finalized,
                                       unfinalized=unfinalized)

      # One TensorArray per metric tensor, written at each closing batch.
      specs = tf.nest.map_structure(tf.TensorSpec.from_tensor,
                                    client_metrics())
      arrays = tf.nest.map_structure(
          lambda spec: tf.TensorArray(spec.dtype, size=num_clients,
                                      element_shape=spec.shape), specs)

      def forward(i, client, arrays):
        batch = fused.batch_of(examples, rows, ends[i] - batch_sizes[i],
                               ends[i])
        output = client_model.forward_pass(batch, training=False)
        with tf.control_dependencies(tf.nest.flatten(output.loss)):
          return client + 0, arrays

      def close(i, client, arrays):
        del i
        values = client_metrics()
        arrays = tf.nest.map_structure(lambda array, value: array.write(
            client, value), arrays, values)
        with tf.control_dependencies(tf.nest.flatten(values)):
          resets = [v.assign(tf.zeros_like(v)) for v in metric_variables]
        with tf.control_dependencies(resets):
          return client + 1, arrays

      def body(i, client, arrays):
        return (i + 1,) + tuple(tf.cond(
            batch_sizes[i] > 0, lambda: forward(i, client, arrays),
            lambda: close(i, client, arrays)))

      _, _, arrays = tf.while_loop(
          lambda i, *_: i < tf.size(batch_sizes), body,
          (tf.constant(0), tf.constant(0), arrays))
      return tf.nest.map_structure(lambda array: array.stack(), arrays)

    inputs = (incoming_weights, *fused.shard_source(shard, resident_examples),
              shard['batch_sizes'])
    return fused.trace_inlined(evaluate_clients, *inputs)

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(shard_type, tff.CLIENTS))
  def fused_per_client_evaluation(model_weights, shards):
    return tff.federated_map(
        evaluate_shard, (tff.federated_broadcast(model_weights), shards))

  return fused_per_client_evaluation


def split_clients(per_shard: Sequence[Any]) -> list[Any]:
  """A fused evaluation's result (one structure per shard, each tensor with
  a leading client dimension) as one structure per client, in order."""
  clients = []
  for shard in per_shard:
    flat = [np.asarray(t) for t in tf.nest.flatten(shard)]
    for k in range(len(flat[0]) if flat else 0):
      clients.append(tf.nest.pack_sequence_as(shard, [t[k] for t in flat]))
  return clients


def sum_over_clients(
    per_client: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
  """Sums the clients' unfinalized metrics, tensor by tensor (TFF's
  `sum_then_finalize` before its finalization)."""
  if not per_client:
    raise ValueError('per_client must hold at least one client.')
  return tf.nest.map_structure(
      lambda *values: np.sum(np.stack(values), axis=0), *per_client)


def sum_over_shards(per_shard: Sequence[Mapping[str, Any]]
                    ) -> Mapping[str, Any]:
  """`sum_over_clients` of a fused evaluation's unfinalized metrics, one
  structure per shard with a leading client dimension, without splitting
  them into clients (a structure per client costs ~0.1 ms in Python)."""
  if not per_shard:
    raise ValueError('per_shard must hold at least one shard.')
  return tf.nest.map_structure(
      lambda *values: np.sum(np.concatenate(
          [np.asarray(v) for v in values]), axis=0), *per_shard)


class MetricsFinalizer:
  """Finalizes unfinalized metrics with the model's `metric_finalizers()`.

  The finalizers run in a TFF TensorFlow computation, as TFF's own
  aggregation runs them (Keras metric finalizers create variables, which
  only a graph allows).
  """

  def __init__(self, model_fn: ModelFn):
    with tf.Graph().as_default():
      model = _check_model(model_fn())
      self._metric_names = list(model.metric_finalizers())
      unfinalized_type = tff.types.tensorflow_to_type(tf.nest.map_structure(
          tf.TensorSpec.from_tensor,
          model.report_local_unfinalized_metrics()))

    @tff.tensorflow.computation(unfinalized_type)
    def finalize(unfinalized):
      finalizers = model_fn().metric_finalizers()
      return collections.OrderedDict(
          (name, finalizers[name](unfinalized[name]))
          for name in self._metric_names)

    self._finalize = finalize

  @property
  def metric_names(self) -> list[str]:
    return list(self._metric_names)

  def __call__(self, unfinalized: Mapping[str, Any]) -> dict[str, float]:
    """`{metric name: value}`, each metric finalized as a Python float."""
    finalized = self._finalize(unfinalized)
    return collections.OrderedDict(
        (name, float(np.asarray(finalized[name])))
        for name in self._metric_names)


def accuracy_percentiles(
    values: Sequence[float],
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[float, float]:
  """The `percentiles` of per-client `values` (numpy's linear interpolation).

  Args:
    values: Per-client accuracies (or any finite metric), at least one.
    percentiles: Percentiles in [0, 100]; the paper's 5/25/50/75/95 default.

  Returns:
    `{percentile: value}` in the order of `percentiles`.

  Raises:
    ValueError: If `values` is empty or not finite, or a percentile is outside
      [0, 100].
  """
  array = np.asarray(values, dtype=np.float64)
  if array.ndim != 1 or array.size == 0:
    raise ValueError(
        f'values must be a non-empty list of numbers, got {values!r}.')
  if not np.all(np.isfinite(array)):
    raise ValueError(f'values must be finite, got {values!r}.')
  for percentile in percentiles:
    if not 0 <= percentile <= 100:
      raise ValueError(f'percentiles must be in [0, 100], got {percentile}.')
  return {percentile: float(np.percentile(array, percentile))
          for percentile in percentiles}
