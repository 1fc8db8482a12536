"""Rounds on shards of clients: one TFF client call trains many real clients.

With small models a round's arithmetic per client is microseconds, and the
runtime's per-client cost (a call of the client computation, its arguments
and results as separate values, the aggregator's `accumulate` per client)
is most of the round. A fused process is the same algorithm as its
per-client counterpart with the driver's aggregator (`fl_common.diagnosed_mean`:
the mean, adaptive clipping and the paper's diagnostics; or FedNova's
normalized averaging around it), in which a TFF client stands for a *shard*:
several real clients' batches, read in the driver into plain tensors
(`fl_engine.shards`: every batch's examples concatenated plus the batch
sizes, each client closed by an empty batch), or the rows of those
examples in arrays that the worker holds (`resident.ResidentExamples`,
`shard_source`), each batch gathered from them when its step runs, so the
worker never holds a shard's examples at once. No tf.data pipeline runs on
the worker. One call of the shard computation, one TensorFlow graph (an
outer `tf.while_loop` over the shard's clients, an inner one over a
client's batches; no AutoGraph, whose conversion of a Keras model takes
seconds of start-up), trains every client of the shard in turn:

* from the broadcast model, with the algorithm's fresh client state
  (`ClientProgram.start`), one local step per batch (`ClientProgram.step`);
* at its closing batch, its upload and weight (`ClientProgram.finish`), with
  TFF's screening: a non-finite model delta becomes zeros with weight 0, and
  that client's local metrics are dropped, as TFF's client work resets them;
  then its contribution to the aggregator's sums
  (`diagnosed_mean.client_contribution`, clipped to the broadcast norm `ρ`:
  the same function the per-client aggregator's `accumulate` runs);
* then the model is reset for the next client.

The shard returns its partial sums, its clients' summed unfinalized metrics
and the program's summed counters; the server sums the shards and finishes
exactly as the per-client aggregator does
(`diagnosed_mean.build_server_computation`, `finish_round`). State, metrics
and their structure are those of the per-client process, so checkpoints and
metric names carry over, and a round on shards equals a round on the same
clients one per TFF client, up to the order of float additions
(`tests/large_cohort/test_fedopt_on_shards.py`, `tests/gel_tff/test_gel_on_shards.py`).

Shards are ordinary TFF clients: the same process runs on the local worker
and across `--worker_addresses`, each worker taking whole shards.

Builders: every builder with `execution=fl_engine.execution.OnShards(...)`
(`large_cohort.build_fedopt`, `build_fedsgd`, `gel_tff.build_gel`,
`build_budgeted_baseline`; `adabest_tff.build_adabest`, `build_feddyn` and
`build_scaffold`, whose clients' states come in and go out stacked per
shard, `StatefulClientProgram`). `OnShards(lanes=K)` swaps
this module's shard loop for `fl_engine.lanes`' (`shard_computation_fn`):
the same round, a shard's clients trained K at a time, vectorized.

Why one module: the shard's loop, the aggregator's split into a per-client
and a server part, and the process around them must agree on one state and
one set of sums; apart, each would restate the others' structures.
"""

import collections
from collections.abc import Callable
import contextlib
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from fl_engine import resident

ModelFn = Callable[[], tff.learning.models.VariableModel]
DiagnosedMeanFactory = Union[diagnosed_mean.WeightedDiagnosedMeanFactory,
                             diagnosed_mean.UnweightedDiagnosedMeanFactory]


class ClientProgram(NamedTuple):
  """What one real client does in a shard; traced in the shard's graph.

  Attributes:
    start: `hparams -> state`: a client's fresh loop state (e.g. its
      optimizer state and counters), a structure of tensors.
    step: `(state, batch, hparams) -> state`: one local step; it updates the
      model's variables.
    finish: `(state, hparams) -> (upload, weight, non_finite, counters)`:
      after the last batch, from the model's variables (which it must not
      change: the shard resets them for the next client): the client's upload
      (screened: zeros if non-finite), its weight (0 if non-finite),
      `non_finite` (int32 > 0 drops its metrics) and counters summed over
      the shard (a structure of tensors, or `()`).
  """

  start: Callable[[Any], Any]
  step: Callable[[Any, Any, Any], Any]
  finish: Callable[[Any, Any], tuple[Any, tf.Tensor, tf.Tensor, Any]]


