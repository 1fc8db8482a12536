"""Tuned learning rates of SPEC.md §1 (the paper's Table 3/4, tuned at M = 10).

`(server_lr, client_lr)` keyed by task and server optimizer. The paper's
algorithm names map to server optimizers: FedAvg = sgd, FedAvgM = sgdm,
FedAdagrad = adagrad, FedAdam = adam, FedLARS = lars, FedLamb = lamb; FedSGD
has only a server rate (its client rate is 1, one full-batch step).
"""

_PAPER_RATES = {
    #             cifar100        emnist          shakespeare    stackoverflow
    'sgd':     {'cifar100': (1.0, 0.1), 'emnist': (1.0, 0.1),
                'shakespeare': (1.0, 1.0), 'stackoverflow': (1.0, 10.0)},
    'sgdm':    {'cifar100': (1.0, 0.1), 'emnist': (1.0, 0.1),
                'shakespeare': (0.1, 1.0), 'stackoverflow': (1.0, 10.0)},
    'adagrad': {'cifar100': (0.01, 0.1), 'emnist': (0.1, 0.001),
                'shakespeare': (0.1, 10.0), 'stackoverflow': (10.0, 10.0)},
    'adam':    {'cifar100': (0.01, 0.1), 'emnist': (0.001, 0.1),
                'shakespeare': (0.01, 10.0), 'stackoverflow': (1.0, 10.0)},
    'lars':    {'cifar100': (0.01, 0.1), 'emnist': (0.001, 0.1),
                'shakespeare': (0.01, 10.0), 'stackoverflow': (0.01, 1.0)},
    'lamb':    {'cifar100': (0.001, 0.01), 'emnist': (0.01, 0.1),
                'shakespeare': (0.01, 10.0), 'stackoverflow': (0.01, 10.0)},
}
_FEDSGD_SERVER_RATES = {
    'cifar100': 0.1, 'emnist': 0.1, 'shakespeare': 1.0, 'stackoverflow': 10.0,
}
# Tasks outside the paper: FedAvg rates found for them here (see README).
_OTHER_TASK_RATES = {
    'synthetic': (1.0, 0.1),
}
_FALLBACK_RATES = (1.0, 0.1)
# Yogi is not in the paper's table; it is Adam with a different second moment,
# so it takes Adam's rates.
_OPTIMIZER_ROW_ALIASES = {'yogi': 'adam'}


def learning_rates(
    task: str, server_optimizer: str, fedsgd: bool = False
) -> tuple[float, float]:
  """Returns the tuned `(server_lr, client_lr)` for a task and optimizer.

  Args:
    task: A task name (`tasks.TASK_NAMES`).
    server_optimizer: The server optimizer's name (sgd, sgdm, adagrad, adam,
      yogi, lars, lamb).
    fedsgd: Whether the process is FedSGD (client rate 1, SPEC.md §1).
  """
  if fedsgd:
    return _FEDSGD_SERVER_RATES.get(task, _FALLBACK_RATES[1]), 1.0
  row = _PAPER_RATES.get(_OPTIMIZER_ROW_ALIASES.get(server_optimizer,
                                                   server_optimizer), {})
  if task in row:
    return row[task]
  return _OTHER_TASK_RATES.get(task, _FALLBACK_RATES)

