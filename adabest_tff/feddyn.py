"""FedDyn (Acar et al. 2021) as written in Varno et al. 2022, Algorithm 1.

Round `t`, cohort `P^t` out of a population of `|S|` clients:

* Client `i` starts from the cloud model `x^{t−1}`, keeps `h_i` (zero before
  its first round) and runs `K` local SGD steps on
  `∇L_i(θ) − h_i − μ_i(x^{t−1} − θ)` (Algorithm 1, the FedDyn line of the
  local loop; `∇L_i` includes the model's own regularization losses).
* `g_i = x^{t−1} − θ_K`; `h_i ← h_i + μ_i·g_i`. The client sends `g_i`.
* Server: `x̄^t = x^{t−1} − ḡ^t` with `ḡ^t` the mean of the `g_i`,
  `h^t = h^{t−1} + (|P^t|/|S|)·ḡ^t`, `x^t = x̄^t − h^t`. As in AdaBest the
  cloud model `x^t` is broadcast and the aggregate `x̄^t = x^t + h^t` is
  deployed (`get_model_weights`), following the paper's evaluation of the
  averaged client models. With `|P^t| = |S|` the server rule is AdaBest's
  with `β = 1` (Remark 5); the factor `|P^t|/|S|` is why FedDyn needs the
  population size.

`|P^t|` is counted each round by the aggregator (`stateful_process.CohortMean`), so cohorts
may vary in size. Unbalanced data: the paper runs FedDyn "in its original
form", whose reference code divides `μ` (in both the linear and the proximal
term) by the client's relative size `n_i/n̄`; here `n̄` is AdaBest's progressive
estimate (the paper reports this modification does not change FedDyn's
behaviour), and as in `adabest.build_adabest` the scaling applies with
`client_weighting=UNIFORM` (default) and not with `NUM_EXAMPLES`. With
scaling the client counts its examples in a pass over its data before
training, since `μ_i` enters every local step. Defaults: client SGD 0.1
decayed ×0.998 per round, `μ = 0.02` (Section 4.1).
"""

import collections
import math
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from fl_engine import execution as fl_execution
from fl_engine import compose
from fl_engine import stateful_process


def feddyn_server_update(oracle_gradient_estimate: Any, weights: Any,
                         mean_pseudo_gradient: Any,
                         participation_fraction: tf.Tensor) -> tuple[Any, Any]:
  """One FedDyn server step (Algorithm 1, server lines).

  Args:
    oracle_gradient_estimate: `h^{t−1}`.
    weights: The cloud model `x^{t−1}`.
    mean_pseudo_gradient: `ḡ^t = x^{t−1} − x̄^t`.
    participation_fraction: `|P^t|/|S|`.

  Returns:
    `(h^t, x^t)` with `h^t = h^{t−1} + (|P^t|/|S|)·ḡ^t`, `x^t = x̄^t − h^t`.
  """
  new_estimate = tf.nest.map_structure(
      lambda h, g: h + participation_fraction * g, oracle_gradient_estimate,
      mean_pseudo_gradient)
  new_weights = tf.nest.map_structure(lambda x, g, h: x - g - h, weights,
                                      mean_pseudo_gradient, new_estimate)
  return new_estimate, new_weights


def _build_feddyn_finalizer(
    model_weights_type: tff.Type,
    population_size: int) -> tff.learning.templates.FinalizerProcess:
  """Applies `feddyn_server_update` with `|P^t|` from the `stateful_process.CohortMean`."""
  trainable_type = model_weights_type.trainable

  @tff.tensorflow.computation
  def initial_state_fn():
    return collections.OrderedDict([
        (adabest.ORACLE_GRADIENT_ESTIMATE,
         stateful_process.zeros_of_type(trainable_type))
    ])

  state_type = initial_state_fn.type_signature.result

  @tff.tensorflow.computation(state_type, trainable_type, trainable_type,
                              np.float32)
  def update_fn(state, weights, mean_pseudo_gradient, cohort_size):
    estimate, new_weights = feddyn_server_update(
        state[adabest.ORACLE_GRADIENT_ESTIMATE], weights,
        mean_pseudo_gradient, cohort_size / population_size)
    finite = tf.reduce_all([
        tf.reduce_all(tf.math.is_finite(t))
        for t in tf.nest.flatten(mean_pseudo_gradient)
    ])
    # As TFF's `reject_non_finite_update`: keep the state and weights.
    estimate, new_weights = tf.nest.map_structure(
        lambda new, old: tf.where(finite, new, old), (estimate, new_weights),
        (state[adabest.ORACLE_GRADIENT_ESTIMATE], weights))
    measurements = collections.OrderedDict([
        ('update_non_finite', tf.cast(tf.logical_not(finite), tf.int32)),
        (f'{adabest.ORACLE_GRADIENT_ESTIMATE}_norm',
         tf.linalg.global_norm(tf.nest.flatten(estimate))),
    ])
    return (collections.OrderedDict([(adabest.ORACLE_GRADIENT_ESTIMATE,
                                      estimate)]),
            new_weights, measurements)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(model_weights_type, tff.SERVER),
      tff.FederatedType(
          stateful_process.CohortMean(trainable_type,
                                      tff.TensorType(np.float32)),
          tff.SERVER))
  def next_fn(state, weights, aggregate):
    new_state, new_trainable, measurements = tff.federated_map(
        update_fn, (state, weights.trainable, aggregate.mean,
                    aggregate.cohort_size))
    new_weights = tff.federated_zip(tff.learning.models.ModelWeights(
        new_trainable, weights.non_trainable))
    return tff.templates.MeasuredProcessOutput(new_state, new_weights,
                                               measurements)

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn)


