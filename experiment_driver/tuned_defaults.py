"""Tuned learning rates of SPEC.md §1 (the paper's Table 3/4, tuned at M = 10).

`(server_lr, client_lr)` by task and server optimizer, from the optimizer
registry (`fl_common.optimizers.OPTIMIZERS`, each entry's
`tuned_rates`). The paper's algorithm names map to server optimizers:
FedAvg = sgd, FedAvgM = sgdm, FedAdagrad = adagrad, FedAdam = adam, FedLARS
= lars, FedLamb = lamb; FedSGD has only a server rate (its client rate is 1,
one full-batch step). A task and optimizer without tuned rates is an error
(`MissingTunedRateError`): the run must give its rates.
"""

from fl_common import optimizers

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
  rates = optimizers.OPTIMIZERS[server_optimizer].tuned_rates
  if task not in rates:
    raise MissingTunedRateError(
        f'no tuned rates for --server_optimizer={server_optimizer} on'
        f' --task={task} (tuned: {", ".join(sorted(rates))}): give'
        ' --server_learning_rate and --client_learning_rate')
  return rates[task]
