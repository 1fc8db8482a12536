"""Clients trained side by side: a shard's clients vectorized over lanes.

A fused shard (`fl_common.fused`) trains its clients one after the other.
For a small model each local step is a few dozen tiny ops, and the
TensorFlow executor's cost per op, not arithmetic, sets the round's time.
Here a shard trains `lanes` of its clients at once: every tensor of the
model gains a leading lane dimension, so a step of `lanes` clients costs
about the ops of one step (a `MatMul` becomes one `BatchMatMulV2`).

How a lane computes exactly what the client computes alone: the model's
own `forward_pass` is traced once, for one lane, and vectorized over the
lanes by `tf.vectorized_map` (TensorFlow's pfor, without its while-loop
fallback: `check_vectorizable`), inside a `tf.variable_creator_scope` that
hands the model, as it builds itself, tensors in place of its variables:
the lane's weights, non-trainable weights and metric variables
(`TensorVariable`, below). The loss, the metric updates and the examples count are the
model's, per lane; the gradient of the lanes' summed losses with respect to
the stacked weights is each lane's own gradient (lanes do not interact);
the client optimizer's `next` runs on the stacked tensors, which is each
lane's step for an element-wise optimizer (SGD with or without momentum,
Adagrad: `check_lane_safe` refuses a shared counter, such as Adam's step,
since lanes step at different times, and a norm over a whole weight, such
as LARS').

Clients differ in their number and sizes of batches. The shard's clients
are ordered by their number of batches (so lanes of a group finish
together), taken `lanes` at a time; at the group's step `s` each lane runs
its own batch `s`: lanes whose batches have the same size run together
(one vectorized step per distinct size, usually one), and a lane with no
such batch keeps its weights, optimizer state and metrics (`tf.where` on the
lane). A lane's update is screened as TFF's client work screens it (a
non-finite delta: zeros, weight 0, its metrics dropped), and its
contribution to the aggregator's sums is the per-client aggregator's
(`FusedAggregation.contribution`, vectorized over the lanes).

The model's metrics must add over clients (as TFF's `sum_then_finalize`
assumes): a shard's unfinalized metrics are the initial values plus every
finite client's change, written to the shard model's metric variables and
reported by its `report_local_unfinalized_metrics`.

Below TFF's public API: `TensorVariable` (TFF's own duck-typed variable
over a tensor, from `tensorflow_frontend.variable_utils`, which TFF's
`functional_model_from_keras` and functional metrics use the same way); it
is imported here only.

Why one module: the lane step, the checks that a model and an optimizer
can take lanes (which trace that same step) and the shard's loop around it
share the variable layout and the per-lane state; apart, each would
restate them.
"""

import collections
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.environments.tensorflow_frontend import variable_utils

from fl_common import fused
from fl_common import resident

ModelFn = Callable[[], tff.learning.models.VariableModel]

# `auto_lanes`' lanes per group: of 10 to 250 lanes, 50-100 were the fastest
# for 1,000 Synthetic clients on 2 shards.
DEFAULT_LANES = 64
# `auto_lanes` trains models of at most this many weights on lanes: there a
# step's cost is the executor's per-op work, which lanes share.
MAX_AUTO_LANE_WEIGHTS = 10_000


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


def check_lane_safe(client_optimizer: tff.learning.optimizers.Optimizer,
                    specs: Any) -> None:
  """Raises `ValueError` unless `client_optimizer` is element-wise, so that
  stacked lanes step independently: its state, apart from its
  hyperparameters, is shaped as the weights (no shared counter, such as
  Adam's step), and a step on two stacked lanes equals each lane's step
  alone (no norm over a whole weight tensor, such as LARS' trust ratio).
  Checked on `specs`' shapes with random values, eagerly."""
  state = client_optimizer.initialize(specs)
  hparams = client_optimizer.get_hparams(state)
  shapes = {tuple(s.shape) for s in tf.nest.flatten(specs)}
  shared = [key for key, value in state.items() if key not in hparams and
            any(tuple(np.shape(t)) not in shapes
                for t in tf.nest.flatten(value))]
  if shared:
    raise ValueError(
        f'lanes need an element-wise client optimizer; this one keeps '
        f'{shared} shared by all weights, which lanes stepping at different '
        f'times would share. Use lanes=1.')
  rng = np.random.default_rng(0)
  draw = lambda: [tf.constant(rng.normal(size=[2, *s.shape]), s.dtype)
                  for s in tf.nest.flatten(specs)]
  weights, gradients = draw(), draw()
  stacked_state, stacked = _lane_slots(state, hparams, 2), tuple(weights)
  for _ in range(2):  # two steps: slots carry over
    stacked_state, stacked = client_optimizer.next(
        stacked_state, stacked, tuple(gradients))
  for lane in range(2):
    lane_state = state
    lane_weights = tuple(w[lane] for w in weights)
    for _ in range(2):
      lane_state, lane_weights = client_optimizer.next(
          lane_state, lane_weights, tuple(g[lane] for g in gradients))
    for alone, together in zip(lane_weights, stacked):
      if not np.allclose(alone, together[lane], rtol=1e-4,
                         atol=1e-6):
        raise ValueError(
            'lanes need an element-wise client optimizer; a step of this one'
            ' on stacked lanes differs from each lane\'s step alone (it'
            ' couples the entries of a weight, e.g. by its norm). Use'
            ' lanes=1.')


