"""tasks.shakespeare: SPEC.md's character LSTM, offline checks, validation."""

import os

import numpy as np
import tensorflow_federated as tff

from tasks import shakespeare
from tests import task_checks


def test_model_is_specs_two_layer_lstm_over_90_characters():
  task = shakespeare.create_shakespeare_task(
      use_synthetic_data=True, validation_fraction=0.0
  )
  lstm_gates = 4 * 256
  assert task_checks.variable_shapes(task) == [
      [90, 8],  # embedding 8 over the 90-token vocabulary
      [8, lstm_gates], [256, lstm_gates], [lstm_gates],  # LSTM 256
      [256, lstm_gates], [256, lstm_gates], [lstm_gates],  # LSTM 256
      [256, 90], [90],  # logits
  ]
  inputs, targets = task.datasets.element_type_structure
  assert inputs.shape.as_list() == [None, 80]
  assert targets.shape.as_list() == [None, 80]


def test_fedavg_trains_two_rounds_on_two_clients():
  task = shakespeare.create_shakespeare_task(
      train_batch_size=2,
      max_elements_per_client=2,
      use_synthetic_data=True,
      validation_fraction=0.0,
  )
  run = task_checks.train_fedavg(
      task, task.datasets.train_data.client_ids[:2], client_learning_rate=0.5
  )
  for train_metrics in run.train_metrics:
    assert shakespeare.ACCURACY_METRIC_NAME in train_metrics
    assert train_metrics['num_tokens'] > 0
    assert np.isfinite(train_metrics['loss'])
  task_checks.assert_model_changed(run)


def test_validation_split_is_the_seeded_client_split():
  task = shakespeare.create_shakespeare_task(
      use_synthetic_data=True, validation_fraction=0.34, seed=1
  )
  task_checks.assert_seeded_validation_split(
      task, tff.simulation.datasets.shakespeare.get_synthetic().client_ids,
      0.34, seed=1
  )


def test_missing_data_is_one_line_naming_the_file_and_writes_nothing(
    tmp_path,
):
  message = task_checks.missing_data_message(
      shakespeare.create_shakespeare_task, tmp_path
  )
  assert str(tmp_path / 'shakespeare.sqlite') in message
  assert not os.listdir(tmp_path)