class StatefulClientProgram(NamedTuple):
  """A `ClientProgram` whose clients keep a state between rounds (AdaBest,
  FedDyn, SCAFFOLD: `fl_engine.fused_stateful`).

  Attributes:
    start: `(hparams, client_state, num_examples) -> state`: as
      `ClientProgram.start`, from the client's stored state and the number
      of examples in its batches (int64).
    step: As `ClientProgram.step`.
    finish: `(state, hparams) -> (upload, weight, non_finite, counters,
      new_client_state)`: as `ClientProgram.finish`, and the client's new
      state, stacked over the shard's clients in the shard's output.
  """

  start: Callable[[Any, Any, tf.Tensor], Any]
  step: Callable[[Any, Any, Any], Any]
  finish: Callable[[Any, Any], tuple[Any, tf.Tensor, tf.Tensor, Any, Any]]


ProgramFn = Callable[[tff.learning.models.VariableModel,
                      tff.learning.models.ModelWeights, Any],
                     Union[ClientProgram, StatefulClientProgram]]


def screened_model_delta(initial_weights: tff.learning.models.ModelWeights,
                         model_weights: tff.learning.models.ModelWeights):
  """`(x^(t,0) − x, non_finite)` in TFF's sign, zeros if any entry is NaN or
  Inf (TFF's `tensor_utils.zero_all_if_any_non_finite`, as its client work)."""
  delta = tf.nest.map_structure(tf.subtract, initial_weights.trainable,
                                model_weights.trainable)
  return tff.learning.tensor_utils.zero_all_if_any_non_finite(delta)


def count_examples(output: tff.learning.models.BatchOutput) -> tf.Tensor:
  """The examples of a forward pass, as TFF's client work counts them."""
  if output.num_examples is None:
    return tf.shape(output.predictions, out_type=tf.int64)[0]
  return tf.cast(output.num_examples, tf.int64)


@contextlib.contextmanager
def inlined_tf_functions():
  """While tracing a `tf.function`'s body: every `tf.function` called in it
  (the model's `forward_pass`, its `predict_on_batch`, Keras metrics'
  updates) is traced as its Python body, in place, rather than as a call.

  Why: a small model's step costs mostly the TensorFlow executor's work per
  op, and a call of a `tf.function` inside a loop body brings its own ops
  (the call, its argument and result plumbing) at every step; traced in
  place, the model's ops join the body's (a shard of 100 Synthetic clients
  runs ~1/3 fewer ops per step).

  How: TensorFlow's public switch `tf.config.run_functions_eagerly`, which
  makes a `tf.function` call its Python function; set only while the body is
  traced (inside the outer `tf.function`, whose graph keeps its automatic
  control dependencies). Those inner functions are then traced without
  AutoGraph: a model whose Python branches on tensors (AutoGraph's job)
  raises `tf.errors.OperatorNotAllowedInGraphError`, and `trace_inlined`
  retraces it without inlining. What a call would hide from the caller
  (Keras' logits behind a softmax) stays hidden: the models are built by
  `with_called_predictions`.
  """
  previous = tf.config.functions_run_eagerly()
  tf.config.run_functions_eagerly(True)
  try:
    yield
  finally:
    tf.config.run_functions_eagerly(previous)


def with_called_predictions(model_fn: ModelFn) -> ModelFn:
  """`model_fn` whose models' `predict_on_batch` outputs pass through
  `tf.identity`, the boundary that calling it as a `tf.function` puts
  between the predictions and the loss.

  Why: TFF's Keras model computes its loss on the output of
  `predict_on_batch`, a call in the per-client process. Keras computes a
  loss on probabilities from the logits instead whenever it can see them:
  a tensor that carries Keras' `_keras_logits`, or the output of a
  `Softmax` or `Sigmoid` op; neither crosses a call, but both would cross
  a `predict_on_batch` inlined by `inlined_tf_functions`. Then a saturated
  prediction's loss and gradient would come from its logits (unbounded)
  instead of from Keras' probabilities clipped at its epsilon (at most
  -log(1e-7) = 16.1 an example, no gradient), and a fused round would not
  be the per-client round. Every shard computation and the fused
  evaluation build their models through this.
  """

  def boundary(value: Any) -> Any:
    return tf.identity(value) if tf.is_tensor(value) else value

  def make_model() -> tff.learning.models.VariableModel:
    model = model_fn()
    predict = model.predict_on_batch

    def predict_on_batch(*args, **kwargs):
      return tf.nest.map_structure(boundary, predict(*args, **kwargs))

    model.predict_on_batch = predict_on_batch
    return model

  return make_model


