"""Clients trained side by side: a shard's clients vectorized over lanes.

A fused shard (`fl_engine.fused`) trains its clients one after the other.
For a small model each local step is a few dozen tiny ops, and the
TensorFlow executor's cost per op, not arithmetic, sets the round's time.
Here a shard trains `lanes` of its clients at once: every tensor of a
client's step gains a leading lane dimension, so a step of `lanes` clients
costs about the ops of one step (a `MatMul` becomes one `BatchMatMulV2`).

How a lane computes exactly what the client computes alone: the
algorithm's own client program (`fused.ClientProgram` or
`StatefulClientProgram`: its `start`, `step` and `finish`, the same
functions the one-after-the-other shard runs) is traced once, for one
lane, on a model built by `model_fn` inside a `tf.variable_creator_scope`
that hands it, in place of its variables, the lane's weights,
non-trainable weights and metric values (`_LaneVariable`, below); then
`tf.vectorized_map` (TensorFlow's pfor, without its while-loop fallback,
which would be slower than no lanes) vectorizes it over the lanes. Every
per-client quantity is therefore per lane: the client optimizer's state
(Adam's step counter, LARS' norms), GeL's steps taken and guessed steps,
FedProx's proximal term, the stateful algorithms' client states, and the
aggregator's contribution (clipping, unit vectors, counts). Lanes do not
interact: the round equals the one-after-the-other round up to float order
(`tests/fl_engine/test_lanes.py`).

Clients differ in their number and sizes of batches. The shard's clients
are ordered by their number of batches (so lanes of a group finish
together), taken `lanes` at a time; at the group's step `s` each lane runs
its own batch `s`: lanes whose batches have the same size run together
(one vectorized step per distinct size, usually one), and a lane with no
such batch keeps its weights, program state and metrics (`tf.where` on the
lane). A lane's upload is screened by its program as TFF's client work
screens it (a non-finite delta: zeros, weight 0, its metrics dropped).

The model's metrics must add over clients (as TFF's `sum_then_finalize`
assumes): a shard's unfinalized metrics are the initial values plus every
finite client's change, written to the shard model's metric variables and
reported by its `report_local_unfinalized_metrics`.

Below TFF's and TensorFlow's public APIs, both here only: TFF's
`TensorVariable` (a duck-typed variable over a tensor, from
`tensorflow_frontend.variable_utils`, which TFF's
`functional_model_from_keras` uses the same way), and TensorFlow's
`tape.variable_accessed`, with which a lane's weights, read like a
variable, are watched by the program's own `tf.GradientTape` as a
`tf.Variable` would be; without it the program's gradients would be None.

Why one module: the lane step, the check that a model can take lanes
(which traces that same step) and the shard's loop around it share the
variable layout and the per-lane state; apart, each would restate them.
"""

import collections
import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import tape as tape_lib
from fl_common.tff_private import variable_utils

from fl_engine import fused
from fl_engine import resident

ModelFn = Callable[[], tff.learning.models.VariableModel]

# `auto_lanes`' lanes per group: of 10 to 250 lanes, 50-100 were the fastest
# for 1,000 Synthetic clients on 2 shards.
DEFAULT_LANES = 64
# `auto_lanes` trains models of at most this many weights on lanes: there a
# step's cost is the executor's per-op work, which lanes share.
MAX_AUTO_LANE_WEIGHTS = 10_000
# ... in shards of at least this many clients: GeL's Synthetic rounds were
# slower on lanes at 10 clients a shard, even at 25 and faster at 50.
MIN_AUTO_LANE_CLIENTS = 32


class _LaneVariable(variable_utils.TensorVariable):
  """A lane's variable: TFF's `TensorVariable` (its value a tensor, `assign`
  rebinding it) that a `tf.GradientTape` watches when it is read, as it
  watches a trainable `tf.Variable` (its `handle` is the value read, so the
  tape's `gradient` finds it)."""

  _should_act_as_resource_variable = True

  def __init__(self, initial_value, *, trainable: bool = True, **kwargs):
    super().__init__(initial_value, **kwargs)
    self._trainable = trainable

  @property
  def trainable(self) -> bool:
    return self._trainable

  @property
  def handle(self) -> tf.Tensor:
    return self._tensor

  def read_value(self):
    if self._trainable:
      tape_lib.variable_accessed(self)
    return self._tensor

  value = read_value


class _Layout(NamedTuple):
  """Where a model's variables fall in its creation order."""
  trainable: tuple[int, ...]
  non_trainable: tuple[int, ...]
  local: tuple[int, ...]


