"""The per-round progress line of `experiment_driver.outputs`."""

from experiment_driver import outputs


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
