"""Checks the task test modules run on their tasks.

Not a test module: test modules import it (`from tests import task_checks`).
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import errors
from tasks import validation_split


def variable_shapes(task: tff.simulation.baselines.BaselineTask
                    ) -> list[list[int]]:
  """The shapes of the task model's trainable variables, in order."""
  with tf.Graph().as_default():
    return [v.shape.as_list() for v in task.model_fn().trainable_variables]


class FedAvgRun(NamedTuple):
  """What `train_fedavg` reports."""

  train_metrics: list[Any]  # per round: `metrics['client_work']['train']`
  initial_weights: Any  # trainable weights before the first round
  final_weights: Any  # trainable weights after the last round


def train_fedavg(task: tff.simulation.baselines.BaselineTask,
                 client_ids: Sequence[str], client_learning_rate: float,
                 num_rounds: int = 2) -> FedAvgRun:
  """Runs TFF's weighted FedAvg (client SGD) on `client_ids` every round.

  Each client's data go through the task's `train_preprocess_fn`.
  """
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          client_learning_rate),
  )
  state = process.initialize()
  initial_weights = process.get_model_weights(state).trainable
  train_metrics = []
  for _ in range(num_rounds):
    datasets = [
        task.datasets.train_preprocess_fn(
            task.datasets.train_data.create_tf_dataset_for_client(client_id)
        )
        for client_id in client_ids
    ]
    output = process.next(state, datasets)
    state = output.state
    train_metrics.append(output.metrics['client_work']['train'])
  return FedAvgRun(train_metrics, initial_weights,
                   process.get_model_weights(state).trainable)


def assert_model_changed(run: FedAvgRun) -> None:
  """Fails unless some trainable weight differs after training."""
  assert any(
      not np.allclose(before, after)
      for before, after in zip(run.initial_weights, run.final_weights)
  )


def assert_seeded_validation_split(
    task: tff.simulation.baselines.BaselineTask,
    all_client_ids: Sequence[str], validation_fraction: float,
    seed: int) -> None:
  """Fails unless `task`'s train/validation clients are the seeded split.

  The split must be `validation_split.split_client_ids` of `all_client_ids`,
  with at least one validation client, no client in both and none lost.
  """
  train_ids = task.datasets.train_data.client_ids
  validation_ids = task.datasets.validation_data.client_ids
  assert (train_ids, validation_ids) == validation_split.split_client_ids(
      all_client_ids, validation_fraction, seed=seed
  )
  assert validation_ids and not set(train_ids) & set(validation_ids)
  assert sorted(train_ids + validation_ids) == sorted(all_client_ids)


def missing_data_message(
    create_task: Callable[..., tff.simulation.baselines.BaselineTask],
    data_dir: Any) -> str:
  """The one-line `MissingDataError` of `create_task(data_dir=data_dir)`."""
  with pytest.raises(errors.MissingDataError) as raised:
    create_task(data_dir=str(data_dir))
  message = str(raised.value)
  assert '\n' not in message
  return message