def auto_lanes(model_fn: ModelFn,
               client_optimizer: tff.learning.optimizers.Optimizer) -> int:
  """`DEFAULT_LANES` for a small model (at most `MAX_AUTO_LANE_WEIGHTS`
  trainable weights) whose forward pass vectorizes, with an element-wise
  client optimizer; else 1 (clients one after the other: a larger model's
  step is arithmetic that lanes would not share)."""
  with tf.Graph().as_default():
    trainable = model_fn().trainable_variables
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  if sum(s.shape.num_elements() for s in specs) > MAX_AUTO_LANE_WEIGHTS:
    return 1
  try:
    check_lane_safe(client_optimizer, specs)
    check_vectorizable(model_fn)
  except ValueError:
    return 1
  return DEFAULT_LANES


def _where_lane(active: tf.Tensor, new: Any, old: Any) -> Any:
  """`new` on active lanes, `old` on the others (leading lane dimension)."""
  def select(n, o):
    mask = tf.reshape(active, [-1] + [1] * (n.shape.rank - 1))
    return tf.where(mask, n, o)
  return tf.nest.map_structure(select, new, old)


def _lane_slots(state: Any, hparams: Any, count: tf.Tensor) -> Any:
  """An optimizer state's slots (all but its hyperparameters) per lane."""
  return collections.OrderedDict(
      (key, value if key in hparams else _tile(value, count))
      for key, value in state.items())


def _where_slots(active: tf.Tensor, new: Any, old: Any, hparams: Any) -> Any:
  """`new`'s slots on active lanes, `old`'s elsewhere; `new`'s hparams."""
  return collections.OrderedDict(
      (key, value if key in hparams else _where_lane(active, value, old[key]))
      for key, value in new.items())


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


def _lane_forward_fn(model_fn: ModelFn, layout: _Layout
                     ) -> Callable[[Any], Any]:
  """`(weights, non_trainable, metrics, batch) -> (loss, new non_trainable,
  new metrics)`: one lane's step, the model's own forward pass on tensors
  handed to it in place of its variables (module docstring); traced once
  by `tf.vectorized_map`."""

  def lane_forward(lane):
    weights, non_trainable, metrics, batch = lane
    values = {}
    for indices, tensors in ((layout.trainable, weights),
                             (layout.non_trainable, non_trainable),
                             (layout.local, metrics)):
      values.update(zip(indices, tensors))
    made = []

    def inject(next_creator, **kwargs):
      if len(made) in values:
        kwargs['initial_value'] = values[len(made)]
      made.append(variable_utils.create_tensor_variable(next_creator,
                                                        **kwargs))
      return made[-1]

    with tf.variable_creator_scope(inject):
      lane_model = model_fn()
    output = lane_model.forward_pass(batch, training=True)
    return (output.loss,
            [v.read_value() for v in lane_model.non_trainable_variables],
            [v.read_value() for v in lane_model.local_variables])

  return lane_forward


