"""tasks.shakespeare: SPEC.md's character LSTM, offline checks, validation."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import errors
from tasks import shakespeare
from tasks import validation_split


def _variable_shapes(task):
  with tf.Graph().as_default():
    return [v.shape.as_list() for v in task.model_fn().trainable_variables]


def test_model_is_specs_two_layer_lstm_over_90_characters():
  task = shakespeare.create_shakespeare_task(
      use_synthetic_data=True, validation_fraction=0.0
  )
  lstm_gates = 4 * 256
  assert _variable_shapes(task) == [
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
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
  )
  state = process.initialize()
  initial_weights = process.get_model_weights(state).trainable
  client_ids = task.datasets.train_data.client_ids[:2]
  for _ in range(2):
    datasets = [
        task.datasets.train_preprocess_fn(
            task.datasets.train_data.create_tf_dataset_for_client(client_id)
        )
        for client_id in client_ids
    ]
    output = process.next(state, datasets)
    state = output.state
    train_metrics = output.metrics['client_work']['train']
    assert shakespeare.ACCURACY_METRIC_NAME in train_metrics
    assert train_metrics['num_tokens'] > 0
    assert np.isfinite(train_metrics['loss'])
  final_weights = process.get_model_weights(state).trainable
  assert any(
      not np.allclose(before, after)
      for before, after in zip(initial_weights, final_weights)
  )


def test_validation_split_is_the_seeded_client_split():
  task = shakespeare.create_shakespeare_task(
      use_synthetic_data=True, validation_fraction=0.34, seed=1
  )
  all_ids = tff.simulation.datasets.shakespeare.get_synthetic().client_ids
  train_ids = task.datasets.train_data.client_ids
  validation_ids = task.datasets.validation_data.client_ids
  assert (train_ids, validation_ids) == validation_split.split_client_ids(
      all_ids, 0.34, seed=1
  )
  assert validation_ids and not set(train_ids) & set(validation_ids)
  assert sorted(train_ids + validation_ids) == sorted(all_ids)


def test_missing_data_is_one_line_naming_the_file_and_writes_nothing(
    tmp_path,
):
  with pytest.raises(errors.MissingDataError) as raised:
    shakespeare.create_shakespeare_task(data_dir=str(tmp_path))
  message = str(raised.value)
  assert '\n' not in message
  assert str(tmp_path / 'shakespeare.sqlite') in message
  assert not os.listdir(tmp_path)
