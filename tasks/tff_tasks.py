"""What the tasks built on TFF's simulation datasets and baselines share.

Every task turns the same batch, epoch and per-client cap arguments into TFF's
train and eval `ClientSpec`s (`client_specs`). EMNIST, Shakespeare and
CIFAR-100 are TFF baseline tasks on one cached SQLite file each, with
`validation_fraction` of their training clients held out for validation
(SPEC.md §1's 80/20): `create_offline_task` builds such a task without ever
downloading.
"""

import contextlib
from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tasks import data_files
from tasks import validation_split


def client_specs(
    train_batch_size: int,
    eval_batch_size: int,
    num_epochs: int,
    max_elements_per_client: Optional[int],
) -> tuple[tff.simulation.baselines.ClientSpec,
           tff.simulation.baselines.ClientSpec]:
  """TFF's `(train, eval)` client specs of a task.

  Training runs `num_epochs` epochs in batches of `train_batch_size`, capped
  at `max_elements_per_client` examples (TFF's `ClientSpec.max_elements`,
  applied after shuffling and repeating; `None`: no cap). Evaluation runs one
  unshuffled epoch in batches of `eval_batch_size`.

  Raises:
    ValueError: A batch size, `num_epochs` or `max_elements_per_client` is
      not positive.
  """
  train_client_spec = tff.simulation.baselines.ClientSpec(
      num_epochs=num_epochs,
      batch_size=train_batch_size,
      max_elements=max_elements_per_client,
  )
  eval_client_spec = tff.simulation.baselines.ClientSpec(
      num_epochs=1, batch_size=eval_batch_size, shuffle_buffer_size=1
  )
  return train_client_spec, eval_client_spec


def create_offline_task(
    create_tff_task: Callable[[], tff.simulation.baselines.BaselineTask],
    *,
    dataset_name: str,
    sqlite_filename: str,
    loader_call: str,
    data_dir: Optional[str],
    use_synthetic_data: bool,
    validation_fraction: float,
    seed: int,
) -> tff.simulation.baselines.BaselineTask:
  """Runs a TFF task builder offline, then holds out validation clients.

  Args:
    create_tff_task: Builds the task with TFF's loader (which reads
      `sqlite_filename` from `data_dir` unless `use_synthetic_data`).
    dataset_name: The dataset's name, for the missing-data message.
    sqlite_filename: The file TFF caches the dataset as.
    loader_call: The TFF call that downloads the file, with the cache
      directory written as `DIR`, for the missing-data message.
    data_dir: TFF's `cache_dir`; `None`: TFF's default, `~/.tff`.
    use_synthetic_data: Whether the builder uses TFF's synthetic data (then
      no file is needed).
    validation_fraction: Fraction of training clients held out as validation
      clients, in [0, 1).
    seed: Seed of the validation split.

  Raises:
    MissingDataError: `data_dir` does not hold `sqlite_filename`.
    ValueError: `validation_fraction` is not in [0, 1).
  """
  cached_files_check = (
      contextlib.nullcontext()
      if use_synthetic_data
      else data_files.require_tff_cached_file(
          dataset_name, sqlite_filename, data_dir, loader_call
      )
  )
  with cached_files_check:
    task = create_tff_task()
  return validation_split.add_validation_clients(
      task, validation_fraction, seed
  )
