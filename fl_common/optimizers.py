"""Optimizers by name, as `tff.learning.optimizers.Optimizer`s (SPEC.md §1).

One registry, `OPTIMIZERS`: one `OptimizerEntry` per optimizer (its
builder, the hyperparameters it takes and the large-cohort paper's tuned
rates per task), over the hyperparameters of `HYPERPARAMETERS_SPECS` (name,
default, valid range, help). Everything else is derived from it: the
names (`OPTIMIZER_NAMES`), `build_optimizer`, the driver's
`--{client,server}_<hyperparameter>` flags and which of them each optimizer
honours, and the tuned-rate lookup (`experiment_driver.tuned_defaults`). A
new optimizer is one entry here (and its module, if TFF has none).

The paper's server optimizers: SGD (FedAvg), SGD with momentum (FedAvgM),
Adagrad, Adam, LARS and LAMB; Yogi is added for GeL's FedYogi. Each is usable
as a server or a client optimizer. Adaptive accumulators start at 0 (Adagrad's
and Yogi's initial preconditioner value is 0).
"""

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping

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
    tuned_rates: `(server_lr, client_lr)` by task: the paper's Tables 3-4
      (tuned at M = 10) and the rates found here for the package's own
      tasks. A task missing is an error, never a silent default
      (`experiment_driver.tuned_defaults`).
  """
  name: str
  build: Callable[..., tff.learning.optimizers.Optimizer]
  hyperparameters: tuple[str, ...]
  server_algorithm: str
  tuned_rates: Mapping[str, tuple[float, float]]


# The paper's tuned rates (Tables 3-4), by the paper's tasks.
def _paper(cifar100, emnist, shakespeare, stackoverflow, **others):
  return {'cifar100': cifar100, 'emnist': emnist, 'shakespeare': shakespeare,
          'stackoverflow': stackoverflow, **others}


# FedAvg's rates for the package's own tasks: Synthetic's found here (see
# README); the partitioned image tasks borrow EMNIST's (AdaBest's and GeL's
# families have their own defaults).
_OWN_TASK_FEDAVG_RATES = {
    **{task: (1.0, 0.1) for task in (
        'synthetic', 'emnist_l', 'cifar10', 'cifar100_partitioned',
        'synthetic_partitioned', 'digits')},
    # LEAF's Shakespeare: GeL's Table 5, FedAvg's best client rate on it
    # (server SGD 1), tuned by that paper on its grid, not here.
    'leaf_shakespeare': (1.0, 0.8)}
# Synthetic's rates of FedAdam, FedLARS and FedLamb, tuned as the paper tuned
# EMNIST's: the best mean final validation accuracy over 3 seeds at M = 10
# (`python -m reproduce large_cohort table_rates`,
# results/large_cohort/table_rates/README.md).
_ADAM_RATES = _paper((0.01, 0.1), (0.001, 0.1), (0.01, 10.0), (1.0, 10.0),
                     synthetic=(0.1, 0.1))

OPTIMIZERS: dict[str, OptimizerEntry] = {e.name: e for e in (
    OptimizerEntry(
        'sgd', lambda lr: tff.learning.optimizers.build_sgdm(lr), (),
        'FedAvg', _paper((1.0, 0.1), (1.0, 0.1), (1.0, 1.0), (1.0, 10.0),
                         **_OWN_TASK_FEDAVG_RATES)),
    OptimizerEntry(
        'sgdm', tff.learning.optimizers.build_sgdm, ('momentum',),
        'FedAvgM', _paper((1.0, 0.1), (1.0, 0.1), (0.1, 1.0), (1.0, 10.0))),
    OptimizerEntry(
        'adagrad', lambda lr, epsilon: tff.learning.optimizers.build_adagrad(
            lr, initial_preconditioner_value=0.0, epsilon=epsilon),
        ('epsilon',), 'FedAdagrad',
        _paper((0.01, 0.1), (0.1, 0.001), (0.1, 10.0), (10.0, 10.0))),
    OptimizerEntry(
        'adam', tff.learning.optimizers.build_adam,
        ('beta_1', 'beta_2', 'epsilon'), 'FedAdam', _ADAM_RATES),
    # Not in the paper's table: Adam with another second moment, so it
    # takes Adam's rates.
    OptimizerEntry(
        'yogi', lambda lr, **kw: tff.learning.optimizers.build_yogi(
            lr, initial_preconditioner_value=0.0, **kw),
        ('beta_1', 'beta_2', 'epsilon'), 'FedYogi', _ADAM_RATES),
    OptimizerEntry(
        'lars', lars.build_lars, ('momentum', 'epsilon'), 'FedLARS',
        _paper((0.01, 0.1), (0.001, 0.1), (0.01, 10.0), (0.01, 1.0),
               synthetic=(0.01, 0.1))),
    OptimizerEntry(
        'lamb', lamb.build_lamb, ('beta_1', 'beta_2', 'epsilon'), 'FedLamb',
        _paper((0.001, 0.01), (0.01, 0.1), (0.01, 10.0), (0.01, 10.0),
               synthetic=(0.01, 0.1))),
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
