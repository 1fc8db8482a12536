"""AdaBest: adaptive bias estimation (Varno et al. 2022, Algorithm 1).

Round `t` (the paper's θ is `x` here; `g_i`, `h_i`, `h` as in the paper):

* Client `i` of the cohort `P^t` starts from the cloud model `x^{t−1}`, keeps
  `h_i` and `t'_i` (the last round it took part in; `h_i = 0`, `t'_i = 0`
  before its first round) and runs `K` local SGD steps
  `θ ← θ − η_t(∇L_i(θ) − h_i)` (Algorithm 1, the AdaBest line of the local
  loop), `∇L_i` including the model's own regularization losses (the task's
  weight decay).
* `g_i = x^{t−1} − θ_K`; `h_i ← h_i/(t − t'_i) + μ_i·g_i`; `t'_i ← t`
  (Algorithm 1, "update local gradient estimates"; on a first visit `h_i = 0`,
  so `h_i = μ_i·g_i`). The client sends `g_i`, the same bytes as `θ_K`.
* Server: `x̄^t = x^{t−1} − mean_i g_i` (the mean of the `θ_K`),
  `h^t = β(x̄^{t−1} − x̄^t)` (eq. 2), `x^t = x̄^t − h^t` (eq. 1). The cloud
  model `x^t` is broadcast next round; the aggregate `x̄^t` is deployed and
  evaluated: `get_model_weights` returns `x̄^t`, and `set_model_weights(w)`
  sets `x̄ = w` (keeping `h`, so `x = w − h`).

Which reading was taken where the paper is ambiguous:

* Where `μ` sits. Eq. 3 writes the local step as `∇L_i − μ·h_i` with
  `h_i ← h_i/(t − t'_i) + g_i`; Algorithm 1 folds `μ` into `h_i`
  (`∇L_i − h_i`, `h_i ← h_i/(t − t'_i) + μ·g_i`). They agree for a constant
  `μ`; the box wins, so `h_i` stores the `μ`-scaled estimate.
* The server rule is computed as `h^t = β(h^{t−1} + ḡ^t)`, equal to eq. 2 by
  Remark 2 (`x̄^{t−1} − x̄^t = h^{t−1} + ḡ^t`, `ḡ^t = x^{t−1} − x̄^t`); it
  needs no copy of `x̄^{t−1}`, and `x̄^t = x^t + h^t` is recovered exactly.
  It runs as a `tff.learning.optimizers.Optimizer` in TFF's
  `build_apply_optimizer_finalizer`.
* Unbalanced data (Appendix B). The paper weighs clients "in the form of
  average samples per client" as its reference implementation of FedDyn does
  (uniform mean of client models, regularization `μ` divided by the client's
  relative size `n_i/n̄`), and removes the need to know `n̄` for the whole
  population "by progressively calculating this average throughout the
  training". Here `n_i` is the number of examples client `i` processed this
  round and `n̄` the mean of `n_j` over all client participations of the
  earlier rounds (a running sum kept in the server state and broadcast);
  in round 1, before any estimate exists, `μ_i = μ`. With
  `client_weighting=UNIFORM` (the default, as in the paper) `x̄` is the plain
  mean of the cohort's models and `μ_i = μ·n̄/n_i`. With `NUM_EXAMPLES` `x̄`
  is the example-weighted mean and `μ_i = μ` (the client sizes already weigh
  the mean; scaling `μ` as well would count them twice). On balanced data
  `n_i = n̄` and both readings coincide with Algorithm 1.
* `β` decay when `‖h^t‖` plateaus (Section 3.5, Theorem 2) is not specified
  further in the paper. Optional rule here, in the spirit of Keras'
  `ReduceLROnPlateau`: when `‖h‖` has not reached a new minimum for
  `beta_decay_patience` rounds, `β ← β·beta_decay_factor`.
* `β = μ = 0` is FedAvg (Remark 4): with SGD at the same learning rate and
  the same client weighting this process equals
  `tff.learning.algorithms.build_weighted_fed_avg` with server SGD at 1.0.

Metrics besides the model's training metrics (`client_work/train/...`):
`model_norms/global_model_norm` = `‖x^t‖`, `model_norms/deployed_model_norm`
= `‖x̄^t‖`, `finalizer/oracle_gradient_estimate_norm` = `‖h^t‖` and
`finalizer/beta` (the `β` of the next round).

Defaults follow Section 4.1 and Appendix D.1: client SGD at 0.1 decayed ×0.998
per round, `μ = 0.02`, `β = 0.96` (selected at 10 % participation; 0.98 at
100 %, `{0.2, 0.4, 0.6}` searched at 1 %). Batch size, epochs and weight decay
belong to the task's data pipeline and model.
"""

