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
The unfinalized metrics summed over clients (`sum_over_clients`) and
finalized (`MetricsFinalizer`) are the cohort's example-weighted metrics:
TFF's `sum_then_finalize`, the aggregation of
`tff.learning.algorithms.build_fed_eval`. One pass over the clients thus gives
both the aggregate and the per-client values. `accuracy_percentiles`
summarizes the latter.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

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


def sum_over_clients(
    per_client: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
  """Sums the clients' unfinalized metrics, tensor by tensor (TFF's
  `sum_then_finalize` before its finalization)."""
  if not per_client:
    raise ValueError('per_client must hold at least one client.')
  return tf.nest.map_structure(
      lambda *values: np.sum(np.stack(values), axis=0), *per_client)


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
