"""LAMB as a `tff.learning.optimizers.Optimizer` (server optimizer of FedLamb).

FedLamb (Charles et al. 2021, Section 5.2; SPEC.md §1) is FedOpt whose
`ServerOpt` is LAMB (You et al. 2020, "Large Batch Optimization for Deep
Learning: Training BERT in 76 minutes", Algorithm 2): an Adam step rescaled by
a layer-wise trust ratio, where a "layer" is one model variable (one tensor of
the weights structure).

The update implemented, for every layer `x` with gradient `g`, at step
`t = 1, 2, ...` (both moments start at 0):

```
m = β1·m + (1 − β1)·g
v = β2·v + (1 − β2)·g²
m̂ = m / (1 − β1^t),   v̂ = v / (1 − β2^t)          (bias correction)
u = m̂ / (√v̂ + ε) + λ·x                          (λ = weight_decay, 0 default)
r = ‖x‖₂ / ‖u‖₂   if ‖x‖₂ > 0 and ‖u‖₂ > 0
r = 1             otherwise                    (zero-norm layer: Adam step)
x = x − η·r·u
```

ε sits inside the Adam direction (added to `√v̂`, after bias correction), as
in Algorithm 2 of You et al. 2020; the trust ratio itself has no ε and uses
`φ = identity`. A layer whose weights or Adam direction are all zero (e.g. a
zero-initialized bias at the first server round) gets `r = 1`. Used as a
server optimizer the gradient is TFF's `−Δ`.
"""

import collections
from typing import Any, Union

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.learning.optimizers import nest_utils

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_BETA_1_KEY = 'beta_1'
_BETA_2_KEY = 'beta_2'
_EPSILON_KEY = 'epsilon'
_WEIGHT_DECAY_KEY = 'weight_decay'
_STEP_KEY = 'step'
_FIRST_MOMENT_KEY = 'accumulator'
_SECOND_MOMENT_KEY = 'preconditioner'
_HPARAMS_KEYS = (_LEARNING_RATE_KEY, _BETA_1_KEY, _BETA_2_KEY, _EPSILON_KEY,
                 _WEIGHT_DECAY_KEY)

Float = Union[float, tf.Tensor]


def _trust_ratio(weights: tf.Tensor, direction: tf.Tensor) -> tf.Tensor:
  """`‖weights‖ / ‖direction‖`, or 1 when either norm is zero."""
  weights_norm = tf.norm(weights)
  direction_norm = tf.norm(direction)
  both_positive = tf.logical_and(weights_norm > 0.0, direction_norm > 0.0)
  return tf.where(both_positive,
                  tf.math.divide_no_nan(weights_norm, direction_norm),
                  tf.ones_like(weights_norm))


def _check_hparams(learning_rate: Float, beta_1: Float, beta_2: Float,
                   epsilon: Float, weight_decay: Float) -> None:
  """Raises ValueError for a Python hyperparameter out of its range."""
  if not tf.is_tensor(learning_rate) and learning_rate < 0.0:
    raise ValueError(
        f'LAMB learning_rate must be >= 0, got {learning_rate}.')
  for name, beta in (('beta_1', beta_1), ('beta_2', beta_2)):
    if not tf.is_tensor(beta) and not 0.0 <= beta < 1.0:
      raise ValueError(f'LAMB {name} must be in [0, 1), got {beta}.')
  if not tf.is_tensor(epsilon) and epsilon < 0.0:
    raise ValueError(f'LAMB epsilon must be >= 0, got {epsilon}.')
  if not tf.is_tensor(weight_decay) and weight_decay < 0.0:
    raise ValueError(
        f'LAMB weight_decay must be >= 0, got {weight_decay}.')