def trace_inlined(body_fn: Callable[..., Any], *inputs: Any,
                  inline: bool = True) -> Any:
  """`body_fn(*inputs)`, traced as a `tf.function` without AutoGraph (a
  shard's `tf.while_loop`s) whose inner `tf.function`s are inlined
  (`inlined_tf_functions`), or called if the model needs AutoGraph or
  `inline` is False. A failed trace adds nothing to the enclosing graph."""

  def call(inline: bool) -> Any:
    def body(*args):
      with (inlined_tf_functions() if inline else contextlib.nullcontext()):
        return body_fn(*args)
    return tf.function(body, autograph=False)(*inputs)

  if not inline:
    return call(False)
  try:
    return call(True)
  except tf.errors.OperatorNotAllowedInGraphError:
    return call(False)


def runs_own_loops(model_fn: ModelFn) -> bool:
  """Whether the model's forward pass runs loops of its own (a `While` op,
  e.g. a Keras RNN's), traced once on one example in a throwaway graph.

  Why: a shard inlines the model's functions into its loops
  (`inlined_tf_functions`), which cuts a small model's per-op cost and
  sped the EMNIST CNN's round up too, but slowed the Stack Overflow LSTM's
  (its round 1.30x the limit inlined, 1.17x called, in one bench run at 10
  clients); a shard calls the forward pass of a model that loops."""
  with tf.Graph().as_default() as graph:
    model = model_fn()
    model.forward_pass(tf.nest.map_structure(
        lambda spec: tf.zeros([1, *[d or 1 for d in spec.shape[1:]]],
                              spec.dtype), model.input_spec), training=True)
    graph_def = graph.as_graph_def()
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  return any(node.op in ('While', 'StatelessWhile') for node in nodes)


def can_fuse(factory: Any) -> bool:
  """Whether `FusedAggregation` computes `factory`'s aggregation: a
  diagnosed mean, possibly wrapped by server-side steps."""
  while getattr(factory, 'server_side', None) is not None:
    factory = factory.server_side[0]
  return isinstance(factory, (diagnosed_mean.WeightedDiagnosedMeanFactory,
                              diagnosed_mean.UnweightedDiagnosedMeanFactory))