import collections
import math
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import execution as fl_execution
from fl_engine import compose
from fl_engine import stateful_process

LOCAL_GRADIENT_ESTIMATE = 'local_gradient_estimate'  # h_i
LAST_ROUND = 'last_round'  # t'_i
ORACLE_GRADIENT_ESTIMATE = 'oracle_gradient_estimate'  # h (server)
BETA = 'beta'
_LOWEST_NORM = 'lowest_estimate_norm'
_ROUNDS_SINCE_LOWEST = 'rounds_since_lowest_norm'
_CLIENT_EXAMPLES = 'client_examples'
_PARTICIPATIONS = 'participations'
MEAN_CLIENT_EXAMPLES = 'mean_client_examples'


def adabest_server_update(oracle_gradient_estimate: Any, weights: Any,
                          mean_pseudo_gradient: Any,
                          beta: tf.Tensor) -> tuple[Any, Any]:
  """One AdaBest server step on the cloud model (Algorithm 1, server lines).

  Args:
    oracle_gradient_estimate: `h^{t−1}`.
    weights: The cloud model `x^{t−1}`.
    mean_pseudo_gradient: `ḡ^t = x^{t−1} − x̄^t`.
    beta: `β`.

  Returns:
    `(h^t, x^t)` with `h^t = β(x̄^{t−1} − x̄^t) = β(h^{t−1} + ḡ^t)` (eq. 2 and
    Remark 2) and `x^t = x̄^t − h^t` (eq. 1).
  """
  new_estimate = tf.nest.map_structure(lambda h, g: beta * (h + g),
                                       oracle_gradient_estimate,
                                       mean_pseudo_gradient)
  new_weights = tf.nest.map_structure(lambda x, g, h: x - g - h, weights,
                                      mean_pseudo_gradient, new_estimate)
  return new_estimate, new_weights


class _AdaBestServerOptimizer(tff.learning.optimizers.Optimizer):
  """`adabest_server_update` as a TFF optimizer, with the β-plateau rule.

  Its "gradient" is the mean client pseudo-gradient `ḡ^t`; its state holds
  `h` and the hyperparameter `β`.
  """

  def __init__(self, beta: float, beta_decay_patience: Optional[int],
               beta_decay_factor: float):
    self._beta = beta
    self._patience = beta_decay_patience
    self._decay_factor = beta_decay_factor

  def initialize(self, specs: Any) -> collections.OrderedDict:
    return collections.OrderedDict([
        (BETA, tf.constant(self._beta, tf.float32)),
        (ORACLE_GRADIENT_ESTIMATE,
         tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)),
        (_LOWEST_NORM, tf.constant(np.inf, tf.float32)),
        (_ROUNDS_SINCE_LOWEST, tf.constant(0, tf.int32)),
    ])

  def next(self, state, weights, gradients):
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    beta = state[BETA]
    estimate, new_weights = adabest_server_update(
        state[ORACLE_GRADIENT_ESTIMATE], weights, gradients, beta)
    norm = tf.linalg.global_norm(tf.nest.flatten(estimate))
    lowest = tf.minimum(norm, state[_LOWEST_NORM])
    rounds_since_lowest = tf.where(norm < state[_LOWEST_NORM], 0,
                                   state[_ROUNDS_SINCE_LOWEST] + 1)
    if self._patience is not None:
      plateau = rounds_since_lowest >= self._patience
      beta = tf.where(plateau, beta * self._decay_factor, beta)
      rounds_since_lowest = tf.where(plateau, 0, rounds_since_lowest)
    return collections.OrderedDict([
        (BETA, beta),
        (ORACLE_GRADIENT_ESTIMATE, estimate),
        (_LOWEST_NORM, lowest),
        (_ROUNDS_SINCE_LOWEST, rounds_since_lowest),
    ]), new_weights

  def get_hparams(self, state):
    return collections.OrderedDict([(BETA, state[BETA])])

  def set_hparams(self, state, hparams):
    new_state = collections.OrderedDict(state)
    new_state[BETA] = hparams[BETA]
    return new_state


def _reject_non_finite_and_report(state, update):
  """TFF's `reject_non_finite_update`, also reporting `‖h^t‖` and `β`."""
  should_reject, measurements = (
      tff.learning.templates.apply_optimizer_finalizer.reject_non_finite_update(
          state, update))
  measurements[f'{ORACLE_GRADIENT_ESTIMATE}_norm'] = tf.linalg.global_norm(
      tf.nest.flatten(state[ORACLE_GRADIENT_ESTIMATE]))
  measurements[BETA] = state[BETA]
  return should_reject, measurements


