"""The package's tasks, by name: each a `tff.simulation.baselines.BaselineTask`.

`TASK_BUILDERS` maps a task name to its builder; every builder takes the same
keyword arguments (`train_batch_size`, `eval_batch_size`, `num_epochs`,
`max_elements_per_client`, `data_dir`, `use_synthetic_data`,
`validation_fraction`, `seed`) plus its own extras. Add a task by adding an
entry to `TASK_BUILDERS`, `DEFAULT_TRAIN_BATCH_SIZE` and
`ACCURACY_METRIC_NAME`.
"""

from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from tasks import cifar100
from tasks import emnist
from tasks import shakespeare
from tasks import stackoverflow
from tasks import synthetic
from tasks.errors import MissingDataError

TASK_BUILDERS: dict[
    str, Callable[..., tff.simulation.baselines.BaselineTask]
] = {
    'cifar100': cifar100.create_cifar100_task,
    'emnist': emnist.create_emnist_task,
    'shakespeare': shakespeare.create_shakespeare_task,
    'stackoverflow': stackoverflow.create_stackoverflow_task,
    'synthetic': synthetic.create_synthetic_task,
}
TASK_NAMES = tuple(TASK_BUILDERS)
# SPEC.md §1 (large-cohort paper, Table 2) and §3 (GeL: 5 for Synthetic).
DEFAULT_TRAIN_BATCH_SIZE: dict[str, int] = {
    'cifar100': cifar100.DEFAULT_TRAIN_BATCH_SIZE,
    'emnist': emnist.DEFAULT_TRAIN_BATCH_SIZE,
    'shakespeare': shakespeare.DEFAULT_TRAIN_BATCH_SIZE,
    'stackoverflow': stackoverflow.DEFAULT_TRAIN_BATCH_SIZE,
    'synthetic': synthetic.DEFAULT_TRAIN_BATCH_SIZE,
}
# The metric (of the task model's metrics) the papers call "accuracy".
ACCURACY_METRIC_NAME: dict[str, str] = {
    'cifar100': cifar100.ACCURACY_METRIC_NAME,
    'emnist': emnist.ACCURACY_METRIC_NAME,
    'shakespeare': shakespeare.ACCURACY_METRIC_NAME,
    'stackoverflow': stackoverflow.ACCURACY_METRIC_NAME,
    'synthetic': synthetic.ACCURACY_METRIC_NAME,
}

__all__ = [
    'ACCURACY_METRIC_NAME',
    'DEFAULT_TRAIN_BATCH_SIZE',
    'MissingDataError',
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