def feddyn_algorithm(
    model_weights_type: tff.Type,
    *,
    population_size: int,
    mu: float = 0.02,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
) -> stateful_process.StatefulAlgorithm:
  """FedDyn's client steps, client state and server update, uncomposed.

  `build_feddyn` composes it with TFF's templates; alone, its functions are
  what `adabest_tff.cost` counts (Varno et al. 2022, Supplementary Tables
  4-5).

  Args:
    model_weights_type: The model's `tff.learning.models.ModelWeights` type.
    population_size, mu, client_weighting: As in `build_feddyn`.

  Returns:
    A `stateful_process.StatefulAlgorithm`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  stateful_process.check_population_size(population_size)
  if not 0.0 <= mu < math.inf:  # NaN fails every comparison
    raise ValueError(f'mu must be finite and nonnegative, found {mu}.')
  stateful_process.check_client_weighting(client_weighting)

  trainable_type = model_weights_type.trainable
  scale_mu = client_weighting is tff.learning.ClientWeighting.UNIFORM

  @tff.tensorflow.computation
  def initial_client_state():
    return collections.OrderedDict([
        (adabest.LOCAL_GRADIENT_ESTIMATE,
         stateful_process.zeros_of_type(trainable_type))])

  def prepare(client_state, cloud_model, context, num_examples_fn):
    client_examples = (num_examples_fn() if scale_mu
                       else tf.constant(0, tf.int64))
    mu_i = adabest.client_mu(
        mu, client_weighting, client_examples,
        context.server_values[adabest.MEAN_CLIENT_EXAMPLES])
    return (tf.nest.flatten(client_state[adabest.LOCAL_GRADIENT_ESTIMATE]),
            cloud_model, mu_i)

  def correction(aux, gradients, trainable):
    estimate, cloud_model, mu_i = aux
    return [
        g - h + mu_i * (theta - x)
        for g, h, theta, x in zip(gradients, estimate, trainable, cloud_model)
    ]

  def conclude(client_state, aux, pseudo_gradient, training, context):
    del client_state, context
    estimate, _, mu_i = aux
    new_state = collections.OrderedDict([
        (adabest.LOCAL_GRADIENT_ESTIMATE,
         [h + mu_i * g for h, g in zip(estimate, pseudo_gradient)])])
    old_state = collections.OrderedDict([
        (adabest.LOCAL_GRADIENT_ESTIMATE, estimate)])
    result = stateful_process.guarded_client_result(
        pseudo_gradient,
        stateful_process.client_weight(client_weighting,
                                       training.num_examples),
        new_state, old_state)
    return result, adabest.client_size_contribution(training.num_examples)

  return stateful_process.StatefulAlgorithm(
      steps=stateful_process.StatefulClientSteps(prepare, correction,
                                                 conclude),
      initial_client_state=initial_client_state,
      initial_server_values_fn=adabest.initial_client_size_totals,
      broadcast_values_fn=adabest.mean_client_examples,
      server_values_update_fn=adabest.add_client_size_totals,
      finalizer=_build_feddyn_finalizer(model_weights_type, population_size),
      cohort_mean=True,
      deployed_model_weights_fn=adabest.deployed_model_weights,
      with_deployed_model_weights_fn=adabest.with_deployed_model_weights,
  )


def build_feddyn(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    population_size: int,
    client_learning_rate: float = 0.1,
    client_learning_rate_decay: float = 0.998,
    mu: float = 0.02,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None),
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> stateful_process.StatefulClientLearningProcess:
  """Builds the FedDyn learning process (Varno et al. 2022, Algorithm 1).

  See the module docstring for the update rules and the readings taken.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    population_size: `|S|`, the number of training clients.
    client_learning_rate: The client SGD step size in round 1.
    client_learning_rate_decay: Per-round factor of the client step size.
    mu: `μ` (FedDyn's `α`), the dynamic regularization strength.
    client_weighting: `UNIFORM` (reference: plain mean, `μ` scaled by client
      size) or `NUM_EXAMPLES` (example-weighted mean, unscaled `μ`).
    model_aggregator: A weighted factory for the mean of the clients'
      pseudo-gradients; the mean when None (`fl_engine.compose` says which kind
      each `execution` takes).
    metrics_aggregator: Optional, as in `tff.learning.algorithms`.
    execution: As in `adabest.build_adabest`.

  Returns:
    A `stateful_process.StatefulClientLearningProcess`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  algorithm = feddyn_algorithm(
      stateful_process.model_weights_type(model_fn), population_size=population_size,
      mu=mu, client_weighting=client_weighting)
  return compose.build_process(
      model_fn, algorithm, execution=execution,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator)
