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
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import nest_utils

from fl_common import trust_ratio_optimizer

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_BETA_1_KEY = 'beta_1'
_BETA_2_KEY = 'beta_2'
_EPSILON_KEY = 'epsilon'
_WEIGHT_DECAY_KEY = 'weight_decay'
_STEP_KEY = 'step'
_FIRST_MOMENT_KEY = 'accumulator'
_SECOND_MOMENT_KEY = 'preconditioner'

Float = trust_ratio_optimizer.Float
_State = trust_ratio_optimizer.State


class _Lamb(trust_ratio_optimizer.TrustRatioOptimizer):
  """LAMB with a per-tensor trust ratio; see the module docstring."""

  def __init__(self, learning_rate: Float, beta_1: Float, beta_2: Float,
               epsilon: Float, weight_decay: Float):
    super().__init__(
        'LAMB',
        collections.OrderedDict([
            (_LEARNING_RATE_KEY, learning_rate),
            (_BETA_1_KEY, beta_1),
            (_BETA_2_KEY, beta_2),
            (_EPSILON_KEY, epsilon),
            (_WEIGHT_DECAY_KEY, weight_decay),
        ]),
        decay_names=(_BETA_1_KEY, _BETA_2_KEY))

  def _initial_slots(self, specs: Any) -> _State:
    return collections.OrderedDict([
        (_STEP_KEY, 0),
        (_FIRST_MOMENT_KEY, trust_ratio_optimizer.zeros_like_specs(specs)),
        (_SECOND_MOMENT_KEY, trust_ratio_optimizer.zeros_like_specs(specs)),
    ])

  def _update(self, hparams: _State, state: _State, weights: Any,
              gradients: Any) -> tuple[_State, Any]:
    learning_rate = hparams[_LEARNING_RATE_KEY]
    beta_1 = hparams[_BETA_1_KEY]
    beta_2 = hparams[_BETA_2_KEY]
    epsilon = hparams[_EPSILON_KEY]
    weight_decay = hparams[_WEIGHT_DECAY_KEY]
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
      ratio = trust_ratio_optimizer.trust_ratio(w, direction)
      return w - tf.cast(learning_rate, dtype) * ratio * direction, m, v

    updated_weights, first_moment, second_moment = nest_utils.map_at_leaves(
        _lamb_update, weights, state[_FIRST_MOMENT_KEY],
        state[_SECOND_MOMENT_KEY], gradients, num_outputs=3)
    return collections.OrderedDict([
        (_STEP_KEY, step),
        (_FIRST_MOMENT_KEY, first_moment),
        (_SECOND_MOMENT_KEY, second_moment),
    ]), updated_weights


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
