"""Every tuned learning rate, in one place (SPEC.md §1, the papers' tables
and the rates tuned here).

`TUNED_RATES[server optimizer][task]` is `(server_lr, client_lr)`: the
large-cohort paper's Tables 3-4 (tuned at M = 10) for its four tasks, and
the rates found here for the package's own tasks. `FEDSGD_SERVER_RATES`
holds FedSGD's server rate (Table 4; its client rate is 1, one full-batch
step). The paper's algorithm names map to server optimizers: FedAvg = sgd,
FedAvgM = sgdm, FedAdagrad = adagrad, FedAdam = adam, FedLARS = lars,
FedLamb = lamb. A task and optimizer without tuned rates is an error
(`MissingTunedRateError`): the run must give its rates. A new optimizer
or task stays out until its rates are tuned, on validation clients.
(AdaBest's and GeL's families keep their papers' defaults in their
`*_setup.py`.)
"""


# The paper's tuned rates (Tables 3-4), by the paper's tasks.
def _paper(cifar100, emnist, shakespeare, stackoverflow, **others):
  return {'cifar100': cifar100, 'emnist': emnist, 'shakespeare': shakespeare,
          'stackoverflow': stackoverflow, **others}


# FedAvg's rates for the package's own tasks: Synthetic's found here (see
# README); the partitioned image tasks borrow EMNIST's.
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

TUNED_RATES: dict[str, dict[str, tuple[float, float]]] = {
    'sgd': _paper((1.0, 0.1), (1.0, 0.1), (1.0, 1.0), (1.0, 10.0),
                  **_OWN_TASK_FEDAVG_RATES),
    'sgdm': _paper((1.0, 0.1), (1.0, 0.1), (0.1, 1.0), (1.0, 10.0)),
    'adagrad': _paper((0.01, 0.1), (0.1, 0.001), (0.1, 10.0), (10.0, 10.0)),
    'adam': _ADAM_RATES,
    # Not in the paper's table: Adam with another second moment, so it takes
    # Adam's rates.
    'yogi': _ADAM_RATES,
    'lars': _paper((0.01, 0.1), (0.001, 0.1), (0.01, 10.0), (0.01, 1.0),
                   synthetic=(0.01, 0.1)),
    'lamb': _paper((0.001, 0.01), (0.01, 0.1), (0.01, 10.0), (0.01, 10.0),
                   synthetic=(0.01, 0.1)),
}

# FedSGD's server rates (Table 4), and FedAvg's for the package's own tasks.
FEDSGD_SERVER_RATES = {
    'cifar100': 0.1, 'emnist': 0.1, 'shakespeare': 1.0, 'stackoverflow': 10.0,
    # The paper's Shakespeare rate for LEAF's version of the same plays.
    'leaf_shakespeare': 1.0,
    **{task: 0.1 for task in (
        'synthetic', 'emnist_l', 'cifar10', 'cifar100_partitioned',
        'synthetic_partitioned', 'digits')},
}


class MissingTunedRateError(ValueError):
  """No tuned rate for a task and optimizer: the run must give one."""


def learning_rates(
    task: str, server_optimizer: str, fedsgd: bool = False
) -> tuple[float, float]:
  """Returns the tuned `(server_lr, client_lr)` for a task and optimizer.

  Args:
    task: A task name (`tasks.TASK_NAMES`).
    server_optimizer: The server optimizer's name
      (`fl_common.optimizers.OPTIMIZER_NAMES`).
    fedsgd: Whether the process is FedSGD (client rate 1, SPEC.md §1).

  Raises:
    MissingTunedRateError: If no rate is tuned for them.
  """
  if fedsgd:
    if task not in FEDSGD_SERVER_RATES:
      raise MissingTunedRateError(
          f'no tuned FedSGD server rate for --task={task}: give'
          ' --server_learning_rate')
    return FEDSGD_SERVER_RATES[task], 1.0
  rates = TUNED_RATES.get(server_optimizer, {})
  if task not in rates:
    raise MissingTunedRateError(
        f'no tuned rates for --server_optimizer={server_optimizer} on'
        f' --task={task} (tuned: {", ".join(sorted(rates))}): give'
        ' --server_learning_rate and --client_learning_rate')
  return rates[task]
