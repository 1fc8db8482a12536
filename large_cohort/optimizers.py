"""Optimizers by name, as `tff.learning.optimizers.Optimizer`s (SPEC.md §1).

The paper's server optimizers: SGD (FedAvg), SGD with momentum (FedAvgM),
Adagrad, Adam, LARS and LAMB; Yogi is added for GeL's FedYogi. Each is usable
as a server or a client optimizer. Adaptive accumulators start at 0 (Adagrad's
and Yogi's initial preconditioner value is 0).
"""

import math
import numbers

import tensorflow_federated as tff

from large_cohort import lamb
from large_cohort import lars

OPTIMIZER_NAMES = ('sgd', 'sgdm', 'adagrad', 'adam', 'yogi', 'lars', 'lamb')
# The keyword arguments of `build_optimizer` each optimizer uses (beside its
# learning rate).
HYPERPARAMETERS: dict[str, frozenset[str]] = {
    'sgd': frozenset(),
    'sgdm': frozenset({'momentum'}),
    'adagrad': frozenset({'epsilon'}),
    'adam': frozenset({'beta_1', 'beta_2', 'epsilon'}),
    'yogi': frozenset({'beta_1', 'beta_2', 'epsilon'}),
    'lars': frozenset({'momentum', 'epsilon'}),
    'lamb': frozenset({'beta_1', 'beta_2', 'epsilon'}),
}


_FLOAT32_MAX = 3.4028234663852886e+38  # learning rates are float32

def build_optimizer(
    name: str,
    learning_rate: float,
    *,
    momentum: float = 0.9,
    beta_1: float = 0.9,
    beta_2: float = 0.99,
    epsilon: float = 1e-3,
) -> tff.learning.optimizers.Optimizer:
  """Builds the optimizer `name` with the hyperparameters it uses.

  Args:
    name: One of `OPTIMIZER_NAMES`.
    learning_rate: The learning rate.
    momentum: Momentum of `sgdm` and `lars` (β1 of SPEC.md's table).
    beta_1: First-moment decay of `adam`, `yogi` and `lamb`.
    beta_2: Second-moment decay of `adam`, `yogi` and `lamb`.
    epsilon: Stability constant of `adagrad`, `adam`, `yogi`, `lars`, `lamb`.

  Raises:
    ValueError: for an unknown name, a learning rate that is not a finite
      float32 > 0, or a hyperparameter outside its range (momentum and the
      betas in [0, 1), epsilon >= 0), as the driver's flags check them.
  """
  for what, value, ok, rule in (
      ('learning rate', learning_rate, lambda v: v > 0, '> 0'),
      ('momentum', momentum, lambda v: 0 <= v < 1, 'in [0, 1)'),
      ('beta_1', beta_1, lambda v: 0 <= v < 1, 'in [0, 1)'),
      ('beta_2', beta_2, lambda v: 0 <= v < 1, 'in [0, 1)'),
      ('epsilon', epsilon, lambda v: v >= 0, '>= 0')):
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and
            abs(value) <= _FLOAT32_MAX and ok(value)):
      raise ValueError(f'{what} must be a finite float32 {rule}, got {value}')
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum)
  if name == 'adagrad':
    return tff.learning.optimizers.build_adagrad(
        learning_rate, initial_preconditioner_value=0.0, epsilon=epsilon)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(
        learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(
        learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
        initial_preconditioner_value=0.0)
  if name == 'lars':
    return lars.build_lars(learning_rate, momentum=momentum, epsilon=epsilon)
  if name == 'lamb':
    return lamb.build_lamb(
        learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  raise ValueError(
      f'unknown optimizer {name!r}; choose one of {", ".join(OPTIMIZER_NAMES)}')
