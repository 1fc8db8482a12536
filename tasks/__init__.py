"""The package's tasks, by name: each a `tff.simulation.baselines.BaselineTask`.

`TASK_BUILDERS` maps a task name to its builder; every builder takes the same
keyword arguments (`train_batch_size`, `eval_batch_size`, `num_epochs`,
`max_elements_per_client`, `data_dir`, `use_synthetic_data`,
`validation_fraction`, `seed`) plus its own extras. Add a task by adding an
entry to `TASK_BUILDERS`, `DEFAULT_TRAIN_BATCH_SIZE` and
`ACCURACY_METRIC_NAME`.
"""

import functools
from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from tasks import cifar100
from tasks import emnist
from tasks import partitioned_task
from tasks import shakespeare
from tasks import stackoverflow
from tasks import synthetic
from tasks.errors import MissingDataError



def _create_partitioned(
    dataset: str,
    *,
    train_batch_size: int = partitioned_task.DEFAULT_BATCH_SIZE,
    eval_batch_size: int = partitioned_task.DEFAULT_EVAL_BATCH_SIZE,
    num_epochs: int = partitioned_task.DEFAULT_NUM_EPOCHS,
    max_elements_per_client: Optional[int] = None,
    data_dir: Optional[str] = None,
    use_synthetic_data: bool = False,
    validation_fraction: float = 0.1,
    seed: int = 0,
    num_clients: int = 100,
    dirichlet_alpha: Optional[float] = None,
    unbalanced_sigma: float = 0.0,
    partition_seed: int = 0,
) -> tff.simulation.baselines.BaselineTask:
  """The common task arguments mapped onto AdaBest's partitioned tasks.

  AdaBest's protocol fixes the validation clients at 10 % of `num_clients`
  (`validation_fraction` is not used) and trains on whole client datasets;
  `use_synthetic_data` means TFDS mock images; the partition, not `seed`, is
  seeded by `partition_seed`.
  """
  del validation_fraction, seed
  if max_elements_per_client is not None:
    raise ValueError('--max_elements_per_client is not supported by the'
                     f' partitioned task {dataset!r}')
  return partitioned_task.create_partitioned_task(
      dataset, num_clients=num_clients, dirichlet_alpha=dirichlet_alpha,
      unbalanced_sigma=unbalanced_sigma, partition_seed=partition_seed,
      batch_size=train_batch_size, num_epochs=num_epochs,
      eval_batch_size=eval_batch_size, data_dir=data_dir,
      use_mock_data=use_synthetic_data)


# AdaBest's data protocol (SPEC.md §2): centralized datasets partitioned over
# --num_clients clients (IID or Dirichlet, balanced or log-normal sizes).
PARTITIONED_TASKS = {
    'emnist_l': 'emnist_l',
    'cifar10': 'cifar10',
    'cifar100_partitioned': 'cifar100',
    'synthetic_partitioned': 'synthetic',
}
TASK_BUILDERS: dict[
    str, Callable[..., tff.simulation.baselines.BaselineTask]
] = {
    'cifar100': cifar100.create_cifar100_task,
    'emnist': emnist.create_emnist_task,
    'shakespeare': shakespeare.create_shakespeare_task,
    'stackoverflow': stackoverflow.create_stackoverflow_task,
    'synthetic': synthetic.create_synthetic_task,
    **{name: functools.partial(_create_partitioned, dataset)
       for name, dataset in PARTITIONED_TASKS.items()},
}
TASK_NAMES = tuple(TASK_BUILDERS)
# SPEC.md §1 (large-cohort paper, Table 2) and §3 (GeL: 5 for Synthetic).
DEFAULT_TRAIN_BATCH_SIZE: dict[str, int] = {
    'cifar100': cifar100.DEFAULT_TRAIN_BATCH_SIZE,
    'emnist': emnist.DEFAULT_TRAIN_BATCH_SIZE,
    'shakespeare': shakespeare.DEFAULT_TRAIN_BATCH_SIZE,
    'stackoverflow': stackoverflow.DEFAULT_TRAIN_BATCH_SIZE,
    'synthetic': synthetic.DEFAULT_TRAIN_BATCH_SIZE,
    **{name: partitioned_task.DEFAULT_BATCH_SIZE for name in PARTITIONED_TASKS},
}
# Local epochs per round: 1 in the large-cohort paper, 5 in AdaBest.
DEFAULT_CLIENT_EPOCHS: dict[str, int] = {
    **{name: 1 for name in ('cifar100', 'emnist', 'shakespeare',
                            'stackoverflow', 'synthetic')},
    **{name: partitioned_task.DEFAULT_NUM_EPOCHS for name in PARTITIONED_TASKS},
}
# The metric (of the task model's metrics) the papers call "accuracy".
ACCURACY_METRIC_NAME: dict[str, str] = {
    'cifar100': cifar100.ACCURACY_METRIC_NAME,
    'emnist': emnist.ACCURACY_METRIC_NAME,
    'shakespeare': shakespeare.ACCURACY_METRIC_NAME,
    'stackoverflow': stackoverflow.ACCURACY_METRIC_NAME,
    'synthetic': synthetic.ACCURACY_METRIC_NAME,
    **{name: partitioned_task.ACCURACY_METRIC_NAME for name in PARTITIONED_TASKS},
}

__all__ = [
    'ACCURACY_METRIC_NAME',
    'DEFAULT_CLIENT_EPOCHS',
    'DEFAULT_TRAIN_BATCH_SIZE',
    'MissingDataError',
    'PARTITIONED_TASKS',
    'TASK_BUILDERS',
    'TASK_NAMES',
    'create_task',
]


def create_task(
    name: str, **kwargs: Any
) -> tff.simulation.baselines.BaselineTask:
  """Builds the task called `name` with its builder's keyword arguments.

  Args:
    name: One of `TASK_NAMES`.
    **kwargs: Passed to the task's builder (e.g. `train_batch_size`,
      `data_dir`, `use_synthetic_data`, `validation_fraction`, `seed`).

  Raises:
    ValueError: If `name` is not a known task.
    MissingDataError: If the task's data files are not on disk.
  """
  if name not in TASK_BUILDERS:
    raise ValueError(
        f'unknown task {name!r}; valid names: {", ".join(TASK_NAMES)}'
    )
  return TASK_BUILDERS[name](**kwargs)
