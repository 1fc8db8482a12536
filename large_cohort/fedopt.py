"""FedOpt and FedSGD (Algorithm 1 of Charles et al. 2021, SPEC.md §1).

FedOpt: each client runs E epochs of `ClientOpt` from the server model x and
sends `Δ_k = x_k − x`; the server forms the (example-weighted or uniform) mean
`Δ` through `model_aggregator` and applies `ServerOpt(x, η_s, −Δ)`. With
server SGD at rate 1 this is FedAvg; with SGD+momentum, Adagrad, Adam, LARS or
LAMB it is FedAvgM, FedAdagrad, FedAdam, FedLARS, FedLamb.

FedSGD: each client takes one full-batch gradient at x (client rate 1); the
server applies `ServerOpt` to their mean.

FedOpt is composed from TFF's learning-process slots as TFF's
`build_weighted_fed_avg` / `build_unweighted_fed_avg` compose it (broadcast,
the client work, the aggregator, `build_apply_optimizer_finalizer`), with the
paper's aggregation (adaptive clipping etc.) plugged into the aggregator
slot; FedSGD as TFF's `build_fed_sgd` composes it. Each client is stated
once (`client_program`, `fedsgd_client_program`) and composed by the
library's one composer (`fl_engine.compose.build_process`), which runs it
as its `execution=` says; run per client it is TFF's client work
(`build_model_delta_client_work`, `build_fed_sgd`'s), which
`tests/large_cohort/test_fedopt.py` checks round by round.

Two choices make the client work ~1.6x (EMNIST CNN) to ~2.5x (Stack Overflow
LSTM) cheaper in the worker than TFF's defaults, with the same result
(`bench/`, ../BENCH.md):

* The client loop is TFF's `DATASET_ITERATOR`, not its default
  `DATASET_REDUCE`. Under `dataset.reduce` the model's forward and backward
  `tf.function`s live in a tf.data function, which the worker's TensorFlow
  neither inlines nor optimizes: it re-instantiates them for every client
  (~12 % of the worker's CPU on the EMNIST CNN) and runs the max-pool
  gradient unfused (~10 %). With the iterator loop they sit in the main graph,
  where TFF's compiler inlines them.
* The client work's model gets zeros as the initial values of its trainable
  variables (`client_model_fn`). The worker re-creates the model's variables
  for every client and runs their initializers, then overwrites the trainable
  ones with the broadcast weights; the initializers' random draws (and the
  LSTM's orthogonal initializer, a QR decomposition) were ~45 % of the
  worker's CPU on the Stack Overflow LSTM. The initial server model still
  comes from `model_fn` with its own initializers.

Why one module: FedOpt's and FedSGD's clients share the zero-initialized
client model and the client work's hyperparameters.
"""

import functools
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_common import aggregator_wrappers
from fl_engine import client_program as client_program_lib
from fl_engine import compose
from fl_engine import execution as fl_execution
from fl_engine import fused

ModelFn = Callable[[], tff.learning.models.VariableModel]
_ITERATOR_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


def client_model_fn(model_fn: ModelFn) -> ModelFn:
  """`model_fn` whose trainable variables start at zero instead of their
  initializers (see the module docstring).

  The client work assigns the broadcast weights to every variable of
  `ModelWeights.from_model(model)` before training, so the initial value of a
  trainable variable is never read; any other variable (metrics, Keras
  non-trainable weights) keeps its initializer.

  Raises:
    ValueError: (when the returned function is called) if a trainable
      variable it created is not among the model's trainable variables, so
      that its initial value would be read.
  """

  @functools.wraps(model_fn)
  def client_model_fn() -> tff.learning.models.VariableModel:
    zero_initialized = []

    def zero_initial_value(next_creator, **kwargs):
      shape, dtype = kwargs.get('shape'), kwargs.get('dtype')
      if (kwargs.get('trainable') is not False and dtype is not None and
          shape is not None and tf.TensorShape(shape).is_fully_defined()):
        kwargs['initial_value'] = functools.partial(tf.zeros, shape, dtype)
        variable = next_creator(**kwargs)
        zero_initialized.append(variable)
        return variable
      return next_creator(**kwargs)

    with tf.variable_creator_scope(zero_initial_value):
      model = model_fn()
    trainable = {v.ref() for v in model.trainable_variables}
    unassigned = [v.name for v in zero_initialized if v.ref() not in trainable]
    if unassigned:
      raise ValueError(
          f'model_fn creates trainable variables {unassigned} outside the '
          "model's trainable_variables; FedOpt cannot train such a model.")
    return model

  return client_model_fn


