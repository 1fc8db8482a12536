"""The package's tasks, by name: each a `tff.simulation.baselines.BaselineTask`.

`TASKS` maps a task name to its `TaskRecord`: its builder (every builder takes
the same keyword arguments plus its own extras), batch size, epochs, accuracy
metric and what kind of data it reads. Add a task by adding one record.
Paper-specific settings per task (tuned learning rates, GeL's budgets) live
with the algorithms that use them.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

import dataclasses
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
    model: Optional[str] = None,
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
      use_mock_data=use_synthetic_data, model=model)


# AdaBest's data protocol (SPEC.md §2): centralized datasets partitioned over
# --num_clients clients (IID or Dirichlet, balanced or log-normal sizes).
PARTITIONED_TASKS = {
    'emnist_l': 'emnist_l',
    'cifar10': 'cifar10',
    'cifar100_partitioned': 'cifar100',
    'synthetic_partitioned': 'synthetic',
    'digits': 'digits',
}


@dataclasses.dataclass(frozen=True)
class TaskRecord:
  """Everything the package knows about one task, in one place.

  Attributes:
    builder: `(**kwargs) -> BaselineTask`, taking the common arguments
      (`train_batch_size`, `eval_batch_size`, `num_epochs`,
      `max_elements_per_client`, `data_dir`, `use_synthetic_data`,
      `validation_fraction`, `seed`) plus, for partitioned tasks,
      `num_clients`, `dirichlet_alpha`, `unbalanced_sigma`, `partition_seed`
      and `model` (None: the paper's; 'digits' also has 'cnn').
    train_batch_size: The papers' client batch size (SPEC.md §1-§3).
    client_epochs: Local epochs per round: 1 in the large-cohort paper, 5 in
      AdaBest.
    accuracy_metric: The model metric the papers call "accuracy".
    reads_files: Whether the data come from files (`data_dir`) that TFF's
      small synthetic stand-in (`use_synthetic_data`) can replace; False for
      data generated in memory.
    downloads: Whether its files are fetched on first use (TFF's datasets:
      `tasks.data_files`; TFDS's: `tasks.centralized_images`).
    partitioned: Whether it is one of AdaBest's partitioned centralized
      datasets (the partition arguments apply; the validation clients are
      fixed at 10 %, so `validation_fraction` and `max_elements_per_client`
      do not).
  """

  builder: Callable[..., tff.simulation.baselines.BaselineTask]
  train_batch_size: int
  client_epochs: int
  accuracy_metric: str
  reads_files: bool
  downloads: bool = False
  partitioned: bool = False


def _partitioned_record(dataset: str) -> TaskRecord:
  return TaskRecord(
      builder=functools.partial(_create_partitioned, dataset),
      train_batch_size=partitioned_task.DEFAULT_BATCH_SIZE,
      client_epochs=partitioned_task.DEFAULT_NUM_EPOCHS,
      accuracy_metric=partitioned_task.ACCURACY_METRIC_NAME,
      reads_files=dataset not in ('synthetic', 'digits'),
      downloads=dataset not in ('synthetic', 'digits'),
      partitioned=True)


TASKS: dict[str, TaskRecord] = {
    'cifar100': TaskRecord(
        cifar100.create_cifar100_task, cifar100.DEFAULT_TRAIN_BATCH_SIZE, 1,
        cifar100.ACCURACY_METRIC_NAME, reads_files=True, downloads=True),
    'emnist': TaskRecord(
        emnist.create_emnist_task, emnist.DEFAULT_TRAIN_BATCH_SIZE, 1,
        emnist.ACCURACY_METRIC_NAME, reads_files=True, downloads=True),
    'shakespeare': TaskRecord(
        shakespeare.create_shakespeare_task,
        shakespeare.DEFAULT_TRAIN_BATCH_SIZE, 1,
        shakespeare.ACCURACY_METRIC_NAME, reads_files=True, downloads=True),
    'stackoverflow': TaskRecord(
        stackoverflow.create_stackoverflow_task,
        stackoverflow.DEFAULT_TRAIN_BATCH_SIZE, 1,
        stackoverflow.ACCURACY_METRIC_NAME, reads_files=True,
        downloads=True),
    'synthetic': TaskRecord(
        synthetic.create_synthetic_task, synthetic.DEFAULT_TRAIN_BATCH_SIZE, 1,
        synthetic.ACCURACY_METRIC_NAME, reads_files=False),
    **{name: _partitioned_record(dataset)
       for name, dataset in PARTITIONED_TASKS.items()},
}
TASK_NAMES = tuple(TASKS)

__all__ = [
    'MissingDataError',
    'PARTITIONED_TASKS',
    'TASKS',
    'TASK_NAMES',
    'TaskRecord',
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
  if name not in TASKS:
    raise ValueError(
        f'unknown task {name!r}; valid names: {", ".join(TASK_NAMES)}'
    )
  return TASKS[name].builder(**kwargs)
