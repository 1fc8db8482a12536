"""`experiment_driver.outputs`' per-round progress line and
`experiment_driver.release_managers`' metrics CSV."""

import asyncio
import csv

import numpy as np
import pytest
import tensorflow_federated as tff

from experiment_driver import outputs
from experiment_driver import release_managers


def test_progress_line_has_round_time_eta_and_key_metrics():
  line = outputs.progress_line(
      3, 10, 1.5, 2.0, {'train/loss': 0.25, 'train/accuracy': float('nan'),
                        'update_norm': 0.125, 'num_zero_updates': 0.0})
  assert line == ('round 3/10 | 1.50s | ETA 0m14s | train/loss 0.25 | '
                  'update_norm 0.125')


def test_progress_line_reports_discarded_client_updates():
  line = outputs.progress_line(1, 2, 1.0, 1.0, {'num_nonfinite_updates': 2.0,
                                                 'num_zero_updates': 1.0})
  assert line.endswith('num_nonfinite_updates 2 | num_zero_updates 1')


def _release(manager, values, key):
  asyncio.run(manager.release(values, key))


def _read(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def test_metrics_csv_appends_rows_and_widens_the_header_for_new_metrics(
    tmp_path):
  path = str(tmp_path / 'metrics.csv')
  manager = release_managers.MetricsCsv(path)
  _release(manager, {'loss': np.float32(0.5)}, 1)
  _release(manager, {'loss': 0.25, 'accuracy': 0.75}, 2)
  _release(manager, {'loss': 0.125}, 3)
  rows = _read(path)
  assert list(rows[0]) == ['round', 'loss', 'accuracy']
  assert [(r['round'], r['loss'], r['accuracy']) for r in rows] == [
      ('1', '0.5', ''), ('2', '0.25', '0.75'), ('3', '0.125', '')]
  # The format TFF's CSV manager reads.
  fieldnames, values = tff.program.CSVFileReleaseManager(
      path, key_fieldname='round')._read_values()
  assert fieldnames == ['round', 'loss', 'accuracy'] and len(values) == 3


def test_metrics_csv_on_resume_drops_rows_past_the_resumed_round(tmp_path):
  path = str(tmp_path / 'metrics.csv')
  manager = release_managers.MetricsCsv(path)
  for key in (1, 2, 3, 4):
    _release(manager, {'loss': float(key)}, key)
  with open(path, 'a') as f:
    f.write('5,')  # a row a killed run was writing
  resumed = release_managers.MetricsCsv(path, resumed_round=2)
  assert [r['round'] for r in _read(path)] == ['1', '2']
  _release(resumed, {'loss': 30.0}, 3)
  assert [(r['round'], r['loss']) for r in _read(path)] == [
      ('1', '1.0'), ('2', '2.0'), ('3', '30.0')]


def test_metrics_csv_refuses_a_csv_without_a_round_column(tmp_path):
  path = tmp_path / 'metrics.csv'
  path.write_text('step,loss\n1,0.5\n')
  with pytest.raises(release_managers.CsvWithoutRoundError,
                     match='no round column'):
    release_managers.MetricsCsv(str(path))
  assert path.read_text() == 'step,loss\n1,0.5\n'