def client_program(client_optimizer: tff.learning.optimizers.Optimizer,
                   weighted: bool) -> fused.ProgramFn:
  """FedOpt's client, stated once: from the broadcast model, a step of
  `client_optimizer` (fresh state, the client work's hparams) per batch;
  it sends `Δ_k = x − x_k` (TFF's sign, zeros if non-finite) weighted by
  its examples, or 1 when not `weighted` (0 if non-finite).

  `build_fedopt` composes it (`fl_engine.compose`).
  """

  def program_fn(model, model_weights, initial_weights):
    trainable = model_weights.trainable
    specs = tuple(tf.TensorSpec(v.shape, v.dtype)
                  for v in tf.nest.flatten(trainable))

    def start(hparams):
      state = client_optimizer.initialize(specs)
      if hparams:
        state = client_optimizer.set_hparams(state, hparams)
      return state, tf.zeros([], tf.int64)

    def step(state, batch, hparams):
      del hparams
      optimizer_state, num_examples = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = tape.gradient(output.loss, trainable)
      optimizer_state, updated = client_optimizer.next(
          optimizer_state, tuple(tf.nest.flatten(trainable)),
          tuple(tf.nest.flatten(gradients)))
      with tf.control_dependencies([
          v.assign(t) for v, t in zip(tf.nest.flatten(trainable), updated)]):
        return optimizer_state, num_examples + fused.count_examples(output)

    def finish(state, hparams):
      del hparams
      _, num_examples = state
      delta, non_finite = fused.screened_model_delta(initial_weights,
                                                     model_weights)
      weight = tf.where(non_finite > 0, 0.0,
                        tf.cast(num_examples, tf.float32) if weighted else
                        1.0)
      return delta, weight, non_finite, ()

    return fused.ClientProgram(start, step, finish)

  return program_fn


