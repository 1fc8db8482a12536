"""Holds out a fraction of a task's training clients as validation clients.

SPEC.md §1 (tuning protocol): "for tasks with no validation split, split
*training clients* 80/20 into train/validation". The split is by client (a
validation client's examples are never trained on) and deterministic by seed:
a seeded permutation of the client ids, the first `round(fraction * n)` of
them (at least one, and at least one left to train) held out.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow_federated as tff


def check_validation_fraction(validation_fraction: float) -> None:
  """Raises ValueError unless `validation_fraction` is in [0, 1)."""
  if not 0.0 <= validation_fraction < 1.0:
    raise ValueError(
        'validation_fraction must be in [0, 1), got'
        f' validation_fraction={validation_fraction!r}'
    )


def split_client_ids(
    client_ids: Sequence[str], validation_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
  """Splits `client_ids` into disjoint, sorted (train, validation) id lists.

  Args:
    client_ids: The training clients' ids.
    validation_fraction: The fraction of clients held out, in (0, 1).
    seed: Seed of the permutation (a non-negative 32-bit integer).

  Raises:
    ValueError: If `validation_fraction` is not in (0, 1), or there are fewer
      than two clients.
  """
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(
        'validation_fraction must be in (0, 1) to split, got'
        f' validation_fraction={validation_fraction!r}'
    )
  num_clients = len(client_ids)
  if num_clients < 2:
    raise ValueError(
        f'cannot hold out validation clients from {num_clients} client(s);'
        ' pass validation_fraction=0'
    )
  num_validation_clients = min(
      max(1, round(validation_fraction * num_clients)), num_clients - 1
  )
  order = np.random.RandomState(seed).permutation(num_clients)
  validation_ids = sorted(
      client_ids[i] for i in order[:num_validation_clients]
  )
  train_ids = sorted(client_ids[i] for i in order[num_validation_clients:])
  return train_ids, validation_ids


def split_train_clients(
    train_data: tff.simulation.datasets.ClientData,
    validation_fraction: float,
    seed: int,
) -> tuple[
    tff.simulation.datasets.ClientData, tff.simulation.datasets.ClientData
]:
  """Splits `train_data`'s clients with `split_client_ids`.

  Args:
    train_data: The training clients.
    validation_fraction: The fraction of clients held out, in (0, 1).
    seed: Seed of the split (a non-negative 32-bit integer).

  Returns:
    `(train, validation)` `ClientData`s with disjoint client ids.
  """
  train_ids, validation_ids = split_client_ids(
      train_data.client_ids, validation_fraction, seed
  )
  return tuple(
      tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
          ids, train_data.serializable_dataset_fn
      )
      for ids in (train_ids, validation_ids)
  )


def add_validation_clients(
    task: tff.simulation.baselines.BaselineTask,
    validation_fraction: float,
    seed: int,
) -> tff.simulation.baselines.BaselineTask:
  """Returns `task` with `validation_fraction` of its train clients held out.

  The held-out clients become the task's `validation_data` (evaluated with the
  task's `eval_preprocess_fn`); everything else is unchanged.

  Args:
    task: A task without validation data.
    validation_fraction: Fraction of training clients held out, in [0, 1); 0
      returns `task` unchanged.
    seed: Seed of the split (a non-negative 32-bit integer).

  Raises:
    ValueError: If `validation_fraction` is not in [0, 1), or `task` already
      has validation data.
  """
  check_validation_fraction(validation_fraction)
  if validation_fraction == 0.0:
    return task
  datasets = task.datasets
  if datasets.validation_data is not None:
    raise ValueError('the task already has validation data')
  train_data, validation_data = split_train_clients(
      datasets.train_data, validation_fraction, seed
  )
  split_datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=datasets.test_data,
      validation_data=validation_data,
      train_preprocess_fn=datasets.train_preprocess_fn,
      eval_preprocess_fn=datasets.eval_preprocess_fn,
  )
  return tff.simulation.baselines.BaselineTask(split_datasets, task.model_fn)
