"""GeL's resource measurements (Boukhari et al. 2024, Section 4.1 "Metrics").

* Gradient computations: a client with budget `tau_i` computes `tau_i`
  gradients (guessed steps are free), so a round costs `sum_i tau_i`; the
  paper plots test accuracy against the cumulative count (Figure 4, row 3).
* Bytes exchanged: each sampled client downloads the model and uploads its
  update; sizes come from the TFF types of the two values
  (`fl_common.communication.type_size_bytes`). The per-round columns are
  named as the driver's running totals expect (`gradient_computations`,
  `bytes_down`, `bytes_up`; it adds `cumulative_<name>`).
* Rounds to target: the first round whose evaluation accuracy reaches the
  target (Tables 1-2); speedup = `(R_baseline - R) / R` (Table 1: FEMNIST
  57 -> 48 rounds is 18.8 %); network savings = the bytes of the rounds saved.

Run directories are the driver's (`fl_common.run_layout`): `metrics.csv` has
one row per round, a `round` column and flat metric columns
(`'test/accuracy'`, ...).
"""

import math
from collections.abc import Sequence
from typing import NamedTuple, Optional

import pandas as pd
import tensorflow_federated as tff

from fl_common import communication
from fl_common import run_layout

ROUND_COLUMN = run_layout.ROUND_COLUMN
GRADIENT_COMPUTATIONS = 'gradient_computations'
BYTES_DOWN = 'bytes_down'
BYTES_UP = 'bytes_up'


class ClientBytes(NamedTuple):
  """Bytes one sampled client exchanges per round."""

  down: int  # The model, server to client.
  up: int  # The update, client to server.


def client_bytes(model_weights_type: tff.Type,
                 client_update_type: tff.Type) -> ClientBytes:
  """Bytes of the model a client downloads and of the update it uploads."""
  return ClientBytes(
      down=communication.type_size_bytes(model_weights_type),
      up=communication.type_size_bytes(client_update_type))


# A run's `metrics.csv`, sorted by round; ValueError if it is missing or has
# no `round` column.
load_metrics = run_layout.read_metrics


def _require_column(metrics: pd.DataFrame, column: str) -> None:
  if column not in metrics.columns:
    available = ', '.join(c for c in metrics.columns if c != ROUND_COLUMN)
    raise ValueError(
        f'No column {column!r} in the metrics; available: {available}.')


def rounds_to_target(metrics: pd.DataFrame, accuracy_column: str,
                     target: float) -> Optional[int]:
  """The first round whose `accuracy_column` is at least `target`, or None.

  Rounds without an evaluation (empty cells) are skipped.
  """
  _require_column(metrics, accuracy_column)
  if not 0.0 < target <= 1.0:
    raise ValueError(f'target must be an accuracy in (0, 1], got {target}.')
  reached = metrics[metrics[accuracy_column] >= target]
  if reached.empty:
    return None
  return int(reached[ROUND_COLUMN].min())


def total_until_round(metrics: pd.DataFrame, columns: Sequence[str],
                      round_num: int) -> float:
  """The sum of per-round `columns` over rounds `<= round_num`."""
  for column in columns:
    _require_column(metrics, column)
  until_round = metrics.loc[metrics[ROUND_COLUMN] <= round_num, list(columns)]
  return float(until_round.to_numpy().sum())


def speedup(rounds: int, baseline_rounds: int) -> float:
  """Table 1's speedup: `(baseline_rounds - rounds) / rounds`."""
  if rounds < 1 or baseline_rounds < 1:
    raise ValueError(
        f'Round counts must be positive, got {rounds} and {baseline_rounds}.')
  return (baseline_rounds - rounds) / rounds


def summarize_run(run_dir: str, accuracy_column: str, target: float,
                  baseline_run_dir: Optional[str] = None) -> dict[str, float]:
  """Rounds, gradient computations and bytes until the target accuracy.

  Args:
    run_dir: The run directory.
    accuracy_column: The evaluation accuracy column of `metrics.csv`.
    target: The target accuracy (e.g. 0.76 for FEMNIST).
    baseline_run_dir: An optional baseline run (e.g. FedAvgCM for FedAvgCM +
      GeL) to compute the speedup and network savings against.

  Returns:
    `rounds_to_target` (NaN if never reached) and, once reached,
    `gradient_computations_to_target`, `bytes_to_target`; with a baseline
    that reached it too, `baseline_rounds_to_target`, `speedup` and
    `network_savings_bytes`.
  """
  metrics = load_metrics(run_dir)
  rounds = rounds_to_target(metrics, accuracy_column, target)
  if rounds is None:
    return {'rounds_to_target': math.nan}
  summary = {
      'rounds_to_target': float(rounds),
      'gradient_computations_to_target': total_until_round(
          metrics, [GRADIENT_COMPUTATIONS], rounds),
      'bytes_to_target': total_until_round(metrics, [BYTES_DOWN, BYTES_UP],
                                           rounds),
  }
  if baseline_run_dir is None:
    return summary
  baseline = load_metrics(baseline_run_dir)
  baseline_rounds = rounds_to_target(baseline, accuracy_column, target)
  if baseline_rounds is None:
    return summary
  summary['baseline_rounds_to_target'] = float(baseline_rounds)
  summary['speedup'] = speedup(rounds, baseline_rounds)
  summary['network_savings_bytes'] = (
      total_until_round(baseline, [BYTES_DOWN, BYTES_UP], baseline_rounds) -
      summary['bytes_to_target'])
  return summary
