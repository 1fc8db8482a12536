"""GeL client work: budgeted local SGD(M), then the guessed steps in one go.

One `tff.learning.templates.ClientWorkProcess` serves every combination of
Table 3 of Boukhari et al. 2024 ("Boosting Federated Learning in
Resource-Constrained Networks"); Algorithm 1, `ClientUpdate`:

* lines 12-13: momentum reset to zero every round, start from the server
  model `x^(t,0)` (clients stay stateless);
* lines 14-18: one SGDM step per batch given, eq. (1)-(2)
  `v <- alpha v - eta_l g`, `x <- x + v`. The client trains on every batch of
  its dataset, so its budget `tau_i` is the number of batches it receives
  (`gel_tff.budgets` cuts the data); the steps it took are counted. The step
  is TFF's `tff.learning.optimizers.build_sgdm`, whose form
  `a <- alpha a + g`, `x <- x - eta_l a` is the same recursion with
  `v = -eta_l a` (constant `eta_l`). Momentum 0 gives plain SGD (FedAvg,
  FedYogi without GeL). FedProx adds `mu (x - x^(t,0))` to every gradient
  (proximal SGDM, gradient of `mu/2 ||x - x^(t,0)||^2`). TFF 0.87's
  `proximal_client_work` is not reused: it adds `mu (x^(t,0) - x)`, the
  opposite sign;
* lines 19-20: the guessed steps, eq. (5):
  `x <- x + alpha (1 - alpha^tau') / (1 - alpha) v`, i.e. `tau'` SGDM steps
  with a zero proxy gradient (eq. (3)-(4)) taken at once. `tau'` is
  `tau - tau_i` (`'remaining'`, floored at 0), infinity (`'infinite'`, factor
  `alpha / (1 - alpha)`, Appendix F.1) or a fixed count (0 turns GeL off).
  Implementation: a zero-gradient SGDM step moves `x` by `alpha v`, so the
  `tau'` steps are one zero-gradient step of the same optimizer with its
  learning rate scaled by `sum_{k<tau'} alpha^k = (1 - alpha^tau')/(1 - alpha)`;
* line 21: the client returns its model delta, in TFF's sign convention
  `x^(t,0) - x^(t,tau_i+tau')` (the server optimizer takes it as a
  pseudo-gradient), weighted by the number of examples it trained on or 1.

For FedNova the update also carries `||a_i||_1`, Lemma 1 (eq. (6)):
`a_i = [1 - alpha^(tau'+tau_i), ..., 1 - alpha^(tau'+1)] / (1 - alpha)`, which
with `tau' = 0` is FedNova's own momentum vector (all ones for SGD).

Reading taken: Algorithm 1 line 19 prints `tau'_i = tau - tau'_i`; the text
(Section 3.1, Appendix F.1) makes clear it is `tau - tau_i`, used here.

Client weights: `NUM_EXAMPLES` is TFF's count of examples trained on this
round, which with step budgets is about `tau_i` times the batch size; the
paper's `p_i = n_i / n` (client dataset sizes, Appendix C.1) is not visible to
a client that only receives its `tau_i` batches. `UNIFORM` gives `p_i = 1/C`.
"""

import collections
import functools
import math
from collections.abc import Callable
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import client_program as client_program_lib
from fl_engine import fused
from fl_common import fednova

REMAINING = 'remaining'
INFINITE = 'infinite'
# 'remaining' (tau - tau_i), 'infinite', or a fixed nonnegative count.
GuessedSteps = Union[str, int]

_LEARNING_RATE_KEY = 'learning_rate'
_MOMENTUM_KEY = 'momentum'


def validate_guessed_steps(guessed_steps: GuessedSteps) -> None:
  """Raises ValueError unless `guessed_steps` is a valid choice."""
  if guessed_steps in (REMAINING, INFINITE):
    return
  if (isinstance(guessed_steps, (int, np.integer)) and
      not isinstance(guessed_steps, bool) and guessed_steps >= 0):
    return
  raise ValueError(
      f"guessed_steps must be '{REMAINING}', '{INFINITE}' or a nonnegative"
      f' int, got {guessed_steps!r}.')