def deployed_model_weights(state: Any) -> tff.learning.models.ModelWeights:
  """`x̄ = x + h` from a state whose finalizer holds the server `h`."""
  weights = state.global_model_weights
  return tff.learning.models.ModelWeights(
      trainable=tf.nest.map_structure(
          tf.add, tf.nest.flatten(weights.trainable),
          tf.nest.flatten(state.finalizer[ORACLE_GRADIENT_ESTIMATE])),
      non_trainable=weights.non_trainable)


def with_deployed_model_weights(state: Any, model_weights: Any) -> Any:
  """The state whose deployed model `x + h` is `model_weights` (`h` kept)."""
  cloud_model = tff.learning.models.ModelWeights(
      trainable=tf.nest.map_structure(
          tf.subtract, tf.nest.flatten(model_weights.trainable),
          tf.nest.flatten(state.finalizer[ORACLE_GRADIENT_ESTIMATE])),
      non_trainable=model_weights.non_trainable)
  return stateful_process.LearningAlgorithmState(
      cloud_model, state.distributor, state.client_work, state.aggregator,
      state.finalizer)


def initial_client_size_totals() -> collections.OrderedDict:
  """Running sums for the progressive mean of examples per client."""
  return collections.OrderedDict([
      (_CLIENT_EXAMPLES, tf.constant(0.0, tf.float64)),
      (_PARTICIPATIONS, tf.constant(0.0, tf.float64)),
  ])


def mean_client_examples(totals: Any) -> collections.OrderedDict:
  """`n̄` over the participations so far (0 before any), as a broadcast."""
  mean = tf.math.divide_no_nan(totals[_CLIENT_EXAMPLES],
                               totals[_PARTICIPATIONS])
  return collections.OrderedDict([(MEAN_CLIENT_EXAMPLES,
                                   tf.cast(mean, tf.float32))])


def client_size_contribution(
    num_examples: tf.Tensor) -> collections.OrderedDict:
  """One client's addition to the running sums (summed over the cohort)."""
  return collections.OrderedDict([
      (_CLIENT_EXAMPLES, tf.cast(num_examples, tf.float64)),
      (_PARTICIPATIONS, tf.constant(1.0, tf.float64)),
  ])


def add_client_size_totals(totals: Any, sums: Any) -> collections.OrderedDict:
  """The running sums after adding the cohort's contributions."""
  return collections.OrderedDict([
      (key, totals[key] + sums[key]) for key in (_CLIENT_EXAMPLES,
                                                 _PARTICIPATIONS)
  ])


def client_mu(mu: float, client_weighting: tff.learning.ClientWeighting,
              num_examples: tf.Tensor, mean_examples: tf.Tensor) -> tf.Tensor:
  """`μ_i`: `μ·n̄/n_i` with uniform aggregation and an estimate, else `μ`."""
  mu = tf.constant(mu, tf.float32)
  if client_weighting is tff.learning.ClientWeighting.NUM_EXAMPLES:
    return mu
  num_examples = tf.cast(num_examples, tf.float32)
  return tf.where((mean_examples > 0.0) & (num_examples > 0.0),
                  mu * mean_examples / tf.maximum(num_examples, 1.0), mu)


