"""Bytes from TFF types, rounds to target, speedup, run summaries."""

import math

import numpy as np
import pandas as pd
import pytest
import tensorflow_federated as tff

from fl_common import run_layout
from gel_tff import accounting


def write_run(directory, accuracies, gradient_computations, bytes_per_round):
  directory.mkdir()
  pd.DataFrame({
      'round': range(1, len(accuracies) + 1),
      'test/accuracy': accuracies,
      'train/accuracy': [0.99] * len(accuracies),
      accounting.GRADIENT_COMPUTATIONS: gradient_computations,
      accounting.BYTES_DOWN: [bytes_per_round / 2] * len(accuracies),
      accounting.BYTES_UP: [bytes_per_round / 2] * len(accuracies),
  }).to_csv(directory / run_layout.METRICS_FILE, index=False)
  return str(directory)


def test_client_bytes_are_model_down_and_update_up():
  weights_type = tff.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [3, 1]),
                 tff.TensorType(np.float32, [1])],
      non_trainable=[tff.TensorType(np.float32, [2])]))
  update_type = tff.to_type([tff.TensorType(np.float32, [3, 1]),
                             tff.TensorType(np.float32, [1])])
  assert accounting.client_bytes(weights_type, update_type) == (
      accounting.ClientBytes(down=(3 + 1 + 2) * 4, up=(3 + 1) * 4))


def test_rounds_to_target_skips_rounds_without_evaluation(tmp_path):
  run_dir = write_run(tmp_path / 'run',
                      [0.5, math.nan, 0.74, math.nan, 0.77, 0.8],
                      [10] * 6, 100)
  metrics = accounting.load_metrics(run_dir)
  assert accounting.rounds_to_target(metrics, 'test/accuracy', 0.76) == 5
  assert accounting.rounds_to_target(metrics, 'test/accuracy', 0.74) == 3
  assert accounting.rounds_to_target(metrics, 'test/accuracy', 0.9) is None
  with pytest.raises(ValueError, match='validation/accuracy'):
    accounting.rounds_to_target(metrics, 'validation/accuracy', 0.5)
  with pytest.raises(ValueError, match='76'):
    accounting.rounds_to_target(metrics, 'test/accuracy', 76)


def test_load_metrics_sorts_rounds(tmp_path):
  (tmp_path / 'run').mkdir()
  pd.DataFrame({'round': [3, 1, 2], 'x': [30, 10, 20]}).to_csv(
      tmp_path / 'run' / run_layout.METRICS_FILE, index=False)
  metrics = accounting.load_metrics(str(tmp_path / 'run'))
  assert metrics['x'].tolist() == [10, 20, 30]
  with pytest.raises(ValueError, match='missing'):
    accounting.load_metrics(str(tmp_path / 'missing'))


def test_total_until_round_sums_columns(tmp_path):
  run_dir = write_run(tmp_path / 'run', [0.1, 0.2, 0.3], [12, 7, 9], 50)
  metrics = accounting.load_metrics(run_dir)
  assert accounting.total_until_round(
      metrics, [accounting.GRADIENT_COMPUTATIONS], 2) == 19
  assert accounting.total_until_round(
      metrics, [accounting.BYTES_DOWN, accounting.BYTES_UP], 3) == 150
  with pytest.raises(ValueError, match='bytes_sideways'):
    accounting.total_until_round(metrics, ['bytes_sideways'], 3)


def test_speedup_matches_table_1():
  # FEMNIST, FedAvgCM -> GeL: 57 -> 48 rounds is 18.8 %, 95 -> 69 is 37.7 %.
  assert accounting.speedup(48, 57) == pytest.approx(0.188, abs=6e-4)
  assert accounting.speedup(69, 95) == pytest.approx(0.377, abs=5e-4)
  with pytest.raises(ValueError, match='0'):
    accounting.speedup(0, 10)


def test_summarize_run_against_baseline(tmp_path):
  gel_dir = write_run(tmp_path / 'gel', [0.5, 0.8, 0.9], [10, 11, 12], 100)
  baseline_dir = write_run(tmp_path / 'baseline', [0.5, 0.6, 0.7, 0.85],
                           [10, 10, 10, 10], 100)
  summary = accounting.summarize_run(gel_dir, 'test/accuracy', 0.8,
                                     baseline_dir)
  assert summary == {
      'rounds_to_target': 2.0,
      'gradient_computations_to_target': 21.0,
      'bytes_to_target': 200.0,
      'baseline_rounds_to_target': 4.0,
      'speedup': 1.0,
      'network_savings_bytes': 200.0,
  }
  never = accounting.summarize_run(gel_dir, 'test/accuracy', 0.95)
  assert math.isnan(never['rounds_to_target'])
