"""What the package knows about a task, as data: `TaskRecord` and `TaskFlag`.

`tasks.TASKS` holds one `TaskRecord` per task. The driver derives from the
records everything it does per task: the `--task` choices, the task's own
flags (`TaskFlag`: defined once here, refused for the tasks that do not take
them, recorded in hparams.json with the value an unset flag means, passed to
the task's builder), the batch size and epochs an algorithm uses by default,
the metric the papers call accuracy, and which data flags apply.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class TaskFlag:
  """A driver flag that only some tasks take: `--<name>`, passed to their
  builders as the keyword `argument`.

  Attributes:
    name: The flag's name (prefixed by the task's, unless several tasks
      share it).
    argument: The builder's keyword argument it sets.
    type: `int`, `float` or `str` (then one of `choices`).
    help: The flag's help.
    example: A value other than the flag's default, as typed on a command
      line (the flag tests give it, and must see the task change).
    flag_default: The flag's own default (None: unset).
    default: What an unset flag means, recorded in hparams.json as the run's
      value and passed to the builder; None: the flag's value is recorded as
      it is, and an unset flag is not passed (the builder's default holds).
    choices: For `str`, the values allowed.
    lower_bound: For numbers, the least value allowed (inclusive).
    upper_bound: For numbers, the greatest value allowed (inclusive).
    greater_than: For numbers, an exclusive lower bound (e.g. 0: > 0).
    needs: Another flag of the task that must be set (not None or 0) for
      this one to be used, and why; otherwise this one is refused.
  """

  name: str
  argument: str
  type: type
  help: str
  example: str
  flag_default: Any = None
  default: Any = None
  choices: tuple[str, ...] = ()
  lower_bound: Optional[float] = None
  upper_bound: Optional[float] = None
  greater_than: Optional[float] = None
  needs: Optional[tuple[str, str]] = None

  def __post_init__(self):
    if self.type not in (int, float, str):
      raise TypeError(f'TaskFlag {self.name!r}: type must be int, float or'
                      f' str, got {self.type!r}')
    if (self.type is str) != bool(self.choices):
      raise ValueError(f'TaskFlag {self.name!r}: a str flag has choices, a'
                       ' number has none')


@dataclasses.dataclass(frozen=True)
class TaskRecord:
  """Everything the package knows about one task, in one place.

  Attributes:
    builder: `(**kwargs) -> BaselineTask`, taking the common arguments
      (`train_batch_size`, `eval_batch_size`, `num_epochs`,
      `max_elements_per_client`, `data_dir`, `use_synthetic_data`,
      `validation_fraction`, `seed`) plus the `argument` of each of `flags`.
    train_batch_size: The papers' client batch size (SPEC.md §1-§3).
    client_epochs: Local epochs per round: 1 in the large-cohort paper, 5 in
      AdaBest.
    accuracy_metric: The model metric the papers call "accuracy".
    reads_files: Whether the data come from files (`data_dir`) that TFF's
      small synthetic stand-in (`use_synthetic_data`) can replace; False for
      data generated in memory.
    downloads: Whether its files are fetched on first use (TFF's datasets:
      `tasks.data_files`; TFDS's: `tasks.centralized_images`).
    partition_of: For AdaBest's partitioned tasks, the centralized dataset
      partitioned (a `partitioned_task.DATASET_SETTINGS` name); the
      validation clients are then fixed at 10 %, so `validation_fraction`
      and `max_elements_per_client` do not apply. None: a federated dataset.
    flags: The task's own driver flags.
    prepare: For a task that fetches its files itself (not TFF's or TFDS's
      loaders), `(data_dir) -> paths`: fetches and checks them
      (`tasks.prepare_data`); None: the loaders' files are known to
      `tasks.prepare_data`.
  """

  builder: Callable[..., tff.simulation.baselines.BaselineTask]
  train_batch_size: int
  client_epochs: int
  accuracy_metric: str
  reads_files: bool
  downloads: bool = False
  partition_of: Optional[str] = None
  flags: tuple[TaskFlag, ...] = ()
  prepare: Optional[Callable[[Optional[str]], list[str]]] = None

  @property
  def partitioned(self) -> bool:
    """Whether it is one of AdaBest's partitioned tasks."""
    return self.partition_of is not None


def flags_by_name(records: dict[str, TaskRecord]) -> dict[str, TaskFlag]:
  """Every task flag by name, once; `ValueError` if two tasks declare one
  name differently (a flag has one meaning)."""
  found: dict[str, TaskFlag] = {}
  for task_name, record in records.items():
    for flag in record.flags:
      if found.setdefault(flag.name, flag) != flag:
        raise ValueError(f'task {task_name!r} declares --{flag.name} unlike'
                         ' another task does')
  return found


def builder_arguments(record: TaskRecord, values: dict[str, Any],
                      unused: set[str]) -> dict[str, Any]:
  """The builder's keyword arguments from the task's flags: each flag in
  use, at its value or, unset, at its `default`; unset without a default,
  not passed.

  Args:
    record: The task's record.
    values: The flags' values by name.
    unused: The names of the flags the run does not use.
  """
  arguments = {}
  for flag in record.flags:
    if flag.name in unused:
      continue
    value = values[flag.name]
    if value is None:
      value = flag.default
    if value is not None:
      arguments[flag.argument] = value
  return arguments