def build_fedopt(
    model_fn: ModelFn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    model_aggregator: Optional[aggregator_wrappers.AggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> tff.learning.templates.LearningProcess:
  """Builds FedOpt (Algorithm 1) as a TFF learning process.

  The process is TFF's FedAvg (`tff.learning.algorithms.
  build_weighted_fed_avg`, or `build_unweighted_fed_avg` with
  `ClientWeighting.UNIFORM`), composed from the same slots, with the client
  work of the module docstring:

      next: (<state@SERVER, {D*}@CLIENTS> -> LearningProcessOutput(
             state@SERVER, metrics@SERVER))

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (`ClientOpt`, rate η_c).
    server_optimizer: The server optimizer (`ServerOpt`, rate η_s).
    client_weighting: `NUM_EXAMPLES` (default) or `UNIFORM`.
    model_aggregator: The factory aggregating the client updates (weighted,
      or unweighted with `UNIFORM`); the mean when `None`
      (`fl_engine.compose.build_process` says which kind each `execution`
      takes).
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    loop_implementation: TFF's client training loop; see the module
      docstring for why the default is `DATASET_ITERATOR`.
    execution: How the clients run (`fl_engine.execution`); the same state
      and metrics whichever.

  Raises:
    TypeError: If `model_aggregator` is unweighted with `NUM_EXAMPLES`, or
      weighted with `UNIFORM`, or one `execution` cannot run.
    ValueError: If `execution` cannot run the model or client optimizer.
  """
  weighted = client_weighting is not tff.learning.ClientWeighting.UNIFORM
  return compose.build_process(
      model_fn,
      compose.Client(
          client_program(client_optimizer, weighted),
          client_program_lib.optimizer_hparams_fn(client_optimizer),
          train_model_fn=client_model_fn, weighted=weighted),
      server_optimizer=server_optimizer, model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation, execution=execution)


def build_client_work(
    model_fn: ModelFn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
) -> tff.learning.templates.ClientWorkProcess:
  """FedOpt's client work, one TFF client per client: `client_program` on
  `client_model_fn(model_fn)`. It behaves as TFF's
  `tff.learning.templates.build_model_delta_client_work` (same state,
  hparams, result and metrics; `tests/large_cohort/test_fedopt.py` compares
  them round by round)."""
  return client_program_lib.build_client_work(
      client_model_fn(model_fn),
      client_program(client_optimizer, client_weighting is not
                     tff.learning.ClientWeighting.UNIFORM),
      initial_hparams_fn=client_program_lib.optimizer_hparams_fn(client_optimizer),
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation)


@tff.tensorflow.computation()
def _no_hparams():  # TFF's FedSGD client work has no state.
  return ()


def fedsgd_client_program() -> fused.ProgramFn:
  """FedSGD's client, stated once: the example-weighted mean of its batch
  gradients at the broadcast model, weighted by its examples (TFF's
  `tff.learning.algorithms.build_fed_sgd` client). `build_fedsgd` composes
  it (`fl_engine.compose`)."""

  def program_fn(model, model_weights, initial_weights):
    del initial_weights
    trainable = model_weights.trainable

    def start(hparams):
      del hparams
      return (tuple(tf.zeros(v.shape, v.dtype)
                    for v in tf.nest.flatten(trainable)),
              tf.zeros([], tf.float32))

    def step(state, batch, hparams):
      del hparams
      gradient_sums, num_examples = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch)
      gradients = tape.gradient(
          output.loss, trainable,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
      count = tf.cast(output.num_examples, tf.float32)
      return (tuple(s + count * g for s, g in zip(
          gradient_sums, tf.nest.flatten(gradients))), num_examples + count)

    def finish(state, hparams):
      del hparams
      gradient_sums, num_examples = state
      mean_gradient, non_finite = (
          tff.learning.tensor_utils.zero_all_if_any_non_finite(
              tf.nest.pack_sequence_as(
                  trainable, [s / num_examples for s in gradient_sums])))
      weight = tf.where(non_finite > 0, 0.0, num_examples)
      # TFF's FedSGD keeps a non-finite client's metrics: 0, not the flag.
      return mean_gradient, weight, tf.constant(0), ()

    return fused.ClientProgram(start, step, finish)

  return program_fn


def build_fedsgd(
    model_fn: ModelFn,
    *,
    server_optimizer: tff.learning.optimizers.Optimizer,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> tff.learning.templates.LearningProcess:
  """Builds FedSGD: one full-batch gradient per client (η_c = 1).

  The client gradient is the example-weighted mean of its batch gradients,
  i.e. the gradient of its whole local loss, whatever the batch size.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    server_optimizer: The server optimizer applied to the mean gradient.
    model_aggregator: A weighted factory for the client gradients; the mean
      when `None` (`fl_engine.compose.build_process`).
    metrics_aggregator: Aggregates training metrics; TFF's
      `sum_then_finalize` when `None`.
    loop_implementation: TFF's client loop over the batches (module
      docstring).
    execution: As `build_fedopt`'s.

  Raises:
    TypeError: If `model_aggregator` is not one `execution` can run.
  """
  return compose.build_process(
      model_fn, compose.Client(fedsgd_client_program(), _no_hparams),
      server_optimizer=server_optimizer, model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation, execution=execution)
