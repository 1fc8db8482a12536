"""tasks.stackoverflow: SPEC.md's word LSTM, first sentences, offline checks."""

import os

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import stackoverflow
from tests import task_checks


def test_model_is_specs_lstm_over_vocab_plus_four_special_tokens():
  task = stackoverflow.create_stackoverflow_task(use_synthetic_data=True)
  # TFF's synthetic word counts hold 60 words; + pad, oov, bos, eos.
  num_synthetic_words = len(
      tff.simulation.datasets.stackoverflow.get_synthetic_word_counts()
  )
  vocab = num_synthetic_words + 4
  lstm_gates = 4 * 670
  assert task_checks.variable_shapes(task) == [
      [vocab, 96],  # embedding 96
      [96, lstm_gates], [670, lstm_gates], [lstm_gates],  # LSTM 670
      [670, 96], [96],  # projection back to 96
      [96, vocab], [vocab],  # logits
  ]
  inputs, targets = task.datasets.element_type_structure
  assert inputs.shape.as_list() == [None, 20]
  assert targets.shape.as_list() == [None, 20]


def test_training_clients_keep_their_first_sentences_only():
  raw = tff.simulation.datasets.stackoverflow.get_synthetic()
  task = stackoverflow.create_stackoverflow_task(
      use_synthetic_data=True, max_sentences_per_client=2
  )
  for client_id in raw.client_ids:
    raw_tokens = [
        example['tokens'].numpy()
        for example in raw.create_tf_dataset_for_client(client_id)
    ]
    kept_tokens = [
        example['tokens'].numpy()
        for example in task.datasets.train_data.create_tf_dataset_for_client(
            client_id
        )
    ]
    assert kept_tokens == raw_tokens[:2]
  # Evaluation clients keep all their sentences.
  heldout_sizes = [
      len(list(task.datasets.validation_data.create_tf_dataset_for_client(c)))
      for c in raw.client_ids
  ]
  assert max(heldout_sizes) == 3


def test_validation_is_the_heldout_split_or_none():
  with_validation = stackoverflow.create_stackoverflow_task(
      use_synthetic_data=True, validation_fraction=0.2
  )
  assert with_validation.datasets.validation_data is not None
  assert sorted(with_validation.datasets.validation_data.client_ids) == sorted(
      tff.simulation.datasets.stackoverflow.get_synthetic().client_ids
  )
  without_validation = stackoverflow.create_stackoverflow_task(
      use_synthetic_data=True, validation_fraction=0.0
  )
  assert without_validation.datasets.validation_data is None


def test_fedavg_trains_two_rounds_on_two_clients():
  task = stackoverflow.create_stackoverflow_task(
      train_batch_size=2, use_synthetic_data=True, validation_fraction=0.0
  )
  run = task_checks.train_fedavg(
      task, task.datasets.train_data.client_ids[:2], client_learning_rate=1.0
  )
  for train_metrics in run.train_metrics:
    assert stackoverflow.ACCURACY_METRIC_NAME in train_metrics
    assert train_metrics['num_examples'] == 3 + 3  # sentences of 2 clients
    assert np.isfinite(train_metrics['loss'])
  task_checks.assert_model_changed(run)


def test_missing_data_is_one_line_naming_the_file_and_writes_nothing(
    tmp_path,
):
  message = task_checks.missing_data_message(
      stackoverflow.create_stackoverflow_task, tmp_path
  )
  assert str(tmp_path / 'stackoverflow.sqlite') in message
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    'kwargs,name',
    [
        ({'max_sentences_per_client': 0}, 'max_sentences_per_client'),
        ({'validation_fraction': 1.0}, 'validation_fraction'),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, name):
  with pytest.raises(ValueError, match=name):
    stackoverflow.create_stackoverflow_task(use_synthetic_data=True, **kwargs)