class FusedAggregation:
  """An aggregator split into its per-client part (run in the shards) and
  its server part: `diagnosed_mean` or FedNova's normalized averaging
  around it (`fl_common.fednova`), with the per-client process's state and
  measurements.

  Args:
    factory: A `diagnosed_mean.diagnosed_mean_factory` (weighted, or
      unweighted when `weighted=False`), possibly wrapped by server-side
      steps (`aggregator_wrappers.wrap_server_side`, e.g.
      `fl_common.normalized_update.normalized_update_factory`).
    value_type: The model delta's TFF type.
    weighted: Whether clients' weights weight the mean.
    fednova: Whether uploads are `FedNovaClientUpdate`s averaged as
      `fl_common.fednova.FedNovaAggregationFactory(factory)` does.
  """

  def __init__(self, factory: DiagnosedMeanFactory, value_type: tff.Type, *,
               weighted: bool, fednova: bool = False):
    # Steps on the aggregate at the server (`aggregator_wrappers.
    # wrap_server_side`, e.g. normalization) are applied after the mean.
    self._server_fns = []
    while getattr(factory, 'server_side', None) is not None:
      factory, build_server_fn = factory.server_side
      self._server_fns.insert(0, build_server_fn(value_type))
    expected = (diagnosed_mean.WeightedDiagnosedMeanFactory if weighted else
                diagnosed_mean.UnweightedDiagnosedMeanFactory)
    if not isinstance(factory, expected):
      raise TypeError(
          f'fused shards need a {expected.__name__} (diagnosed_mean_factory('
          f'weighted={weighted})), possibly wrapped by server-side steps'
          f' (aggregator_wrappers.wrap_server_side), got {factory!r}.')
    self.weighted = weighted
    self.fednova = fednova
    settings = factory.settings
    self.clipping = settings['clipping']
    weight_type = tff.TensorType(np.float32)
    inner = (factory.create(value_type, weight_type) if weighted else
             factory.create(value_type))
    self._inner = inner
    self._settings = settings
    if fednova:
      self._normalizer = tff.aggregators.MeanFactory().create(weight_type,
                                                              weight_type)

  def initialize(self):
    """The per-client aggregator's initial state (federated, at the server)."""
    if not self.fednova:
      return self._inner.initialize()
    return tff.federated_zip(collections.OrderedDict(
        normalized_update=self._inner.initialize(),
        effective_steps=self._normalizer.initialize()))

  def _inner_state(self, state):
    return state['normalized_update'] if self.fednova else state

  def broadcast(self, state):
    """What the shards need of the state (the clipping norm), or None."""
    if not self.clipping:
      return None
    return tff.federated_broadcast(self._inner_state(state))

  def contribution(self, upload, weight: tf.Tensor,
                   clipping_norm: Optional[tf.Tensor]):
    """One client's summands (traced in the shard's graph)."""
    if self.fednova:
      delta = tf.nest.map_structure(
          lambda d: tf.math.divide_no_nan(d, upload.normalizer),
          upload.model_delta)
    else:
      delta = upload
    sums = diagnosed_mean.client_contribution(
        delta, weight if self.weighted else None, clipping_norm)
    if self.fednova:  # MeanFactory's sums of w·‖a‖₁ and w.
      sums = (sums, weight * upload.normalizer, weight)
    return sums

  def finish(self, state, summed) -> tff.templates.MeasuredProcessOutput:
    """The aggregator's output from the cohort's sums (federated)."""
    sums_type = summed.type_signature.member
    inner_state = self._inner_state(state)
    inner_sums = summed
    if self.fednova:
      inner_sums = tff.federated_map(
          tff.tensorflow.computation(lambda sums: sums[0], sums_type), summed)
    server = diagnosed_mean.build_server_computation(
        inner_sums.type_signature.member, self.weighted, self.clipping,
        self._settings['target_quantile'],
        self._settings['clipping_learning_rate'])
    outputs = tff.federated_map(
        server, tff.federated_zip((inner_sums, inner_state)) if self.clipping
        else inner_sums)
    inner = diagnosed_mean.finish_round(inner_state, outputs,
                                        weighted=self.weighted,
                                        clipping=self.clipping)
    for server_fn in self._server_fns:  # (FedNova's inner factory's.)
      inner = server_fn(inner)
    if not self.fednova:
      return inner

    # FedNova: Δ = τ_eff · mean(Δ_i / ‖a_i‖₁), τ_eff = Σ w_i ‖a_i‖₁ / Σ w_i.
    @tff.tensorflow.computation(inner.result.type_signature.member, sums_type)
    def scale(mean_normalized_delta, sums):
      effective_steps = tf.math.divide_no_nan(sums[1], sums[2])
      delta = tf.nest.map_structure(lambda d: d * effective_steps,
                                    mean_normalized_delta)
      return delta, effective_steps, tf.linalg.global_norm(
          tf.nest.flatten(delta))

    delta, effective_steps, update_norm = tff.federated_map(
        scale, (inner.result, summed))
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(collections.OrderedDict(
            normalized_update=inner.state,
            effective_steps=state['effective_steps'])),
        result=delta,
        measurements=tff.federated_zip(collections.OrderedDict(
            normalized_update=inner.measurements,
            effective_steps=effective_steps,
            update_norm=update_norm)))


def stacked_type(type_spec: tff.Type) -> tff.Type:
  """`type_spec` with a leading `None` dimension on every tensor: the values
  of a shard's clients stacked."""
  return tff.types.tensorflow_to_type(tf.nest.map_structure(
      lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype),
      tff.types.type_to_tf_tensor_specs(type_spec)))


def as_stateful(program: Union[ClientProgram, StatefulClientProgram],
                stateful: bool) -> StatefulClientProgram:
  """`program` as a `StatefulClientProgram`: itself if `stateful`, else a
  `ClientProgram` taking and giving no client state (`()`)."""
  if stateful:
    return program
  return StatefulClientProgram(
      start=lambda hparams, client_state, num_examples: program.start(
          hparams),
      step=program.step,
      finish=lambda state, hparams: (*program.finish(state, hparams), ()))