def num_guessed_steps(guessed_steps: GuessedSteps, expected_steps: int,
                      steps_taken: tf.Tensor) -> tf.Tensor:
  """`tau'` as a float32 tensor (infinity for `'infinite'`).

  Args:
    guessed_steps: `'remaining'`, `'infinite'` or a fixed count.
    expected_steps: `tau`, the steps the server asks for.
    steps_taken: `tau_i`, the gradient steps the client took (int tensor).
  """
  if guessed_steps == REMAINING:
    remaining = tf.maximum(
        tf.constant(expected_steps, tf.int64) - tf.cast(steps_taken, tf.int64),
        0)
    return tf.cast(remaining, tf.float32)
  if guessed_steps == INFINITE:
    return tf.constant(np.inf, tf.float32)
  return tf.constant(guessed_steps, tf.float32)


def geometric_sum(momentum: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
  """`sum_{k=0}^{count-1} momentum^k = (1 - momentum^count)/(1 - momentum)`.

  `count` may be infinite (then `1 / (1 - momentum)`); `momentum < 1`.
  """
  return (1.0 - tf.pow(momentum, count)) / (1.0 - momentum)


def lemma1_norm(momentum: tf.Tensor, steps_taken: tf.Tensor,
                guessed: tf.Tensor) -> tf.Tensor:
  """FedNova's `||a_i||_1`, Lemma 1's `a_i[k] = (1 - alpha^(tau' + tau_i -
  k)) / (1 - alpha)` (eq. (6), `k < tau_i`) summed in closed form: `(tau_i
  - alpha^(tau' + 1) (1 - alpha^tau_i) / (1 - alpha)) / (1 - alpha)`; it
  has no per-client length, so it vectorizes."""
  steps_taken = tf.cast(steps_taken, tf.float32)
  return (steps_taken - tf.pow(momentum, guessed + 1.0) *
          geometric_sum(momentum, steps_taken)) / (1.0 - momentum)


def _momentum_of(hparams: collections.OrderedDict) -> tf.Tensor:
  """The SGDM momentum `alpha` in the optimizer's hparams (0 for plain SGD)."""
  return tf.cast(hparams.get(_MOMENTUM_KEY, 0.0), tf.float32)


def client_update_type(model_delta_type: tff.Type, *,
                       report_normalizer: bool) -> tff.Type:
  """The TFF type of the update a GeL client sends (its upload)."""
  if report_normalizer:
    return fednova.fednova_update_type(model_delta_type)
  return model_delta_type


def initial_client_state(optimizer: tff.learning.optimizers.Optimizer,
                         optimizer_hparams, trainable_specs):
  """`(examples, steps taken, SGDM state)`, momentum zero (lines 12-13)."""
  optimizer_state = optimizer.set_hparams(optimizer.initialize(
      trainable_specs), optimizer_hparams)
  return (tf.constant(0, tf.int64), tf.constant(0, tf.int32),
          optimizer_state)


def local_step(model: tff.learning.models.VariableModel,
               optimizer: tff.learning.optimizers.Optimizer,
               proximal_strength: float,
               initial_trainable, state, batch):
  """Eq. (1)-(2) on one batch (lines 14-18): one gradient computation, the
  model's trainable variables updated; FedProx's `mu (x - x^(t,0))` added to
  the gradient. Returns the loop state after the step."""
  num_examples, steps_taken, optimizer_state = state
  trainable = tff.learning.models.ModelWeights.from_model(model).trainable
  with tf.GradientTape() as tape:
    output = model.forward_pass(batch, training=True)
  gradients = tape.gradient(output.loss, trainable)
  if proximal_strength > 0.0:
    gradients = tf.nest.map_structure(
        lambda g, x, x0: g + proximal_strength * (x - x0), gradients,
        trainable, initial_trainable)
  optimizer_state, updated = optimizer.next(
      optimizer_state, tuple(tf.nest.flatten(trainable)),
      tuple(tf.nest.flatten(gradients)))
  with tf.control_dependencies([
      v.assign(t) for v, t in zip(tf.nest.flatten(trainable), updated)]):
    return (num_examples + fused.count_examples(output), steps_taken + 1,
            tf.nest.map_structure(tf.identity, optimizer_state))


def guessed_update(
    optimizer: tff.learning.optimizers.Optimizer,
    optimizer_hparams,
    state,
    initial_trainable,
    trainable,
    *,
    expected_steps: int,
    guessed_steps: GuessedSteps,
    client_weighting: tff.learning.ClientWeighting,
    report_normalizer: bool,
):
  """Lines 19-21: the guessed steps, the upload and its weight, from
  `trainable` (the model after its `tau_i` steps), which it does not change.

  Returns:
    `(update, weight, non_finite)`: the screened model delta (or
    `FedNovaClientUpdate` with Lemma 1's `||a_i||_1`), the client's weight
    (0 if the delta had a NaN or Inf) and that flag (int32).
  """
  num_examples, steps_taken, optimizer_state = state
  # Eq. (5): tau' zero-gradient SGDM steps as one step whose learning rate
  # is scaled by sum_{k<tau'} alpha^k.
  momentum = _momentum_of(optimizer_hparams)
  guessed = num_guessed_steps(guessed_steps, expected_steps, steps_taken)
  guess_hparams = collections.OrderedDict(optimizer_hparams)
  guess_hparams[_LEARNING_RATE_KEY] = (
      optimizer_hparams[_LEARNING_RATE_KEY] * geometric_sum(momentum, guessed))
  flat_trainable = tuple(tf.nest.flatten(trainable))
  _, guessed_weights = optimizer.next(
      optimizer.set_hparams(optimizer_state, guess_hparams), flat_trainable,
      tuple(tf.zeros_like(v) for v in flat_trainable))
  model_delta = tf.nest.map_structure(
      tf.subtract, initial_trainable,
      tf.nest.pack_sequence_as(initial_trainable, list(guessed_weights)))
  model_delta, non_finite = (
      tff.learning.tensor_utils.zero_all_if_any_non_finite(model_delta))
  if client_weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  else:
    weight = tf.constant(1.0, tf.float32)
  weight = tf.where(non_finite > 0, 0.0, weight)
  if report_normalizer:
    update = fednova.FedNovaClientUpdate(
        model_delta=model_delta,
        normalizer=lemma1_norm(momentum, steps_taken, guessed))
  else:
    update = model_delta
  return update, weight, non_finite


def client_program(optimizer: tff.learning.optimizers.Optimizer, *,
                   proximal_strength: float, **update_kwargs
                   ) -> fused.ProgramFn:
  """A GeL client (Algorithm 1, `ClientUpdate`), stated once: `local_step`
  per batch, then `guessed_update` (`update_kwargs` are its keywords); its
  counter is the steps it took. Composed by `gel_tff.gel` through
  `fl_engine.compose` (and run per client by `build_gel_client_work`)."""

  def program_fn(model, model_weights, initial_weights):
    trainable = model_weights.trainable
    specs = tuple(tf.TensorSpec(v.shape, v.dtype)
                  for v in tf.nest.flatten(trainable))
    step = functools.partial(local_step, model, optimizer,
                             proximal_strength, initial_weights.trainable)

    def finish(state, hparams):
      update, weight, non_finite = guessed_update(
          optimizer, hparams, state, initial_weights.trainable, trainable,
          **update_kwargs)
      return update, weight, non_finite, state[1]  # the steps taken

    return fused.ClientProgram(
        start=lambda hparams: initial_client_state(
            optimizer, hparams, specs),
        step=lambda state, batch, hparams: step(state, batch),
        finish=finish)

  return program_fn


def client_measurements(train, gradient_steps) -> collections.OrderedDict:
  """The client work's measurements from the training metrics and the
  cohort's summed steps."""
  return collections.OrderedDict(train=train, gradient_steps=gradient_steps)


def build_client_update_fn(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    expected_steps: int,
    guessed_steps: GuessedSteps,
    proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting,
    report_normalizer: bool,
):
  """The `tf.function` of one client's round (Algorithm 1): `(hparams,
  initial weights, dataset) -> (ClientResult, metrics, steps taken)`."""
  return client_program_lib.build_client_update_fn(
      model_fn, client_program(
          optimizer, proximal_strength=proximal_strength,
          expected_steps=expected_steps, guessed_steps=guessed_steps,
          client_weighting=client_weighting,
          report_normalizer=report_normalizer))


def validate_client_work_args(
    *, learning_rate: float, momentum: float, expected_steps: int,
    guessed_steps: GuessedSteps, proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting) -> None:
  """Raises ValueError if an argument of `build_gel_client_work` is out of
  range."""
  if not 0.0 < learning_rate < math.inf:
    raise ValueError(f'learning_rate must be finite, > 0, got {learning_rate}.')
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f'momentum must be in [0, 1), got {momentum}.')
  if not (isinstance(expected_steps, (int, np.integer)) and
          expected_steps >= 1):
    raise ValueError(
        f'expected_steps must be a positive int, got {expected_steps!r}.')
  validate_guessed_steps(guessed_steps)
  if momentum == 0.0 and guessed_steps != 0:
    raise ValueError(
        f'guessed_steps={guessed_steps!r} needs client momentum: GeL guesses'
        ' along the momentum, and momentum is 0.')
  if not 0.0 <= proximal_strength < math.inf:
    raise ValueError(f'proximal_strength must be finite, >= 0, got'
                     f' {proximal_strength}.')
  if client_weighting not in (tff.learning.ClientWeighting.NUM_EXAMPLES,
                              tff.learning.ClientWeighting.UNIFORM):
    raise ValueError(f'Unknown client_weighting {client_weighting!r}.')


