"""FedOpt with fused cohorts: one TFF client trains a shard of real clients.

With small models a round's arithmetic per client is microseconds, and the
runtime's per-client cost (a call of the client computation, its arguments
and results as separate values, the aggregator's `accumulate` per client)
is most of the round. `build_fused_fedopt` builds the same algorithm as
`build_fedopt` with the driver's aggregator (`fl_common.diagnosed_mean`:
the mean, adaptive clipping and the paper's diagnostics), in which a TFF
client stands for a *shard*: several real clients' batches, read in the
driver (`shards_from_client_data`, `shards_from_datasets`) into plain
tensors, every batch's examples concatenated plus the batch sizes, each
client closed by an empty batch. No tf.data pipeline runs on the worker.
One call of the shard computation, one TensorFlow graph, trains every
client of the shard in turn:

* from the broadcast model, with a fresh client optimizer state, over the
  client's batches (TFF's `DATASET_ITERATOR` loop, as `build_fedopt`);
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
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from large_cohort import fedopt

ModelFn = Callable[[], tff.learning.models.VariableModel]
DiagnosedMeanFactory = Union[diagnosed_mean.WeightedDiagnosedMeanFactory,
                             diagnosed_mean.UnweightedDiagnosedMeanFactory]


def closing_batch(element_spec) -> tuple[tf.Tensor, ...]:
  """The empty batch that closes a client in a shard: every tensor of the
  batched `element_spec` with 0 rows."""

  def empty(spec: tf.TensorSpec) -> tf.Tensor:
    if spec.shape.rank is None or not spec.shape[1:].is_fully_defined():
      raise ValueError(
          'fused shards need batches whose shape is known but for the batch'
          f' dimension, got {spec}.')
    return tf.zeros([0, *spec.shape[1:]], spec.dtype)

  return tf.nest.map_structure(empty, element_spec)


def auto_clients_per_shard(num_clients: int,
                           num_cores: Optional[int] = None) -> int:
  """Clients per shard for one shard per core: a worker runs as many client
  calls at once as it has cores (`num_cores` in all, over every worker;
  default this machine's)."""
  cores = num_cores or os.cpu_count() or 1
  return max(1, -(-num_clients // cores))


def _groups(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
  if size < 1:
    raise ValueError(f'clients_per_shard must be >= 1, got {size}.')
  if not items:
    raise ValueError('a round needs at least one client.')
  return [items[i:i + size] for i in range(0, len(items), size)]


def stack_shard(shard: tf.data.Dataset) -> collections.OrderedDict:
  """Reads a shard's batches (each client's closed by an empty batch) into
  the tensors the fused process takes: `OrderedDict(examples=<every batch's
  examples concatenated, per component>, batch_sizes=int64 [batches])`."""
  # ragged_batch reads many batches per call, in C++; its row lengths are
  # the batch sizes, 0 for a closing batch.
  chunks = list(shard.ragged_batch(_BATCHES_PER_READ))
  if not chunks:
    raise ValueError('a shard holds at least its closing batches.')
  batch_sizes = np.concatenate(
      [tf.nest.flatten(c)[0].row_lengths().numpy() for c in chunks])
  examples = tf.nest.map_structure(
      lambda *parts: np.concatenate([p.values.numpy() for p in parts]),
      *chunks)
  return collections.OrderedDict(examples=examples,
                                 batch_sizes=batch_sizes.astype(np.int64))


_BATCHES_PER_READ = 4096


@dataclasses.dataclass(frozen=True)
class BatchRecipe:
  """A client pipeline that is only shuffle, repeat, take and batch, in
  TFF's tasks' order (`tasks.synthetic`): what `shards_from_arrays` does in
  NumPy.

  Attributes:
    batch_size: Examples per batch (the last one of a client may be short).
    num_epochs: Passes over the client's examples, each in a new order.
    shuffle: Whether each pass is a uniform random permutation (a shuffle
      buffer at least the client's size); else the stored order.
    max_elements: Examples taken after the passes (None: all).
  """

  batch_size: int
  num_epochs: int = 1
  shuffle: bool = True
  max_elements: Optional[int] = None


def shards_from_arrays(
    examples: Mapping[str, np.ndarray],
    client_rows: Sequence[np.ndarray],
    recipe: BatchRecipe,
    clients_per_shard: int,
    rng: np.random.Generator,
) -> list[collections.OrderedDict]:
  """The fused process's client data for clients stored as rows of shared
  arrays (client `k` owns rows `client_rows[k]` of every array), batched by
  `recipe` in NumPy: microseconds per client, where a tf.data pipeline
  takes about a millisecond (it is built, then read batch by batch).

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no clients.
  """
  shards = []
  for group in _groups(list(client_rows), clients_per_shard):
    indices, batch_sizes = [], []
    for rows in group:
      rows = np.asarray(rows)
      passes = [rng.permutation(rows) if recipe.shuffle else rows
                for _ in range(recipe.num_epochs)]
      order = np.concatenate(passes) if passes else rows[:0]
      if recipe.max_elements is not None:
        order = order[:recipe.max_elements]
      full, rest = divmod(len(order), recipe.batch_size)
      batch_sizes += [recipe.batch_size] * full + ([rest] if rest else [])
      batch_sizes.append(0)
      indices.append(order)
    flat = np.concatenate(indices).astype(np.int64)
    shards.append(collections.OrderedDict(
        examples=collections.OrderedDict(
            (name, array[flat]) for name, array in examples.items()),
        batch_sizes=np.asarray(batch_sizes, np.int64)))
  return shards


def shards_from_datasets(datasets: Sequence[tf.data.Dataset],
                         clients_per_shard: int
                         ) -> list[collections.OrderedDict]:
  """The fused process's client data from batched client datasets, in
  order: shards of `clients_per_shard` clients (the last may be shorter).

  Each shard is read through one tf.data pipeline over the clients'
  datasets (`tf.data.experimental.to_variant`), not a chain of
  concatenations, whose reads grow with the shard's length.

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no datasets.
  """
  groups = _groups(list(datasets), clients_per_shard)
  spec = datasets[0].element_spec
  closing = tf.data.Dataset.from_tensors(closing_batch(spec))
  shards = []
  for group in groups:
    variants = tf.stack([tf.data.experimental.to_variant(d) for d in group])
    shard = tf.data.Dataset.from_tensor_slices(variants).flat_map(
        lambda v: tf.data.experimental.from_variant(v, spec).concatenate(
            closing))
    shards.append(stack_shard(shard))
  return shards


def shards_from_client_data(
    client_data: tff.simulation.datasets.ClientData,
    preprocess_fn: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]],
    client_ids: Sequence[str],
    clients_per_shard: int,
) -> list[collections.OrderedDict]:
  """The fused process's client data for `client_ids` of `client_data`.

  One pipeline per shard maps the client ids through the ClientData's
  `serializable_dataset_fn` and `preprocess_fn` (traced once, not once per
  client as `create_tf_dataset_for_client` is). The pipeline's ops are those
  of the per-client datasets, with one difference: an unseeded shuffle in
  `preprocess_fn` is traced once per shard, so the shard's clients of equal
  size get the same permutation of their own examples (a seeded pipeline,
  e.g. `tasks.partitioned_task`'s, is unaffected).

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no clients.
  """
  dataset_fn = client_data.serializable_dataset_fn
  preprocess_fn = preprocess_fn or (lambda d: d)
  spec = preprocess_fn(dataset_fn(client_ids[0])).element_spec
  closing = tf.data.Dataset.from_tensors(closing_batch(spec))
  shards = []
  for group in _groups(list(client_ids), clients_per_shard):
    shard = tf.data.Dataset.from_tensor_slices(list(group)).flat_map(
        lambda i: preprocess_fn(dataset_fn(i)).concatenate(closing))
    shards.append(stack_shard(shard))
  return shards


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

      def body(i, optimizer_state, num_examples, sums, snapshot):
        args = (i, optimizer_state, num_examples, sums, snapshot)
        return (i + 1,) + tuple(tf.cond(
            batch_sizes[i] > 0, lambda: train_on_batch(*args),
            lambda: close_client(*args)))

      _, _, _, sums, _ = tf.while_loop(
          lambda i, *_: i < tf.size(batch_sizes), body,
          (tf.constant(0), fresh_optimizer_state(), tf.zeros([], tf.int64),
           sums, read_metrics()))
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
  shards (`shards_from_client_data`, `shards_from_datasets`), not single
  clients:

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
