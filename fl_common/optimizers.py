"""Optimizers by name, as `tff.learning.optimizers.Optimizer`s (SPEC.md §1).

One registry, `OPTIMIZERS`: one `OptimizerEntry` per optimizer (its
builder, the hyperparameters it takes, the large-cohort paper's name of
FedOpt with it), over the hyperparameters of `HYPERPARAMETERS_SPECS` (name,
default, valid range, help). Everything else is derived from it: the
names (`OPTIMIZER_NAMES`), `build_optimizer`, the driver's
`--{client,server}_<hyperparameter>` flags and which of them each optimizer
honours. A new optimizer is one entry here (and its module, if TFF has
none). Tuned learning rates are the driver's, all in one place
(`experiment_driver.tuned_defaults`).

The paper's server optimizers: SGD (FedAvg), SGD with momentum (FedAvgM),
Adagrad, Adam, LARS and LAMB; Yogi is added for GeL's FedYogi. Each is usable
as a server or a client optimizer. Adaptive accumulators start at 0 (Adagrad's
and Yogi's initial preconditioner value is 0).
"""

import dataclasses
import math
import numbers
from collections.abc import Callable

import tensorflow_federated as tff

from fl_common import lamb
from fl_common import lars

_FLOAT32_MAX = 3.4028234663852886e+38  # Rates and constants are float32.


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
  """One optimizer hyperparameter, as every optimizer taking it reads it.

  Attributes:
    name: Its keyword (`build_optimizer`'s) and flag suffix
      (`--server_<name>`).
    default: Its value when not given (SPEC.md §1).
    below_one: Whether its range is [0, 1) (a decay) rather than >= 0.
  """
  name: str
  default: float
  below_one: bool

  @property
  def rule(self) -> str:
    return 'in [0, 1)' if self.below_one else '>= 0'

  def check(self, value: float) -> None:
    """Raises ValueError unless `value` is a finite float32 in range."""
    _check_float32(self.name, value,
                   (lambda v: 0 <= v < 1) if self.below_one else
                   (lambda v: v >= 0), self.rule)


HYPERPARAMETERS_SPECS: dict[str, Hyperparameter] = {h.name: h for h in (
    Hyperparameter('momentum', 0.9, below_one=True),
    Hyperparameter('beta_1', 0.9, below_one=True),
    Hyperparameter('beta_2', 0.99, below_one=True),
    Hyperparameter('epsilon', 1e-3, below_one=False),
)}


@dataclasses.dataclass(frozen=True)
class OptimizerEntry:
  """One optimizer of the registry.

  Attributes:
    name: Its name (`--server_optimizer=<name>`).
    build: `build(learning_rate, **hyperparameters)` -> the optimizer, with
      exactly the `hyperparameters` named below.
    hyperparameters: The names (in `HYPERPARAMETERS_SPECS`) it takes.
    server_algorithm: The large-cohort paper's name of FedOpt with it as
      the server optimizer (FedAvg for sgd, ...).

  Its tuned rates per task are the driver's
  (`experiment_driver.tuned_defaults.TUNED_RATES`), with every other tuned
  rate.
  """
  name: str
  build: Callable[..., tff.learning.optimizers.Optimizer]
  hyperparameters: tuple[str, ...]
  server_algorithm: str


OPTIMIZERS: dict[str, OptimizerEntry] = {e.name: e for e in (
    OptimizerEntry(
        'sgd', lambda lr: tff.learning.optimizers.build_sgdm(lr), (),
        'FedAvg'),
    OptimizerEntry(
        'sgdm', tff.learning.optimizers.build_sgdm, ('momentum',),
        'FedAvgM'),
    OptimizerEntry(
        'adagrad', lambda lr, epsilon: tff.learning.optimizers.build_adagrad(
            lr, initial_preconditioner_value=0.0, epsilon=epsilon),
        ('epsilon',), 'FedAdagrad'),
    OptimizerEntry(
        'adam', tff.learning.optimizers.build_adam,
        ('beta_1', 'beta_2', 'epsilon'), 'FedAdam'),
    OptimizerEntry(
        'yogi', lambda lr, **kw: tff.learning.optimizers.build_yogi(
            lr, initial_preconditioner_value=0.0, **kw),
        ('beta_1', 'beta_2', 'epsilon'), 'FedYogi'),
    OptimizerEntry(
        'lars', lars.build_lars, ('momentum', 'epsilon'), 'FedLARS'),
    OptimizerEntry(
        'lamb', lamb.build_lamb, ('beta_1', 'beta_2', 'epsilon'), 'FedLamb'),
)}

OPTIMIZER_NAMES = tuple(OPTIMIZERS)
# The keyword arguments of `build_optimizer` each optimizer uses (beside its
# learning rate).
HYPERPARAMETERS: dict[str, frozenset[str]] = {
    name: frozenset(entry.hyperparameters)
    for name, entry in OPTIMIZERS.items()}


def _check_float32(what: str, value, ok: Callable[[float], bool],
                   rule: str) -> None:
  if not (isinstance(value, numbers.Real) and math.isfinite(value) and
          abs(value) <= _FLOAT32_MAX and ok(value)):
    raise ValueError(f'{what} must be a finite float32 {rule}, got {value}')


def build_optimizer(name: str, learning_rate: float,
                    **hyperparameters: float
                    ) -> tff.learning.optimizers.Optimizer:
  """Builds the optimizer `name` with the hyperparameters it uses.

  Args:
    name: One of `OPTIMIZER_NAMES`.
    learning_rate: The learning rate.
    **hyperparameters: Any of `HYPERPARAMETERS_SPECS` (momentum of `sgdm`
      and `lars`, β1 of SPEC.md's table; beta_1 and beta_2 of `adam`,
      `yogi` and `lamb`; epsilon of all but `sgd` and `sgdm`). Each given is
      checked; those `name` does not take are ignored; those not given take
      their defaults.

  Raises:
    ValueError: for an unknown name, a learning rate that is not a finite
      float32 > 0, or a hyperparameter outside its range (momentum and the
      betas in [0, 1), epsilon >= 0), as the driver's flags check them.
    TypeError: for a keyword that is no optimizer's hyperparameter.
  """
  _check_float32('learning rate', learning_rate, lambda v: v > 0, '> 0')
  for key, value in hyperparameters.items():
    if key not in HYPERPARAMETERS_SPECS:
      raise TypeError(f'{key!r} is not an optimizer hyperparameter; they are'
                      f' {", ".join(HYPERPARAMETERS_SPECS)}')
    HYPERPARAMETERS_SPECS[key].check(value)
  if name not in OPTIMIZERS:
    raise ValueError(f'unknown optimizer {name!r}; choose one of'
                     f' {", ".join(OPTIMIZER_NAMES)}')
  entry = OPTIMIZERS[name]
  return entry.build(learning_rate, **{
      key: hyperparameters.get(key, HYPERPARAMETERS_SPECS[key].default)
      for key in entry.hyperparameters})