def shard_computation(model_fn: ModelFn, program_fn: ProgramFn,
                      aggregation: FusedAggregation, weights_type: tff.Type,
                      hparams_type: tff.Type, data_type: tff.Type,
                      client_state_type: Optional[tff.Type] = None,
                      resident_examples: Optional[
                          resident.ResidentExamples] = None
                      ) -> tff.Computation:
  """`<weights, hparams[, clipping_norm], shard[, client_states]> -> <sums,
  unfinalized metrics, counters[, new client states]>`: the shard's clients
  trained in turn by `program_fn`'s program, a `StatefulClientProgram` when
  `client_state_type` (one client's state) is given, whose states come in
  and go out stacked (`stacked_type`) in the shard's client order. With
  `resident_examples`, shards are rows of them (`shard_source`)."""
  clipping = aggregation.clipping
  stateful = client_state_type is not None
  arg_types = [('weights', weights_type), ('hparams', hparams_type)]
  if clipping:
    arg_types.append(('clipping_norm', tff.TensorType(np.float32)))
  arg_types.append(('shard', data_type))
  if stateful:
    arg_types.append(('client_states', stacked_type(client_state_type)))

  model_fn = with_called_predictions(model_fn)
  inline = not runs_own_loops(model_fn)

  @tff.tensorflow.computation(
      tff.StructWithPythonType(arg_types, collections.OrderedDict))
  def shard_work(args):
    clipping_norm = args['clipping_norm'] if clipping else None
    model = model_fn()
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    metric_variables = list(model.local_variables)

    # tf.while_loop, not AutoGraph (module docstring); the model's
    # functions inlined in the loops (`trace_inlined`) unless it runs loops
    # of its own (`runs_own_loops`).
    def train_clients(initial_weights, hparams, examples, rows, batch_sizes,
                      client_states):
      program = as_stateful(program_fn(model, model_weights,
                                       initial_weights), stateful)

      def assign(variables, values):
        return [v.assign(t) for v, t in zip(tf.nest.flatten(variables),
                                            tf.nest.flatten(values))]

      def read_metrics():
        return [v.read_value() for v in metric_variables]

      def client_state(c):
        return tf.nest.map_structure(lambda t: t[c], client_states)

      ends = tf.cumsum(batch_sizes)
      # The closing batches: a client's batches run up to its marker.
      markers = tf.cast(tf.reshape(tf.where(tf.equal(batch_sizes, 0)), [-1]),
                        tf.int32)
      num_clients = tf.size(markers)
      with tf.control_dependencies(assign(model_weights, initial_weights)):
        first_state = program.start(hparams, client_state(0),
                                    tf.zeros([], tf.int64))
      # The zeros of the sums and counters, shaped as a traced finish's.
      upload, weight, _, counters, _ = program.finish(first_state, hparams)
      totals = tf.nest.map_structure(
          lambda t: tf.zeros(t.shape, t.dtype),
          (aggregation.contribution(upload, weight, clipping_norm), counters))
      new_states = tf.nest.map_structure(
          lambda t: tf.TensorArray(t.dtype, size=num_clients,
                                   element_shape=t.shape[1:]),
          client_states)

      def client_body(c, totals, snapshot, new_states):

        def step(i, state):
          batch = batch_of(examples, rows, ends[i] - batch_sizes[i], ends[i])
          return i + 1, program.step(state, batch, hparams)

        first = tf.where(c > 0, markers[tf.maximum(c - 1, 0)] + 1, 0)
        num_examples = tf.reduce_sum(batch_sizes[first:markers[c]])
        _, state = tf.while_loop(
            lambda i, _: i < markers[c], step,
            (first, program.start(hparams, client_state(c), num_examples)))
        upload, weight, non_finite, counters, new_state = program.finish(
            state, hparams)
        totals = tf.nest.map_structure(tf.add, totals, (
            aggregation.contribution(upload, weight, clipping_norm),
            counters))
        new_states = tf.nest.map_structure(
            lambda array, value: array.write(c, value), new_states,
            tf.nest.pack_sequence_as(client_states,
                                     tf.nest.flatten(new_state)))

        def restore_metrics():  # As TFF resets a non-finite client's.
          with tf.control_dependencies(assign(metric_variables, snapshot)):
            return tf.constant(0)

        with tf.control_dependencies([tf.cond(
            non_finite > 0, restore_metrics, lambda: tf.constant(0))]):
          with tf.control_dependencies(assign(model_weights,
                                              initial_weights)):
            return (c + 1, tf.nest.map_structure(tf.identity, totals),
                    read_metrics(), new_states)

      _, (sums, counters), _, new_states = tf.while_loop(
          lambda c, *_: c < num_clients, client_body,
          (tf.constant(0), totals, read_metrics(), new_states))
      outputs = (sums, model.report_local_unfinalized_metrics(), counters)
      if stateful:
        outputs += (tf.nest.map_structure(lambda array: array.stack(),
                                          new_states),)
      return outputs

    inputs = (args['weights'], args['hparams'],
              *shard_source(args['shard'], resident_examples),
              args['shard']['batch_sizes'],
              args['client_states'] if stateful else ())
    return trace_inlined(train_clients, *inputs, inline=inline)

  return shard_work


