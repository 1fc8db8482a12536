"""SCAFFOLD, option II (Karimireddy et al. 2020, Algorithm 1).

The baseline of Varno et al. (2022) as they ran it ("we implemented SCAFFOLD
as introduced in the original paper"; their Algorithm 1 shows the variant
SCAFFOLD/m only for presentation). Round `t`, cohort `P` out of `|S|`:

* The server sends the model `x` and its control variate `c`.
* Client `i` keeps `c_i` (zero before its first round) and runs `K` local SGD
  steps `θ ← θ − η_t(∇L_i(θ) − c_i + c)` from `x` (`∇L_i` including the
  model's own regularization losses; `K` is the number of batches it
  processed).
* Option II: `c_i⁺ = c_i − c + (x − θ_K)/(K·η_t)`; the client sends
  `x − θ_K` (TFF's model delta) and `c_i⁺ − c_i`, and keeps `c_i ← c_i⁺`.
* Server: `x ← x − η_g·mean_i(x − θ_K)` (`x + η_g·mean(Δy_i)` in the
  original), `c ← c + (1/|S|)·Σ_i (c_i⁺ − c_i)` (`(|P|/|S|)·mean`).

Both directions carry a model-sized vector besides the model: twice FedAvg's
bytes (Varno et al., Appendix C.3). `c` lives in the client work's state and
is broadcast with the round number and learning rate, as TFF's Mime Lite
keeps its server optimizer state in its client work; `Σ(c_i⁺ − c_i)` is a
`tff.federated_sum`. The model mean is weighted as `client_weighting` says
(`UNIFORM` by default, the original's plain mean); no client-size scaling of
`c` is applied. Defaults: client SGD 0.1 decayed ×0.998 per round (Section
4.1 of Varno et al.), `η_g = 1`.
"""

import collections
import math
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import execution as fl_execution
from fl_engine import compose
from fl_engine import stateful_process

CONTROL_VARIATE = 'control_variate'  # c_i on a client, c on the server
CONTROL_VARIATE_DELTA = 'control_variate_delta'  # c_i⁺ − c_i


def scaffold_algorithm(
    model_weights_type: tff.Type,
    *,
    population_size: int,
    server_learning_rate: float = 1.0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
) -> stateful_process.StatefulAlgorithm:
  """SCAFFOLD's client steps, client state and server update, uncomposed.

  `build_scaffold` composes it with TFF's templates; alone, its functions are
  what `adabest_tff.cost` counts (Varno et al. 2022, Supplementary Tables
  4-5).

  Args:
    model_weights_type: The model's `tff.learning.models.ModelWeights` type.
    population_size, server_learning_rate, client_weighting: As in
      `build_scaffold`.

  Returns:
    A `stateful_process.StatefulAlgorithm`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  stateful_process.check_population_size(population_size)
  if not 0.0 < server_learning_rate < math.inf:
    raise ValueError('server_learning_rate must be finite and positive, found '
                     f'{server_learning_rate}.')
  stateful_process.check_client_weighting(client_weighting)

  trainable_type = model_weights_type.trainable

  def zero_control_variate():
    return collections.OrderedDict([
        (CONTROL_VARIATE, stateful_process.zeros_of_type(trainable_type))])

  initial_client_state = tff.tensorflow.computation(zero_control_variate)

  def add_control_variate_deltas(server_values, sums):
    return collections.OrderedDict([(CONTROL_VARIATE, [
        c + delta / population_size
        for c, delta in zip(tf.nest.flatten(server_values[CONTROL_VARIATE]),
                            tf.nest.flatten(sums[CONTROL_VARIATE_DELTA]))
    ])])

  def prepare(client_state, cloud_model, context, num_examples_fn):
    del cloud_model, num_examples_fn
    return (tf.nest.flatten(client_state[CONTROL_VARIATE]),
            tf.nest.flatten(context.server_values[CONTROL_VARIATE]))

  def correction(controls, gradients, trainable):
    del trainable
    client_control, server_control = controls
    return [g - ci + c
            for g, ci, c in zip(gradients, client_control, server_control)]

  def conclude(client_state, controls, model_delta, training, context):
    del client_state
    client_control, server_control = controls
    steps_times_rate = (tf.cast(training.num_steps, tf.float32) *
                        context.learning_rate)
    # A client without steps keeps c_i (no option II estimate exists).
    new_control = [
        tf.where(training.num_steps > 0,
                 ci - c + tf.math.divide_no_nan(delta, steps_times_rate), ci)
        for ci, c, delta in zip(client_control, server_control, model_delta)
    ]
    result = stateful_process.guarded_client_result(
        model_delta,
        stateful_process.client_weight(client_weighting,
                                       training.num_examples),
        collections.OrderedDict([(CONTROL_VARIATE, new_control)]),
        collections.OrderedDict([(CONTROL_VARIATE, client_control)]))
    kept_control = result.update.client_state[CONTROL_VARIATE]
    return result, collections.OrderedDict([(CONTROL_VARIATE_DELTA, [
        kept - ci for kept, ci in zip(kept_control, client_control)
    ])])

  return stateful_process.StatefulAlgorithm(
      steps=stateful_process.StatefulClientSteps(prepare, correction,
                                                 conclude),
      initial_client_state=initial_client_state,
      initial_server_values_fn=zero_control_variate,
      broadcast_values_fn=lambda server_values: server_values,
      server_values_update_fn=add_control_variate_deltas,
      finalizer=tff.learning.templates.build_apply_optimizer_finalizer(
          tff.learning.optimizers.build_sgdm(server_learning_rate),
          model_weights_type),
  )


def build_scaffold(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    population_size: int,
    client_learning_rate: float = 0.1,
    client_learning_rate_decay: float = 0.998,
    server_learning_rate: float = 1.0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None),
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> stateful_process.StatefulClientLearningProcess:
  """Builds the SCAFFOLD (option II) learning process.

  See the module docstring for the update rules.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    population_size: `|S|`, the number of training clients.
    client_learning_rate: The client SGD step size in round 1.
    client_learning_rate_decay: Per-round factor of the client step size.
    server_learning_rate: `η_g`, the global step size.
    client_weighting: How the model updates are averaged.
    model_aggregator: A weighted factory for the mean of the model deltas;
      the mean when None (`fl_engine.compose` says which kind
      each `execution` takes).
    metrics_aggregator: Optional, as in `tff.learning.algorithms`.
    execution: As in `adabest.build_adabest`.

  Returns:
    A `stateful_process.StatefulClientLearningProcess`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  algorithm = scaffold_algorithm(
      stateful_process.model_weights_type(model_fn), population_size=population_size,
      server_learning_rate=server_learning_rate,
      client_weighting=client_weighting)
  return compose.build_process(
      model_fn, algorithm, execution=execution,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator)