class _Lamb(tff.learning.optimizers.Optimizer):
  """LAMB with a per-tensor trust ratio; see the module docstring."""

  def __init__(self, learning_rate: Float, beta_1: Float, beta_2: Float,
               epsilon: Float, weight_decay: Float):
    _check_hparams(learning_rate, beta_1, beta_2, epsilon, weight_decay)
    self._learning_rate = learning_rate
    self._beta_1 = beta_1
    self._beta_2 = beta_2
    self._epsilon = epsilon
    self._weight_decay = weight_decay

  def initialize(self, specs: Any) -> collections.OrderedDict[str, Any]:
    zeros = lambda: tf.nest.map_structure(
        lambda spec: tf.zeros(spec.shape, spec.dtype), specs)
    return collections.OrderedDict([
        (_LEARNING_RATE_KEY, self._learning_rate),
        (_BETA_1_KEY, self._beta_1),
        (_BETA_2_KEY, self._beta_2),
        (_EPSILON_KEY, self._epsilon),
        (_WEIGHT_DECAY_KEY, self._weight_decay),
        (_STEP_KEY, 0),
        (_FIRST_MOMENT_KEY, zeros()),
        (_SECOND_MOMENT_KEY, zeros()),
    ])

  def next(
      self, state: collections.OrderedDict[str, Any], weights: Any,
      gradients: Any
  ) -> tuple[collections.OrderedDict[str, Any], Any]:
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    learning_rate = state[_LEARNING_RATE_KEY]
    beta_1 = state[_BETA_1_KEY]
    beta_2 = state[_BETA_2_KEY]
    epsilon = state[_EPSILON_KEY]
    weight_decay = state[_WEIGHT_DECAY_KEY]
    step = state[_STEP_KEY] + 1

    def _lamb_update(w, m, v, g):
      if g is None:
        return w, m, v
      dtype = w.dtype
      b1 = tf.cast(beta_1, dtype)
      b2 = tf.cast(beta_2, dtype)
      t = tf.cast(step, dtype)
      m = b1 * m + (1.0 - b1) * g
      v = b2 * v + (1.0 - b2) * tf.math.square(g)
      m_hat = m / (1.0 - tf.math.pow(b1, t))
      v_hat = v / (1.0 - tf.math.pow(b2, t))
      direction = (m_hat / (tf.math.sqrt(v_hat) + tf.cast(epsilon, dtype))
                   + tf.cast(weight_decay, dtype) * w)
      ratio = _trust_ratio(w, direction)
      return w - tf.cast(learning_rate, dtype) * ratio * direction, m, v

    updated_weights, first_moment, second_moment = nest_utils.map_at_leaves(
        _lamb_update, weights, state[_FIRST_MOMENT_KEY],
        state[_SECOND_MOMENT_KEY], gradients, num_outputs=3)
    updated_state = collections.OrderedDict([
        (_LEARNING_RATE_KEY, learning_rate),
        (_BETA_1_KEY, beta_1),
        (_BETA_2_KEY, beta_2),
        (_EPSILON_KEY, epsilon),
        (_WEIGHT_DECAY_KEY, weight_decay),
        (_STEP_KEY, step),
        (_FIRST_MOMENT_KEY, first_moment),
        (_SECOND_MOMENT_KEY, second_moment),
    ])
    return updated_state, updated_weights

  def get_hparams(
      self, state: collections.OrderedDict[str, Any]
  ) -> collections.OrderedDict[str, Any]:
    return collections.OrderedDict((k, state[k]) for k in _HPARAMS_KEYS)

  def set_hparams(
      self, state: collections.OrderedDict[str, Any],
      hparams: collections.OrderedDict[str, Any]
  ) -> collections.OrderedDict[str, Any]:
    return structure.update_struct(state, **hparams)


def build_lamb(
    learning_rate: Float,
    beta_1: Float = 0.9,
    beta_2: Float = 0.99,
    epsilon: Float = 1e-3,
    weight_decay: Float = 0.0,
) -> tff.learning.optimizers.Optimizer:
  """Returns LAMB (You et al. 2020, Algorithm 2) as a TFF optimizer.

  The update, per model variable, is given in this module's docstring. Its
  state holds `learning_rate` under `tff.learning.optimizers.LEARNING_RATE_KEY`
  so it composes with `tff.learning.optimizers.schedule_learning_rate`.

  Args:
    learning_rate: The step size η (>= 0).
    beta_1: First-moment decay β1 in [0, 1).
    beta_2: Second-moment decay β2 in [0, 1).
    epsilon: Added to `√v̂` in the Adam direction (>= 0).
    weight_decay: The L2 weight decay λ added to the Adam direction (>= 0).

  Raises:
    ValueError: If a hyperparameter is out of its range.
  """
  return _Lamb(learning_rate, beta_1, beta_2, epsilon, weight_decay)