def batched_spec(input_spec):
  """The model's input spec as batches: a leading `None` dimension."""
  return tf.nest.map_structure(
      lambda spec: tf.TensorSpec([None, *spec.shape[1:]], spec.dtype),
      input_spec)


def shard_type(model_fn: ModelFn,
               resident_examples: Optional[Any] = None) -> tff.Type:
  """The TFF type of a shard of `model_fn`'s data (`fl_engine.shards`):
  `<examples, batch_sizes>`, or with `resident_examples` (checked against
  the model's input spec, `check_resident_examples`) `<rows, batch_sizes>`.
  """
  spec = batched_spec(model_fn().input_spec)
  if resident_examples is not None:
    check_resident_examples(resident_examples, spec)
    first = ('rows', tff.TensorType(np.int64, [None]))
  else:
    first = ('examples', tff.types.tensorflow_to_type(spec))
  return tff.StructWithPythonType(
      [first, ('batch_sizes', tff.TensorType(np.int64, [None]))],
      collections.OrderedDict)


def as_resident(resident_examples: Any) -> Optional[resident.ResidentExamples]:
  """A builder's `resident_examples`: `resident.ResidentExamples`, a structure
  of NumPy arrays to hold (written to files now), or None."""
  if resident_examples is None or isinstance(resident_examples,
                                             resident.ResidentExamples):
    return resident_examples
  return resident.ResidentExamples(resident_examples)


def check_resident_examples(resident_examples: resident.ResidentExamples,
                            spec: Any) -> None:
  """Raises `ValueError` unless `resident_examples` has the structure,
  dtypes and example shapes of the batched `spec`."""
  try:
    tf.nest.assert_same_structure(resident_examples.spec, spec)
  except (ValueError, TypeError) as e:
    raise ValueError(f'resident examples are not shaped as the model\'s '
                     f'input {spec}: {e}') from e
  for held, s in zip(tf.nest.flatten(resident_examples.spec),
                     tf.nest.flatten(spec)):
    if (held.dtype != s.dtype or
        not s.shape[1:].is_compatible_with(held.shape[1:])):
      raise ValueError(f'resident examples of dtype {held.dtype.name} and '
                       f'shape {held.shape} do not match the input {s}.')


def shard_source(shard: Any,
                 resident_examples: Optional[resident.ResidentExamples]
                 ) -> tuple[Any, Optional[tf.Tensor]]:
  """In a shard computation's graph: `(examples, rows)` for `batch_of`: the
  shard's examples as sent (`shard.examples`) and None, or, with
  `resident_examples`, the arrays that the worker memory-maps
  (`resident.ResidentExamples`, which says why) and the shard's `rows` of
  them."""
  if resident_examples is None:
    return shard['examples'], None
  return resident_examples.mapped(), shard['rows']


def batch_of(examples: Any, rows: Optional[tf.Tensor], start: tf.Tensor,
             end: tf.Tensor) -> Any:
  """The batch of a shard's examples `[start, end)` (`shard_source`):
  sliced from the examples sent, or gathered by its rows from the held
  arrays, so that only the batch is copied."""
  if rows is None:
    return tf.nest.map_structure(lambda t: t[start:end], examples)
  return tf.nest.map_structure(lambda t: tf.gather(t, rows[start:end]),
                               examples)


def train_measurements(train: Any, counters: Any) -> collections.OrderedDict:
  """A client work's measurements when its clients count nothing else:
  `train=` the training metrics."""
  del counters
  return collections.OrderedDict(train=train)