def adabest_algorithm(
    model_weights_type: tff.Type,
    *,
    mu: float = 0.02,
    beta: float = 0.96,
    beta_decay_patience: Optional[int] = None,
    beta_decay_factor: float = 0.5,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
) -> stateful_process.StatefulAlgorithm:
  """AdaBest's client steps, client state and server update, uncomposed.

  `build_adabest` composes it with TFF's templates; alone, its functions are
  what `adabest_tff.cost` counts (Supplementary Tables 4-5).

  Args:
    model_weights_type: The model's `tff.learning.models.ModelWeights` type.
    mu, beta, beta_decay_patience, beta_decay_factor, client_weighting: As in
      `build_adabest`.

  Returns:
    A `stateful_process.StatefulAlgorithm`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  if not 0.0 <= mu < math.inf:  # NaN fails every comparison
    raise ValueError(f'mu must be finite and nonnegative, found {mu}.')
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f'beta must be in [0, 1], found {beta}.')
  if beta_decay_patience is not None and beta_decay_patience < 1:
    raise ValueError('beta_decay_patience must be a positive number of rounds '
                     f'or None, found {beta_decay_patience}.')
  if not 0.0 < beta_decay_factor < 1.0:
    raise ValueError(
        f'beta_decay_factor must be in (0, 1), found {beta_decay_factor}.')
  stateful_process.check_client_weighting(client_weighting)

  trainable_type = model_weights_type.trainable

  @tff.tensorflow.computation
  def initial_client_state():
    return collections.OrderedDict([
        (LOCAL_GRADIENT_ESTIMATE,
         stateful_process.zeros_of_type(trainable_type)),
        (LAST_ROUND, tf.constant(0, tf.int32)),
    ])

  def prepare(client_state, cloud_model, context, num_examples_fn):
    del cloud_model, num_examples_fn  # h_i is all the correction needs.
    tf.debugging.assert_less(
        client_state[LAST_ROUND], context.round_num,
        message='A client state is from a round at or after the current one.')
    return tf.nest.flatten(client_state[LOCAL_GRADIENT_ESTIMATE])

  def correction(estimate, gradients, trainable):
    del trainable
    return [g - h for g, h in zip(gradients, estimate)]

  def conclude(client_state, estimate, pseudo_gradient, training, context):
    last_round = client_state[LAST_ROUND]
    mu_i = client_mu(mu, client_weighting, training.num_examples,
                     context.server_values[MEAN_CLIENT_EXAMPLES])
    rounds_since_last = tf.cast(context.round_num - last_round, tf.float32)
    new_estimate = [
        h / rounds_since_last + mu_i * g
        for h, g in zip(estimate, pseudo_gradient)
    ]
    new_state = collections.OrderedDict([
        (LOCAL_GRADIENT_ESTIMATE, new_estimate),
        (LAST_ROUND, context.round_num),
    ])
    old_state = collections.OrderedDict([
        (LOCAL_GRADIENT_ESTIMATE, estimate),
        (LAST_ROUND, last_round),
    ])
    result = stateful_process.guarded_client_result(
        pseudo_gradient,
        stateful_process.client_weight(client_weighting,
                                       training.num_examples),
        new_state, old_state)
    return result, client_size_contribution(training.num_examples)

  return stateful_process.StatefulAlgorithm(
      steps=stateful_process.StatefulClientSteps(prepare, correction,
                                                 conclude),
      initial_client_state=initial_client_state,
      initial_server_values_fn=initial_client_size_totals,
      broadcast_values_fn=mean_client_examples,
      server_values_update_fn=add_client_size_totals,
      finalizer=tff.learning.templates.build_apply_optimizer_finalizer(
          _AdaBestServerOptimizer(beta, beta_decay_patience,
                                  beta_decay_factor),
          model_weights_type,
          should_reject_update=_reject_non_finite_and_report),
      deployed_model_weights_fn=deployed_model_weights,
      with_deployed_model_weights_fn=with_deployed_model_weights,
  )


def build_adabest(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_learning_rate: float = 0.1,
    client_learning_rate_decay: float = 0.998,
    mu: float = 0.02,
    beta: float = 0.96,
    beta_decay_patience: Optional[int] = None,
    beta_decay_factor: float = 0.5,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None),
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    execution: fl_execution.Execution = fl_execution.PER_CLIENT,
) -> stateful_process.StatefulClientLearningProcess:
  """Builds the AdaBest learning process (Varno et al. 2022, Algorithm 1).

  See the module docstring for the update rules and the readings taken.
  Drive it with `stateful_process.run_round` and a
  `client_state_store.ClientStateStore`, or call `next` with a list of
  `stateful_process.StatefulClientInput(dataset, client_state)`.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: The client SGD step size in round 1.
    client_learning_rate_decay: Per-round factor of the client step size.
    mu: `μ`, the weight of a round's pseudo-gradient in `h_i`.
    beta: `β` in [0, 1], the server's scale of `h^t`.
    beta_decay_patience: Rounds without a new minimum of `‖h^t‖` after which
      `β` is multiplied by `beta_decay_factor`; None (default) never decays.
    beta_decay_factor: The factor in (0, 1) of a `β` decay.
    client_weighting: `UNIFORM` (the paper: plain mean, `μ` scaled by client
      size) or `NUM_EXAMPLES` (example-weighted mean, unscaled `μ`).
    model_aggregator: A weighted factory for the mean of the clients'
      pseudo-gradients; the mean when None (`fl_engine.compose` says which kind
      each `execution` takes).
    metrics_aggregator: Optional, as in `tff.learning.algorithms`.
    execution: How the clients run (`fl_engine.execution`, composed by
      `fl_engine.compose`): the same rounds whichever.

  Returns:
    A `stateful_process.StatefulClientLearningProcess`.

  Raises:
    ValueError: For a hyperparameter out of range.
  """
  algorithm = adabest_algorithm(
      stateful_process.model_weights_type(model_fn), mu=mu, beta=beta,
      beta_decay_patience=beta_decay_patience,
      beta_decay_factor=beta_decay_factor,
      client_weighting=client_weighting)
  return compose.build_process(
      model_fn, algorithm, execution=execution,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator)
