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

Settled against the authors' code: the paper's implementation
(google-research/federated, whose `large_cohort` trainer takes its LARS from
`utils/optimizers/lars.py`) computes exactly this update — the EMA momentum
with `(1 − β)`, the trust ratio from the momentum with `ε` in the denominator,
ratio 1 for a zero-norm layer. It is followed here rather than the paper's
citation, You et al. 2017, whose Algorithm 1 differs in two ways the
large-cohort paper does not discuss: the 2017 trust ratio is computed from the
gradient (`‖x‖/(‖g‖ + λ‖x‖)`, times a trust coefficient) and applied
before heavy-ball momentum; here it is computed from the momentum, as in the
2020 restatement. Used as a server optimizer the gradient is TFF's `−Δ`.
"""

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import nest_utils

from fl_common import trust_ratio_optimizer

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_MOMENTUM_KEY = 'momentum'
_EPSILON_KEY = 'epsilon'
_WEIGHT_DECAY_KEY = 'weight_decay'
_ACCUMULATOR_KEY = 'accumulator'

Float = trust_ratio_optimizer.Float
_State = trust_ratio_optimizer.State


class _Lars(trust_ratio_optimizer.TrustRatioOptimizer):
  """LARS with a per-tensor trust ratio; see the module docstring."""

  def __init__(self, learning_rate: Float, momentum: Float, epsilon: Float,
               weight_decay: Float):
    super().__init__(
        'LARS',
        collections.OrderedDict([
            (_LEARNING_RATE_KEY, learning_rate),
            (_MOMENTUM_KEY, momentum),
            (_EPSILON_KEY, epsilon),
            (_WEIGHT_DECAY_KEY, weight_decay),
        ]),
        decay_names=(_MOMENTUM_KEY,))

  def _initial_slots(self, specs: Any) -> _State:
    return collections.OrderedDict([
        (_ACCUMULATOR_KEY, trust_ratio_optimizer.zeros_like_specs(specs))])

  def _update(self, hparams: _State, state: _State, weights: Any,
              gradients: Any) -> tuple[_State, Any]:
    learning_rate = hparams[_LEARNING_RATE_KEY]
    momentum = hparams[_MOMENTUM_KEY]
    epsilon = hparams[_EPSILON_KEY]
    weight_decay = hparams[_WEIGHT_DECAY_KEY]

    def _lars_update(w, m, g):
      if g is None:
        return w, m
      dtype = w.dtype
      g = g + tf.cast(weight_decay, dtype) * w
      beta = tf.cast(momentum, dtype)
      m = beta * m + (1.0 - beta) * g
      ratio = trust_ratio_optimizer.trust_ratio(w, m, tf.cast(epsilon, dtype))
      return w - tf.cast(learning_rate, dtype) * ratio * m, m

    updated_weights, updated_accumulator = nest_utils.map_at_leaves(
        _lars_update, weights, state[_ACCUMULATOR_KEY], gradients,
        num_outputs=2)
    return (collections.OrderedDict([(_ACCUMULATOR_KEY, updated_accumulator)]),
            updated_weights)


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
