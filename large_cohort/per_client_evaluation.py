"""Per-client accuracy and its percentiles (Charles et al. 2021, §3.4, B.4).

The paper's fairness measurement: evaluate the trained model on every test
client separately and report the 5th, 25th, 50th, 75th and 95th percentiles
of the per-client accuracies (Figure 6, Tables 6-9).

`build_per_client_evaluation(model_fn)` returns a federated computation
`(model_weights@SERVER, {dataset}@CLIENTS) -> {float32}@CLIENTS`: the server
broadcasts the weights, each client evaluates them on its own data
(`forward_pass(training=False)` over every batch) and finalizes the chosen
metric locally. Called from Python with a list of datasets, it returns the list
of per-client values in the same order. `accuracy_percentiles` summarizes
them.
"""

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

DEFAULT_PERCENTILES = (5, 25, 50, 75, 95)


def build_per_client_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    metric_name: str = 'sparse_categorical_accuracy',
) -> tff.Computation:
  """Builds the per-client evaluation of metric `metric_name`.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel` (e.g. a `BaselineTask.model_fn`).
    metric_name: The model metric to report per client, as named by
      `model.metric_finalizers()`: 'sparse_categorical_accuracy' for the
      EMNIST and CIFAR-100 tasks, 'accuracy' for Shakespeare,
      'accuracy_without_out_of_vocab_or_end_of_sentence' for Stack Overflow.

  Returns:
    A `tff.Computation` of type
    `(<M@SERVER, {B*}@CLIENTS> -> {float32}@CLIENTS)`, with `M` the model
    weights type (`tff.learning.models.ModelWeights`) and `B` the batch type.

  Raises:
    ValueError: If the model has no metric `metric_name`.
  """
  with tf.Graph().as_default():
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise ValueError(
          'model_fn must return a tff.learning.models.VariableModel, got '
          f'{type(model).__name__}.')
    weights_type = tff.learning.models.weights_type_from_model(model)
    batch_type = tff.types.tensorflow_to_type(model.input_spec)
    metric_names = list(model.metric_finalizers())
  if metric_name not in metric_names:
    raise ValueError(
        f'The model has no metric {metric_name!r}; its metrics are '
        f'{metric_names}.')

  @tff.tensorflow.computation(weights_type, tff.SequenceType(batch_type))
  @tf.function
  def evaluate_client(incoming_weights, dataset):
    with tf.init_scope():
      client_model = model_fn()
    tf.nest.map_structure(
        lambda variable, value: variable.assign(value),
        tff.learning.models.ModelWeights.from_model(client_model),
        incoming_weights)

    def evaluate_batch(num_batches, batch):
      client_model.forward_pass(batch, training=False)
      return num_batches + 1

    dataset.reduce(tf.constant(0, tf.int64), evaluate_batch)
    unfinalized = client_model.report_local_unfinalized_metrics()[metric_name]
    finalizer = client_model.metric_finalizers()[metric_name]
    return tf.cast(finalizer(unfinalized), tf.float32)

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(tff.SequenceType(batch_type), tff.CLIENTS))
  def per_client_evaluation(model_weights, datasets):
    return tff.federated_map(
        evaluate_client, (tff.federated_broadcast(model_weights), datasets))

  return per_client_evaluation


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