def _layout(model_fn: ModelFn) -> _Layout:
  """The creation indices of `model_fn()`'s trainable, non-trainable and
  local variables (built once in a throwaway graph)."""
  created = []

  def record(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    created.append(variable)
    return variable

  with tf.Graph().as_default():
    with tf.variable_creator_scope(record):
      model = model_fn()
    index = {v.ref(): i for i, v in enumerate(created)}

    def indices(variables):
      missing = [v.name for v in variables if v.ref() not in index]
      if missing:
        raise ValueError(f'lanes need every variable of the model created '
                         f'by model_fn; {missing} were not.')
      return tuple(index[v.ref()] for v in variables)

    return _Layout(indices(model.trainable_variables),
                   indices(model.non_trainable_variables),
                   indices(model.local_variables))


class _LaneValues(NamedTuple):
  """One lane's model values (stacked over lanes outside the lane)."""
  trainable: list
  non_trainable: list
  metrics: list


def _lane_model(model_fn: ModelFn, layout: _Layout, values: _LaneValues
                ) -> tff.learning.models.VariableModel:
  """`model_fn()` whose variables are `_LaneVariable`s over `values`."""
  by_index = {}
  for indices, tensors in zip(layout, values):
    by_index.update(zip(indices, tensors))
  made = []

  def inject(next_creator, **kwargs):
    del next_creator
    if len(made) in by_index:
      kwargs['initial_value'] = by_index[len(made)]
    initial_value = kwargs.pop('initial_value')
    made.append(_LaneVariable(
        initial_value, trainable=len(made) in set(layout.trainable),
        dtype=kwargs.get('dtype'), shape=kwargs.get('shape'),
        name=kwargs.get('name') or 'Variable'))
    return made[-1]

  with tf.variable_creator_scope(inject):
    return model_fn()


def _read(model: tff.learning.models.VariableModel) -> _LaneValues:
  def values(variables):
    return [v.read_value() for v in variables]
  return _LaneValues(values(model.trainable_variables),
                     values(model.non_trainable_variables),
                     values(model.local_variables))


def _where_lane(active: tf.Tensor, new: Any, old: Any) -> Any:
  """`new` on active lanes, `old` on the others (leading lane dimension)."""
  def select(n, o):
    mask = tf.reshape(active, [-1] + [1] * (n.shape.rank - 1))
    return tf.where(mask, n, o)
  return tf.nest.map_structure(select, new, old)


def _gather(examples: Any, rows: Optional[tf.Tensor],
            positions: tf.Tensor) -> Any:
  """The examples at `positions` of the shard (`fused.batch_of`'s, shaped as
  `positions` then the example): sent examples, or rows of held ones."""
  if rows is not None:
    positions = tf.gather(rows, positions)
  return tf.nest.map_structure(lambda t: tf.gather(t, positions), examples)


def _tile(value: Any, count: tf.Tensor) -> Any:
  return tf.nest.map_structure(
      lambda t: tf.tile(t[tf.newaxis], [count] + [1] * t.shape.rank), value)


def _vectorized(fn: Callable[[Any], Any], elems: Any) -> Any:
  """`fn` over the lanes of `elems`, without pfor's while-loop fallback.
  Its outputs pass `tf.identity`: pfor fails on an output that is a tensor
  of an enclosing graph (e.g. a hyperparameter a program returns as is)."""
  return tf.vectorized_map(
      lambda lane: tf.nest.map_structure(tf.identity, fn(lane)), elems,
      fallback_to_while_loop=False)


def check_vectorizable(model_fn: ModelFn) -> None:
  """Raises `ValueError` unless every op of the model's forward pass that a
  lane runs (its gradient and metric updates) has a vectorized form
  (`tf.vectorized_map` without its fallback, a loop over the lanes that
  would be slower than no lanes: e.g. a loss computed by `tf.nn.l2_loss`).
  Traced on two lanes of one example, in a throwaway graph. (A client
  program's own ops are checked when its lane shard computation is
  traced.)"""
  layout = _layout(model_fn)
  with tf.Graph().as_default():
    model = model_fn()

    def stacked(values):
      return [tf.zeros([2, *v.shape], v.dtype) for v in values]

    def example(spec):
      return tf.zeros([2, 1, *[d or 1 for d in spec.shape[1:]]], spec.dtype)

    def lane_gradient(lane):
      values, batch = lane
      lane_model = _lane_model(model_fn, layout, values)
      with tf.GradientTape() as tape:
        output = lane_model.forward_pass(batch, training=True)
      gradients = tape.gradient(
          output.loss, lane_model.trainable_variables,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
      # The ops a lane runs: the gradient and the metric updates (a loss
      # whose value only its gradient needs, e.g. a weight penalty, is not).
      return gradients, _read(lane_model)

    def body():
      return _vectorized(lane_gradient, (_LaneValues(
          stacked(model.trainable_variables),
          stacked(model.non_trainable_variables),
          stacked(model.local_variables)),
          tf.nest.map_structure(example, model.input_spec)))

    try:
      fused.trace_inlined(body)
    # pfor raises TypeError where it cannot convert an op's inputs (the
    # Stack Overflow LSTM's while loop), ValueError elsewhere.
    except (ValueError, TypeError) as e:
      raise ValueError(f'lanes need a model whose forward pass vectorizes'
                       f' ({str(e).splitlines()[0]}); use lanes=1.') from e


def auto_lanes(model_fn: ModelFn,
               clients_per_shard: Optional[int] = None,
               on_gpu: bool = False) -> int:
  """`DEFAULT_LANES` for a small model (at most `MAX_AUTO_LANE_WEIGHTS`
  trainable weights; any size `on_gpu`) whose forward pass vectorizes, in
  shards of at least `MIN_AUTO_LANE_CLIENTS` clients (when
  `clients_per_shard` is given); else 1 (clients one after the other: on a
  CPU, a larger model's step is arithmetic that lanes would not share, and
  a smaller shard's round is mostly its fixed cost, which does not repay
  the lanes' tracing at start-up). On a GPU, lanes make one client step of
  many clients one kernel, wider and fewer: what a GPU needs."""
  if clients_per_shard is not None and (
      clients_per_shard < MIN_AUTO_LANE_CLIENTS):
    return 1
  with tf.Graph().as_default():
    num_weights = sum(v.shape.num_elements()
                      for v in model_fn().trainable_variables)
  if num_weights > MAX_AUTO_LANE_WEIGHTS and not on_gpu:
    return 1
  try:
    check_vectorizable(model_fn)
  except ValueError:
    return 1
  return DEFAULT_LANES


def lane_shard_computation(
    model_fn: ModelFn, program_fn: fused.ProgramFn,
    aggregation: fused.FusedAggregation, weights_type: tff.Type,
    hparams_type: tff.Type, data_type: tff.Type,
    client_state_type: Optional[tff.Type] = None, *,
    lanes: int = DEFAULT_LANES,
    resident_examples: Optional[resident.ResidentExamples] = None
) -> tff.Computation:
  """`fused.shard_computation` (same arguments, same type) with the shard's
  clients trained `lanes` at a time (module docstring):

      <weights, hparams[, clipping_norm], shard[, client_states]> ->
          <sums, unfinalized metrics, counters[, new client states]>

  Raises:
    ValueError: If `lanes` < 1, or an op of the model or of the client
      program has no vectorized form (`check_vectorizable`).
  """
  if lanes < 1:
    raise ValueError(f'lanes must be at least 1, got {lanes}.')
  model_fn = fused.with_called_predictions(model_fn)
  check_vectorizable(model_fn)
  layout = _layout(model_fn)
  clipping = aggregation.clipping
  stateful = client_state_type is not None
  arg_types = [('weights', weights_type), ('hparams', hparams_type)]
  if clipping:
    arg_types.append(('clipping_norm', tff.TensorType(np.float32)))
  arg_types.append(('shard', data_type))
  if stateful:
    arg_types.append(('client_states', fused.stacked_type(client_state_type)))

  @tff.tensorflow.computation(
      tff.StructWithPythonType(arg_types, collections.OrderedDict))
  def shard_work(args):
    clipping_norm = args['clipping_norm'] if clipping else None
    model = model_fn()  # The shard's metric variables, and their reports.
    metric_variables = list(model.local_variables)

    def train(initial_weights, hparams, examples, rows, batch_sizes,
              client_states):
      initial = _LaneValues(
          list(tf.nest.flatten(initial_weights.trainable)),
          list(tf.nest.flatten(initial_weights.non_trainable)),
          [v.read_value() for v in metric_variables])

      def lane_program(values):
        lane_model = _lane_model(model_fn, layout, values)
        program = fused.as_stateful(program_fn(
            lane_model, tff.learning.models.ModelWeights.from_model(
                lane_model), initial_weights), stateful)
        return lane_model, program

      def lane_start(lane):
        client_state, num_examples = lane
        _, program = lane_program(initial)
        return program.start(hparams, client_state, num_examples)

      def lane_step(lane):
        values, state, batch = lane
        lane_model, program = lane_program(values)
        state = program.step(state, batch, hparams)
        return _read(lane_model), state

      def lane_finish(lane):
        values, state = lane
        _, program = lane_program(values)
        upload, weight, non_finite, counters, new_state = program.finish(
            state, hparams)
        return (aggregation.contribution(upload, weight, clipping_norm),
                non_finite, counters, new_state)

      ends = tf.cumsum(batch_sizes)
      starts = ends - batch_sizes
      markers = tf.cast(tf.reshape(tf.where(tf.equal(batch_sizes, 0)), [-1]),
                        tf.int32)
      num_clients = tf.size(markers)
      firsts = tf.concat([[0], markers[:-1] + 1], 0)
      num_batches = markers - firsts
      client_examples = tf.gather(starts, markers) - tf.gather(starts,
                                                               firsts)
      # Clients with as many batches share lanes (module docstring).
      order = tf.argsort(num_batches, stable=True)

      # The zeros of the sums and counters, shaped as one client's (traced
      # for one lane, its ops unused).
      first_state = lane_start((tf.nest.map_structure(
          lambda t: t[0], client_states), tf.zeros([], tf.int64)))
      contribution, _, counters, _ = lane_finish((initial, first_state))
      totals = tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype),
                                     (contribution, counters))
      metric_totals = [tf.zeros_like(t) for t in initial.metrics]

      def group_body(g, totals, metric_totals, new_states):
        clients = tf.gather(order, tf.range(
            g * lanes, tf.minimum((g + 1) * lanes, num_clients)))
        count = tf.size(clients)
        lane_first = tf.gather(firsts, clients)
        lane_batches = tf.gather(num_batches, clients)
        lane_states = tf.nest.map_structure(
            lambda t: tf.gather(t, clients), client_states)
        state = _vectorized(lane_start, (lane_states,
                                         tf.gather(client_examples, clients)))
        values = _tile(initial, count)

        def step_body(s, carried):
          batch_index = tf.minimum(lane_first + s, tf.size(batch_sizes) - 1)
          sizes = tf.where(s < lane_batches,
                           tf.gather(batch_sizes, batch_index),
                           tf.zeros([count], tf.int64))
          distinct, _ = tf.unique(tf.boolean_mask(sizes, sizes > 0))

          def size_body(j, carried):
            size = distinct[j]
            active = tf.equal(sizes, size)
            lane_starts = tf.gather(starts, batch_index)
            # Inactive lanes read an active lane's batch; their step is
            # discarded.
            lane_starts = tf.where(
                active, lane_starts,
                lane_starts[tf.argmax(tf.cast(active, tf.int32))])
            positions = lane_starts[:, tf.newaxis] + tf.range(size)[
                tf.newaxis]
            batch = _gather(examples, rows, positions)
            stepped = _vectorized(lane_step, (*carried, batch))
            return j + 1, _where_lane(active, stepped, carried)

          _, carried = tf.while_loop(
              lambda j, _: j < tf.size(distinct), size_body,
              (tf.constant(0), carried))
          return s + 1, carried

        _, (values, state) = tf.while_loop(
            lambda s, _: s < tf.reduce_max(lane_batches), step_body,
            (tf.constant(0), (values, state)))
        contributions, non_finite, counters, new_state = _vectorized(
            lane_finish, (values, state))
        totals = tf.nest.map_structure(
            lambda total, c: total + tf.reduce_sum(c, 0), totals,
            (contributions, counters))
        finite = tf.equal(non_finite, 0)  # As TFF drops a client's metrics.
        metric_totals = [
            total + tf.reduce_sum(_where_lane(finite, m - m0[tf.newaxis],
                                              tf.zeros_like(m)), 0)
            for total, m, m0 in zip(metric_totals, values.metrics,
                                    initial.metrics)]
        new_states = tf.nest.map_structure(
            lambda all_states, lane: tf.tensor_scatter_nd_update(
                all_states, clients[:, tf.newaxis], lane),
            new_states, tf.nest.pack_sequence_as(
                client_states, tf.nest.flatten(new_state)))
        return g + 1, totals, metric_totals, new_states

      num_groups = (num_clients + lanes - 1) // lanes
      _, (sums, counters), metric_totals, new_states = tf.while_loop(
          lambda g, *_: g < num_groups, group_body,
          (tf.constant(0), totals, metric_totals, client_states))
      with tf.control_dependencies([
          v.assign(m0 + total) for v, m0, total in zip(
              metric_variables, initial.metrics, metric_totals)]):
        outputs = (sums, model.report_local_unfinalized_metrics(),
                   tf.nest.map_structure(tf.identity, counters))
      if stateful:
        outputs += (new_states,)
      return outputs

    if stateful:
      client_states = args['client_states']
    else:  # A placeholder with a lane dimension for `lane_start`.
      client_states = ()
    return fused.trace_inlined(
        train, args['weights'], args['hparams'],
        *fused.shard_source(args['shard'], resident_examples),
        args['shard']['batch_sizes'], client_states)

  return shard_work


def shard_computation_fn(lanes: int) -> Callable[..., tff.Computation]:
  """What a fused builder's `lanes` argument selects: `fused.
  shard_computation` (clients one after the other) for 1, else
  `lane_shard_computation` with `lanes` lanes; both take
  `fused.shard_computation`'s arguments.

  Raises:
    ValueError: If `lanes` < 1.
  """
  if lanes < 1:
    raise ValueError(f'lanes must be at least 1, got {lanes}.')
  if lanes == 1:
    return fused.shard_computation
  return functools.partial(lane_shard_computation, lanes=lanes)