def check_vectorizable(model_fn: ModelFn) -> None:
  """Raises `ValueError` unless every op of the model's forward pass (and
  of its gradient) has a vectorized form (`tf.vectorized_map` without its
  fallback, a loop over the lanes that would be slower than no lanes: e.g.
  `L2Loss`, Keras' L2 penalty). Traced on two lanes of one example, in a
  throwaway graph."""
  layout = _layout(model_fn)
  lane_forward = _lane_forward_fn(model_fn, layout)
  with tf.Graph().as_default():
    model = model_fn()

    def stacked(values):
      return [tf.zeros([2, *v.shape], v.dtype) for v in values]

    def example(spec):
      return tf.zeros([2, 1, *[d or 1 for d in spec.shape[1:]]], spec.dtype)

    def body():
      weights = stacked(model.trainable_variables)
      with tf.GradientTape() as tape:
        tape.watch(weights)
        losses, _, _ = tf.vectorized_map(
            lane_forward,
            (weights, stacked(model.non_trainable_variables),
             stacked(model.local_variables),
             tf.nest.map_structure(example, model.input_spec)),
            fallback_to_while_loop=False)
      return tape.gradient(tf.reduce_sum(losses), weights)

    try:
      fused.trace_inlined(body)
    except ValueError as e:
      raise ValueError(f'lanes need a model whose forward pass vectorizes'
                       f' ({str(e).splitlines()[0]}); use lanes=1.') from e


