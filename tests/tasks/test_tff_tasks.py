"""tasks.tff_tasks: client specs, and offline task creation with validation."""

import contextlib
import os
import sqlite3

import pytest

from tasks import errors
from tasks import tff_tasks
from tasks import validation_split
from tests import tiny_models

_CLIENT_IDS = ['c0', 'c1', 'c2', 'c3', 'c4']
_LOADER_CALL = 'tff.simulation.datasets.toy.load_data(cache_dir=DIR)'


class _RecordingBuilder:
  """Builds a tiny regression task of `_CLIENT_IDS`, counting its calls."""

  def __init__(self):
    self.calls = 0

  def __call__(self):
    self.calls += 1
    return tiny_models.regression_task(dict.fromkeys(_CLIENT_IDS, 2),
                                       num_features=1, batch_size=2)


def _create(builder, data_dir, *, use_synthetic_data=False,
            validation_fraction=0.4, seed=3):
  return tff_tasks.create_offline_task(
      builder, dataset_name='Toy', sqlite_filename='toy.sqlite',
      loader_call=_LOADER_CALL, data_dir=str(data_dir),
      use_synthetic_data=use_synthetic_data,
      validation_fraction=validation_fraction, seed=seed)


def test_client_specs_train_capped_and_evaluate_one_unshuffled_epoch():
  train, evaluation = tff_tasks.client_specs(
      train_batch_size=20, eval_batch_size=64, num_epochs=3,
      max_elements_per_client=7)
  assert (train.num_epochs, train.batch_size, train.max_elements) == (3, 20, 7)
  assert (evaluation.num_epochs, evaluation.batch_size,
          evaluation.shuffle_buffer_size, evaluation.max_elements) == (
              1, 64, 1, None)


def test_client_specs_reject_a_bad_batch_size():
  with pytest.raises(ValueError, match='batch_size'):
    tff_tasks.client_specs(0, 64, 1, None)


def test_missing_file_raises_before_the_builder_runs(tmp_path):
  builder = _RecordingBuilder()
  with pytest.raises(errors.MissingDataError) as raised:
    _create(builder, tmp_path)
  assert str(tmp_path / 'toy.sqlite') in str(raised.value)
  assert _LOADER_CALL in str(raised.value)
  assert builder.calls == 0
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('use_synthetic_data', [True, False])
def test_builds_when_cached_or_synthetic_and_holds_out_clients(
    tmp_path, use_synthetic_data):
  if not use_synthetic_data:  # a database with TFF's tables
    with contextlib.closing(sqlite3.connect(tmp_path / 'toy.sqlite')) as db:
      db.execute('CREATE TABLE examples (split_name TEXT, client_id TEXT,'
                 ' serialized_example_proto BLOB)')
      db.execute('CREATE TABLE client_metadata (client_id TEXT,'
                 ' split_name TEXT, num_examples INTEGER)')
      db.commit()
  builder = _RecordingBuilder()
  task = _create(builder, tmp_path, use_synthetic_data=use_synthetic_data)
  assert builder.calls == 1
  train_ids = task.datasets.train_data.client_ids
  validation_ids = task.datasets.validation_data.client_ids
  assert (train_ids, validation_ids) == validation_split.split_client_ids(
      _CLIENT_IDS, 0.4, seed=3)


def test_validation_fraction_zero_keeps_every_training_client(tmp_path):
  task = _create(_RecordingBuilder(), tmp_path, use_synthetic_data=True,
                 validation_fraction=0.0)
  assert task.datasets.train_data.client_ids == _CLIENT_IDS
  assert task.datasets.validation_data is None