def client_optimizer(learning_rate: float,
                     momentum: float) -> tff.learning.optimizers.Optimizer:
  """The clients' SGDM (plain SGD for momentum 0), TFF's `build_sgdm`."""
  return tff.learning.optimizers.build_sgdm(
      learning_rate=learning_rate, momentum=momentum or None)


def build_gel_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    learning_rate: float,
    momentum: float = 0.9,
    expected_steps: int = 25,
    guessed_steps: GuessedSteps = REMAINING,
    proximal_strength: float = 0.0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    report_normalizer: bool = False,
    metrics_aggregator: Optional[
        tff.learning.metrics.MetricsAggregatorType] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """Builds the client work of every GeL combination (Algorithm 1).

  The state is the client optimizer's hyperparameters (`learning_rate` and,
  with momentum, `momentum`), exposed through `get_hparams`/`set_hparams` as
  in `tff.learning.templates.build_model_delta_client_work`.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`
      built from scratch on each call.
    learning_rate: The client learning rate `eta_l` (> 0).
    momentum: The client momentum `alpha` in [0, 1); 0 is plain SGD, which
      makes any guess a no-op and so requires `guessed_steps=0`.
    expected_steps: `tau`, the local steps the server asks for (>= 1); the
      paper uses `budget_max + 5` (25 for FEMNIST's budgets [4, 20]).
    guessed_steps: `'remaining'` (`tau' = max(tau - tau_i, 0)`),
      `'infinite'`, or a fixed count (0: no guessing).
    proximal_strength: FedProx's `mu` (>= 0); 0 disables the proximal term.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (examples
      trained on) or `UNIFORM`.
    report_normalizer: Send `FedNovaClientUpdate(model_delta, ||a_i||_1)`
      (for `fl_common.fednova`) instead of the bare model delta.
    metrics_aggregator: Aggregates the model's training metrics;
      `tff.learning.metrics.sum_then_finalize` when `None`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess` whose measurements are the
    model's `train` metrics and `gradient_steps`, the cohort's total number of
    gradient computations (sum of `tau_i`).

  Raises:
    ValueError: If an argument is out of range.
  """
  validate_client_work_args(
      learning_rate=learning_rate, momentum=momentum,
      expected_steps=expected_steps, guessed_steps=guessed_steps,
      proximal_strength=proximal_strength, client_weighting=client_weighting)
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize

  optimizer = client_optimizer(learning_rate, momentum)
  return client_program_lib.build_client_work(
      model_fn,
      client_program(optimizer, proximal_strength=proximal_strength,
                     expected_steps=expected_steps,
                     guessed_steps=guessed_steps,
                     client_weighting=client_weighting,
                     report_normalizer=report_normalizer),
      initial_hparams_fn=client_program_lib.optimizer_hparams_fn(optimizer),
      client_measurements_fn=client_measurements,
      metrics_aggregator=metrics_aggregator)