def lane_shard_computation(
    model_fn: ModelFn, client_optimizer: tff.learning.optimizers.Optimizer,
    aggregation: fused.FusedAggregation, weights_type: tff.Type,
    hparams_type: tff.Type, data_type: tff.Type, *, weighted: bool,
    lanes: int = DEFAULT_LANES,
    resident_examples: Optional[resident.ResidentExamples] = None
) -> tff.Computation:
  """FedOpt's shard computation (`fused.shard_computation` with
  `large_cohort.fused`'s client program) with the shard's clients trained
  `lanes` at a time (module docstring):

      <weights, hparams[, clipping_norm], shard> ->
          <sums, unfinalized metrics, ()>

  Each client takes one step of `client_optimizer` per batch from the
  broadcast weights, weighted by its examples (`weighted`) or uniformly.

  Raises:
    ValueError: If `lanes` < 1, the optimizer is not element-wise
      (`check_lane_safe`) or the model does not vectorize
      (`check_vectorizable`).
  """
  if lanes < 1:
    raise ValueError(f'lanes must be at least 1, got {lanes}.')
  layout = _layout(model_fn)
  specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in
                tff.types.type_to_tf_tensor_specs(weights_type.trainable))
  check_lane_safe(client_optimizer, specs)
  check_vectorizable(model_fn)
  clipping = aggregation.clipping
  arg_types = [('weights', weights_type), ('hparams', hparams_type)]
  if clipping:
    arg_types.append(('clipping_norm', tff.TensorType(np.float32)))
  arg_types.append(('shard', data_type))

  @tff.tensorflow.computation(
      tff.StructWithPythonType(arg_types, collections.OrderedDict))
  def shard_work(args):
    clipping_norm = args['clipping_norm'] if clipping else None
    model = model_fn()  # The shard's metric variables, and their reports.
    metric_variables = list(model.local_variables)

    lane_forward = _lane_forward_fn(model_fn, layout)

    def train(initial_weights, hparams, examples, rows, batch_sizes):
      trainable = list(tf.nest.flatten(initial_weights.trainable))
      non_trainable = list(tf.nest.flatten(initial_weights.non_trainable))
      initial_metrics = [v.read_value() for v in metric_variables]
      ends = tf.cumsum(batch_sizes)
      starts = ends - batch_sizes
      markers = tf.cast(tf.reshape(tf.where(tf.equal(batch_sizes, 0)), [-1]),
                        tf.int32)
      num_clients = tf.size(markers)
      firsts = tf.concat([[0], markers[:-1] + 1], 0)
      num_batches = markers - firsts
      # Clients with as many batches share lanes (module docstring).
      order = tf.argsort(num_batches, stable=True)

      # The zeros of the sums, shaped as one client's contribution.
      zero_delta = [tf.zeros_like(t) for t in trainable]
      totals = tf.nest.map_structure(
          lambda t: tf.zeros(t.shape, t.dtype), aggregation.contribution(
              tf.nest.pack_sequence_as(initial_weights.trainable,
                                       zero_delta),
              tf.constant(0.0), clipping_norm))
      metric_totals = [tf.zeros_like(t) for t in initial_metrics]

      def group_body(g, totals, metric_totals):
        clients = tf.gather(order, tf.range(
            g * lanes, tf.minimum((g + 1) * lanes, num_clients)))
        count = tf.size(clients)
        lane_first = tf.gather(firsts, clients)
        lane_batches = tf.gather(num_batches, clients)
        weights = _tile(trainable, count)
        lane_non_trainable = _tile(non_trainable, count)
        lane_metrics = _tile(initial_metrics, count)
        optimizer_state = _lane_slots(client_optimizer.set_hparams(
            client_optimizer.initialize(specs), hparams), hparams, count)
        examples_seen = tf.zeros([count], tf.int64)

        def step_body(s, carried):
          batch_index = tf.minimum(lane_first + s, tf.size(batch_sizes) - 1)
          sizes = tf.where(s < lane_batches,
                           tf.gather(batch_sizes, batch_index),
                           tf.zeros([count], tf.int64))
          distinct, _ = tf.unique(tf.boolean_mask(sizes, sizes > 0))

          def size_body(j, carried):
            (weights, lane_non_trainable, lane_metrics, optimizer_state,
             examples_seen) = carried
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
            with tf.GradientTape() as tape:
              tape.watch(weights)
              losses, new_non_trainable, new_metrics = tf.vectorized_map(
                  lane_forward,
                  (weights, lane_non_trainable, lane_metrics, batch),
                  fallback_to_while_loop=False)
              total_loss = tf.reduce_sum(losses)
            gradients = [tf.convert_to_tensor(g) for g in tape.gradient(
                total_loss, weights,
                unconnected_gradients=tf.UnconnectedGradients.ZERO)]
            new_state, new_weights = client_optimizer.next(
                optimizer_state, tuple(weights), tuple(gradients))
            return j + 1, (
                _where_lane(active, list(new_weights), weights),
                _where_lane(active, new_non_trainable, lane_non_trainable),
                _where_lane(active, new_metrics, lane_metrics),
                _where_slots(active, new_state, optimizer_state, hparams),
                examples_seen + tf.where(active, size, tf.zeros_like(size)))

          _, carried = tf.while_loop(
              lambda j, _: j < tf.size(distinct), size_body,
              (tf.constant(0), carried))
          return s + 1, carried

        _, (weights, _, lane_metrics, _, examples_seen) = tf.while_loop(
            lambda s, _: s < tf.reduce_max(lane_batches), step_body,
            (tf.constant(0), (weights, lane_non_trainable, lane_metrics,
                              optimizer_state, examples_seen)))

        # Each lane's upload, screened and weighted as the client's.
        delta = [t[tf.newaxis] - w for t, w in zip(trainable, weights)]
        finite = tf.reduce_all(tf.stack([
            tf.reduce_all(tf.reshape(tf.math.is_finite(d), [count, -1]), 1)
            for d in delta]), 0)
        delta = _where_lane(finite, delta, [tf.zeros_like(d) for d in delta])
        weight = tf.where(
            finite, tf.cast(examples_seen, tf.float32) if weighted else
            tf.ones([count]), 0.0)
        contributions = tf.vectorized_map(
            lambda lane: aggregation.contribution(
                tf.nest.pack_sequence_as(initial_weights.trainable, lane[0]),
                lane[1], clipping_norm), (delta, weight),
            fallback_to_while_loop=False)
        totals = tf.nest.map_structure(
            lambda total, c: total + tf.reduce_sum(c, 0), totals,
            contributions)
        metric_totals = [
            total + tf.reduce_sum(_where_lane(finite, m - m0[tf.newaxis],
                                              tf.zeros_like(m)), 0)
            for total, m, m0 in zip(metric_totals, lane_metrics,
                                    initial_metrics)]
        return g + 1, totals, metric_totals

      num_groups = (num_clients + lanes - 1) // lanes
      _, sums, metric_totals = tf.while_loop(
          lambda g, *_: g < num_groups, group_body,
          (tf.constant(0), totals, metric_totals))
      with tf.control_dependencies([
          v.assign(m0 + total) for v, m0, total in zip(
              metric_variables, initial_metrics, metric_totals)]):
        return sums, model.report_local_unfinalized_metrics(), ()

    return fused.trace_inlined(
        train, args['weights'], args['hparams'],
        *fused.shard_source(args['shard'], resident_examples),
        args['shard']['batch_sizes'])

  return shard_work
