"""LARS as a `tff.learning.optimizers.Optimizer` (server optimizer of FedLARS).

FedLARS (Charles et al. 2021, Section 5.2; SPEC.md §1) is FedOpt whose
`ServerOpt` is LARS (You et al. 2017) with a layer-wise trust ratio, where a
"layer" is one model variable: one tensor of the weights structure (a kernel,
a bias, ...).

The update implemented here is LARS as restated in Algorithm 1 of You et al.
2020 ("Large Batch Optimization for Deep Learning: Training BERT in 76
minutes"), which is also the form that uses SPEC.md's `β1 = 0.9` and
`ε = 1e-3`. For every layer `x` with gradient `g`, at every step:

```
g' = g + λ·x                                  (λ = weight_decay, 0 by default)
m  = β·m + (1 − β)·g'                         (β = momentum, m starts at 0)
r  = ‖x‖₂ / (‖m‖₂ + ε)   if ‖x‖₂ > 0 and ‖m‖₂ > 0
r  = 1                   otherwise            (zero-norm layer: plain step)
x  = x − η·r·m
```

Where ε goes: You et al. 2020 write the trust ratio `φ(‖x‖)/‖m‖` with no ε;
the ε of SPEC.md's table is added to the denominator `‖m‖₂`, as in the
authors' implementation of the large-cohort experiments. A layer whose weights
or momentum are all zero (e.g. a zero-initialized bias at the first server
round) gets `r = 1`, i.e. an SGD-with-momentum step of size `η`.

This differs from the formula of You et al. 2017 (Algorithm 1 there) in two
ways the large-cohort paper does not discuss: the 2017 trust ratio is computed
from the gradient (`‖x‖/(‖g‖ + λ‖x‖)`, times a trust coefficient) and applied
before heavy-ball momentum; here it is computed from the momentum, as in the
2020 restatement. Used as a server optimizer the gradient is TFF's `−Δ`.
"""

import collections
from typing import Any, Union

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.learning.optimizers import nest_utils

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_MOMENTUM_KEY = 'momentum'
_EPSILON_KEY = 'epsilon'
_WEIGHT_DECAY_KEY = 'weight_decay'
_ACCUMULATOR_KEY = 'accumulator'
_HPARAMS_KEYS = (_LEARNING_RATE_KEY, _MOMENTUM_KEY, _EPSILON_KEY,
                 _WEIGHT_DECAY_KEY)

Float = Union[float, tf.Tensor]


def _trust_ratio(weights: tf.Tensor, step: tf.Tensor,
                 epsilon: tf.Tensor) -> tf.Tensor:
  """`‖weights‖ / (‖step‖ + ε)`, or 1 when either norm is zero."""
  weights_norm = tf.norm(weights)
  step_norm = tf.norm(step)
  both_positive = tf.logical_and(weights_norm > 0.0, step_norm > 0.0)
  return tf.where(both_positive,
                  tf.math.divide_no_nan(weights_norm, step_norm + epsilon),
                  tf.ones_like(weights_norm))


def _check_hparams(learning_rate: Float, momentum: Float, epsilon: Float,
                   weight_decay: Float) -> None:
  """Raises ValueError for a Python hyperparameter out of its range."""
  if not tf.is_tensor(learning_rate) and learning_rate < 0.0:
    raise ValueError(
        f'LARS learning_rate must be >= 0, got {learning_rate}.')
  if not tf.is_tensor(momentum) and not 0.0 <= momentum < 1.0:
    raise ValueError(f'LARS momentum must be in [0, 1), got {momentum}.')
  if not tf.is_tensor(epsilon) and epsilon < 0.0:
    raise ValueError(f'LARS epsilon must be >= 0, got {epsilon}.')
  if not tf.is_tensor(weight_decay) and weight_decay < 0.0:
    raise ValueError(
        f'LARS weight_decay must be >= 0, got {weight_decay}.')


class _Lars(tff.learning.optimizers.Optimizer):
  """LARS with a per-tensor trust ratio; see the module docstring."""

  def __init__(self, learning_rate: Float, momentum: Float, epsilon: Float,
               weight_decay: Float):
    _check_hparams(learning_rate, momentum, epsilon, weight_decay)
    self._learning_rate = learning_rate
    self._momentum = momentum
    self._epsilon = epsilon
    self._weight_decay = weight_decay

  def initialize(self, specs: Any) -> collections.OrderedDict[str, Any]:
    return collections.OrderedDict([
        (_LEARNING_RATE_KEY, self._learning_rate),
        (_MOMENTUM_KEY, self._momentum),
        (_EPSILON_KEY, self._epsilon),
        (_WEIGHT_DECAY_KEY, self._weight_decay),
        (_ACCUMULATOR_KEY,
         tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)),
    ])

  def next(
      self, state: collections.OrderedDict[str, Any], weights: Any,
      gradients: Any
  ) -> tuple[collections.OrderedDict[str, Any], Any]:
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    learning_rate = state[_LEARNING_RATE_KEY]
    momentum = state[_MOMENTUM_KEY]
    epsilon = state[_EPSILON_KEY]
    weight_decay = state[_WEIGHT_DECAY_KEY]

    def _lars_update(w, m, g):
      if g is None:
        return w, m
      dtype = w.dtype
      g = g + tf.cast(weight_decay, dtype) * w
      beta = tf.cast(momentum, dtype)
      m = beta * m + (1.0 - beta) * g
      ratio = _trust_ratio(w, m, tf.cast(epsilon, dtype))
      return w - tf.cast(learning_rate, dtype) * ratio * m, m

    updated_weights, updated_accumulator = nest_utils.map_at_leaves(
        _lars_update, weights, state[_ACCUMULATOR_KEY], gradients,
        num_outputs=2)
    updated_state = collections.OrderedDict([
        (_LEARNING_RATE_KEY, learning_rate),
        (_MOMENTUM_KEY, momentum),
        (_EPSILON_KEY, epsilon),
        (_WEIGHT_DECAY_KEY, weight_decay),
        (_ACCUMULATOR_KEY, updated_accumulator),
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


def build_lars(
    learning_rate: Float,
    momentum: Float = 0.9,
    epsilon: Float = 1e-3,
    weight_decay: Float = 0.0,
) -> tff.learning.optimizers.Optimizer:
  """Returns LARS (You et al. 2020, Algorithm 1) as a TFF optimizer.

  The update, per model variable, is given in this module's docstring. Its
  state holds `learning_rate` under `tff.learning.optimizers.LEARNING_RATE_KEY`
  so it composes with `tff.learning.optimizers.schedule_learning_rate`.

  Args:
    learning_rate: The step size η (>= 0).
    momentum: The momentum decay β in [0, 1) (SPEC.md's β1 = 0.9).
    epsilon: Added to the momentum norm in the trust ratio (>= 0).
    weight_decay: The L2 weight decay λ added to the gradient (>= 0).

  Raises:
    ValueError: If a hyperparameter is out of its range.
  """
  return _Lars(learning_rate, momentum, epsilon, weight_decay)