def sum_counters(counters: Any, counters_type: tff.Type) -> Any:
  """The clients' counters summed at the server (`()` there if they have
  none: `federated_sum` takes no empty structure)."""
  if tf.nest.flatten(tff.types.type_to_tf_tensor_specs(counters_type)):
    return tff.federated_sum(counters)
  return tff.federated_value((), tff.SERVER)


def build_fused_process(
    model_fn: ModelFn,
    *,
    initial_hparams_fn: tff.Computation,
    program_fn: ProgramFn,
    aggregation: FusedAggregation,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_measurements_fn: Callable[[Any, Any], collections.OrderedDict],
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    shard_model_fn: Optional[ModelFn] = None,
    resident_examples: Optional[Any] = None,
    shard_computation_fn: Optional[Callable[..., tff.Computation]] = None,
) -> tff.learning.templates.LearningProcess:
  """A `LearningProcess` on shards, state-compatible with
  `compose_learning_process(initial weights, build_broadcast_process,
  <client work whose state is the client hparams>, <aggregator>,
  build_apply_optimizer_finalizer(server_optimizer))`:

      next: (<state@SERVER, {shard}@CLIENTS> -> LearningProcessOutput(
             state@SERVER, metrics@SERVER))

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    initial_hparams_fn: A no-arg TFF computation: the client work's state.
    program_fn: `(model, model_weights, initial_weights) -> ClientProgram`.
    aggregation: The aggregator's per-client and server parts.
    server_optimizer: The finalizer's optimizer.
    client_measurements_fn: `(train metrics, summed counters)` at the server
      -> the client work's measurements (an `OrderedDict`).
    metrics_aggregator: Aggregates the training metrics;
      `tff.learning.metrics.sum_then_finalize` when `None`.
    shard_model_fn: The model the shards train, whose trainable weights
      are overwritten with the broadcast ones (e.g.
      `large_cohort.fedopt.client_model_fn(model_fn)`, which skips their
      initializers); `model_fn` when `None`.
    resident_examples: The population's examples held on the worker
      (`fl_engine.resident.ResidentExamples`, or NumPy arrays shaped as the
      model's input, one row per example, to hold); shards are then rows
      of them (`shard_type`, `shard_source`,
      `fl_engine.shards.shards_from_arrays(..., rows_only=True)`).
    shard_computation_fn: Builds the shard computation from
      `shard_computation`'s arguments (`fl_engine.lanes.
      shard_computation_fn(lanes)`: a shard's clients trained side by side);
      `shard_computation` when `None`.
  """
  metrics_aggregator = (metrics_aggregator or
                        tff.learning.metrics.sum_then_finalize)

  # The per-client process's state, from the same parts, without tracing its
  # client work (seconds of AutoGraph conversion): what it would start from,
  # so that states and checkpoints carry over.
  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)

  @tff.federated_computation()
  def initialize_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(),
        tff.federated_eval(initial_hparams_fn, tff.SERVER),
        aggregation.initialize(), finalizer.initialize()))

  state_type = initialize_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, model_weights):
    return tff.learning.templates.LearningAlgorithmState(
        model_weights, state.distributor, state.client_work, state.aggregator,
        state.finalizer)

  resident_examples = as_resident(resident_examples)
  data_type = shard_type(model_fn, resident_examples)
  shard_work = (shard_computation_fn or shard_computation)(
      shard_model_fn or model_fn, program_fn, aggregation, weights_type,
      state_type.client_work, data_type, resident_examples=resident_examples)
  metrics_type = shard_work.type_signature.result[1]
  counters_type = shard_work.type_signature.result[2]
  aggregate_metrics = metrics_aggregator(model_fn().metric_finalizers(),
                                         metrics_type)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, shards):
    distributor_output = distributor.next(state.distributor,
                                          state.global_model_weights)
    args = collections.OrderedDict(
        weights=distributor_output.result,
        hparams=tff.federated_broadcast(state.client_work))
    clipping_norm = aggregation.broadcast(state.aggregator)
    if clipping_norm is not None:
      args['clipping_norm'] = clipping_norm
    args['shard'] = shards
    sums, unfinalized_metrics, counters = tff.federated_map(
        shard_work, tff.federated_zip(args))
    aggregator_output = aggregation.finish(state.aggregator,
                                           tff.federated_sum(sums))
    summed_counters = sum_counters(counters, counters_type)
    client_work_measurements = tff.federated_zip(client_measurements_fn(
        aggregate_metrics(unfinalized_metrics), summed_counters))
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
