"""Reads run directories and computes what Charles et al. (2021) read off them.

A run directory (written by `run_experiment.py`, see
`experiment_driver/outputs.py`) holds `hparams.json` (the run's flags) and
`metrics.csv` (one row per round; evaluation columns such as `test/accuracy`
are filled on evaluation rounds only). `load_runs` turns any number of them
into one tidy frame, one row per (run, round), with the run's flags joined as
columns. On that frame:

* `threshold_crossings`: rounds and examples to reach test-accuracy
  thresholds (Section 3.2, Figures 3, 4, 23-27; data efficiency, Section 3.5
  and Figure 7; Figure 13 left).
* `relative_time_to_accuracy`: time-to-accuracy under the straggler model
  relative to a reference cohort size (appendix B.5, Figures 28-31).
* `mean_update_norms`, `fit_update_norm_scaling`, `update_norm_ratios`,
  `predicted_update_norms`: the inverse-square-root law of the pseudo-gradient
  norm, `‖Δ_1‖/‖Δ_2‖ ≈ sqrt(M_2/M_1)` (Section 4, Figure 8, appendix B.6).
* `catastrophic_failures`: failures per run (Section 3.1), read in the train
  accuracy averaged over local training (`catastrophic_failure`) or, in runs
  with `--cohort_accuracy`, in the server model's accuracy on each round's
  cohort before local training (`cohort/accuracy`, `SERVER_DETECTOR`), or
  in its accuracy on the fixed validation clients evaluated every round
  (`validation/accuracy`, `HELD_OUT_DETECTOR`: the same examples each round,
  so a halving is the model's and not the sample's).
* `accuracy_by_run`, `final_percentiles`: accuracy versus cohort size
  (Figures 5, 21, 22) and its per-client percentiles (Figure 6, Tables 6-9).
* `learning_rate_grid`, `best_learning_rates`: the tuning grid over client
  and server learning rates (appendix A.4); any two flags can be the axes.
* `best_of`: every choice on validation clients (a rate, a β), with ties
  within float rounding broken by a rule rather than by the machine.
* `mean_curves`: a metric per round averaged over runs that share labels (the
  paper's mean over 5 trials).

Runs are told apart by their directory (`run`); `by` arguments name the
columns that label runs to compare (default: the cohort size). Runs sharing
the same labels (e.g. seeds) are averaged where a function says so.

Why one module: every reading of run directories (thresholds, fits, ratios,
straggler runtime) shares the same loaders and column conventions; split, each
part would re-import them. Splitting it by figure is left for later.
"""

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import pandas as pd

from fl_common import diagnostics
from fl_common import run_layout


# Columns of the tidy frame.
RUN = 'run'  # the normalized path of the run directory
EXPERIMENT_NAME = 'experiment_name'  # its last component
ROUND = run_layout.ROUND_COLUMN
COHORT_SIZE = 'clients_per_round'
TEST_ACCURACY = 'test/accuracy'
TEST_LOSS = 'test/loss'
VALIDATION_ACCURACY = 'validation/accuracy'
UPDATE_NORM = 'update_norm'
CATASTROPHIC_FAILURE = 'catastrophic_failure'
# The server model's accuracy on the round's cohort (`--cohort_accuracy`).
COHORT_ACCURACY = 'cohort/accuracy'
TRAIN_DETECTOR = 'train'
SERVER_DETECTOR = 'server'
HELD_OUT_DETECTOR = 'held_out'
# The accuracy column each server-model detector reads.
DETECTOR_COLUMNS = {SERVER_DETECTOR: COHORT_ACCURACY,
                    HELD_OUT_DETECTOR: VALIDATION_ACCURACY}
CUMULATIVE_EXAMPLES = 'cumulative_examples_processed'
CUMULATIVE_SIMULATED_TIME = 'cumulative_simulated_round_time'
STRAGGLER_LAMBDA = 'straggler_lambda'
CLIENT_LEARNING_RATE = 'client_learning_rate'
SERVER_LEARNING_RATE = 'server_learning_rate'
PERCENTILES = (5, 25, 50, 75, 95)
THRESHOLD = 'threshold'


def percentile_column(accuracy_column: str, percentile: int) -> str:
  """The metrics column of a per-client accuracy percentile, e.g. `_p5`."""
  return f'{accuracy_column}_p{percentile}'


def find_run_dirs(paths: Sequence[str]) -> list[str]:
  """Expands `paths` into run directories.

  Args:
    paths: Each a run directory (it holds `metrics.csv`) or a root directory
      whose immediate subdirectories are run directories.

  Returns:
    The run directories, in the order given (a root's in sorted order).

  Raises:
    ValueError: If a path does not exist or holds no run directory.
  """
  run_dirs = []
  for path in paths:
    if os.path.isfile(os.path.join(path, run_layout.METRICS_FILE)):
      run_dirs.append(path)
      continue
    if not os.path.isdir(path):
      raise ValueError(f'run directory {path!r} does not exist')
    children = sorted(
        os.path.join(path, name) for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name, run_layout.METRICS_FILE)))
    if not children:
      raise ValueError(f'{path!r} holds no {run_layout.METRICS_FILE}, neither itself nor'
                       ' in a subdirectory')
    run_dirs.extend(children)
  return run_dirs


def _column_value(value: Any) -> Any:
  """A flag value as one cell: lists and dicts as JSON, None as NaN."""
  if value is None:
    return np.nan
  if isinstance(value, (list, dict)):
    return json.dumps(value, sort_keys=True)
  return value


def load_run(run_dir: str) -> pd.DataFrame:
  """One run's metrics, one row per round, with its flags as columns.

  A flag whose name is also a metrics column (`clients_per_round`, which the
  training loop records per round) is not joined: the per-round value is kept.

  Raises:
    ValueError: If `hparams.json` or `metrics.csv` is missing or malformed.
  """
  path = os.path.normpath(run_dir)
  hparams = run_layout.read_hparams(path)
  metrics = run_layout.read_metrics(path)
  flags = pd.DataFrame(
      {name: [_column_value(value)] * len(metrics)
       for name, value in sorted(hparams.items())
       if name not in metrics.columns},
      index=metrics.index)
  ids = pd.DataFrame({RUN: path, EXPERIMENT_NAME: os.path.basename(path)},
                     index=metrics.index)
  return pd.concat([ids, metrics, flags], axis=1)


def load_runs(paths: Sequence[str]) -> pd.DataFrame:
  """The tidy frame of every run under `paths` (see `find_run_dirs`)."""
  if isinstance(paths, str):
    paths = [paths]
  run_dirs = list(dict.fromkeys(
      os.path.normpath(d) for d in find_run_dirs(paths)))
  return pd.concat([load_run(d) for d in run_dirs], ignore_index=True,
                   sort=False)


def _require_columns(frame: pd.DataFrame, columns: Sequence[str]) -> None:
  missing = [c for c in columns if c not in frame.columns]
  if missing:
    raise ValueError(f'column(s) {", ".join(map(repr, missing))} not in the'
                     ' runs\' metrics.csv or hparams.json')


def _check_thresholds(thresholds: Sequence[float]) -> list[float]:
  thresholds = [float(t) for t in thresholds]
  if not thresholds or not all(math.isfinite(t) for t in thresholds):
    raise ValueError(f'thresholds must be finite numbers, got {thresholds!r}')
  return thresholds


def _check_how(how: str) -> None:
  if how not in ('final', 'best'):
    raise ValueError(f"how must be 'final' or 'best', got {how!r}")


def _runs(frame: pd.DataFrame):
  """Yields `(run, its rows)` per run, in order of appearance."""
  _require_columns(frame, [RUN, ROUND])
  yield from frame.groupby(RUN, sort=False)


def _labels(run_frame: pd.DataFrame, by: Sequence[str]) -> dict[str, Any]:
  """A run's values of the label columns (their first round's)."""
  return {column: run_frame[column].iloc[0] for column in by}


def _first_reaching(frame: pd.DataFrame, thresholds: Sequence[float],
                    accuracy_column: str, by: Sequence[str],
                    measures: Mapping[str, str]) -> pd.DataFrame:
  """Per run and threshold, `measures` at the first round reaching it."""
  thresholds = _check_thresholds(thresholds)
  _require_columns(frame, [accuracy_column, *by, *measures.values()])
  rows = []
  for run, run_frame in _runs(frame):
    evaluated = run_frame[run_frame[accuracy_column].notna()]
    for threshold in thresholds:
      reached = evaluated[evaluated[accuracy_column] >= threshold]
      row = {RUN: run, **_labels(run_frame, by), THRESHOLD: threshold}
      for name, column in measures.items():
        row[name] = float(reached[column].iloc[0]) if len(reached) else np.nan
      rows.append(row)
  return pd.DataFrame(rows)


def threshold_crossings(frame: pd.DataFrame,
                        thresholds: Sequence[float],
                        accuracy_column: str = TEST_ACCURACY,
                        by: Sequence[str] = (COHORT_SIZE,)) -> pd.DataFrame:
  """Rounds and examples each run needs to reach each accuracy threshold.

  The paper's "number of communication rounds to obtain certain test
  accuracy thresholds" (Figures 3, 4, 23-27) and its data efficiency
  (Section 3.5): the first evaluation round whose accuracy is at least the
  threshold, and the cumulative examples processed up to that round.

  Args:
    frame: From `load_runs`.
    thresholds: Accuracy thresholds.
    accuracy_column: The evaluated accuracy compared with the thresholds.
    by: Label columns copied into the result.

  Returns:
    One row per run and threshold: `run`, the `by` columns, `threshold`,
    `rounds` and, where the runs record them, `examples`
    (`cumulative_examples_processed`) and `simulated_time`
    (`cumulative_simulated_round_time`); NaN where never reached.

  Raises:
    ValueError: For no or non-finite thresholds or a missing column.
  """
  measures = {'rounds': ROUND}
  for name, column in (('examples', CUMULATIVE_EXAMPLES),
                       ('simulated_time', CUMULATIVE_SIMULATED_TIME)):
    if column in frame.columns:
      measures[name] = column
  return _first_reaching(frame, thresholds, accuracy_column, by, measures)


def relative_time_to_accuracy(
    frame: pd.DataFrame,
    thresholds: Sequence[float],
    reference_cohort_size: int = 10,
    accuracy_column: str = TEST_ACCURACY,
    time_column: str = CUMULATIVE_SIMULATED_TIME,
    group_by: Sequence[str] = (STRAGGLER_LAMBDA,),
) -> pd.DataFrame:
  """Time to reach each accuracy with cohort size M over that with M_ref.

  Appendix B.5, Figures 28-31: "the ratio of how long it takes to reach a test
  accuracy of a with a cohort size of M, versus how long it takes to reach a
  with M = 10", with time the cumulative simulated round time of the straggler
  model. A run's time to `a` is `time_column` at its first evaluation round
  with accuracy >= a; runs sharing the group, M and threshold (seeds) are
  averaged, and the mean is NaN if any of them never reaches `a`.

  Args:
    frame: From `load_runs`.
    thresholds: Accuracy thresholds `a`.
    reference_cohort_size: M_ref (the paper: 10).
    accuracy_column: The evaluated accuracy.
    time_column: The cumulative time.
    group_by: Columns of runs compared together (the paper: each λ apart).

  Returns:
    One row per group, cohort size and threshold: the `group_by` columns,
    `clients_per_round`, `threshold`, `time`, `reference_time` and
    `relative_time` = time / reference_time.

  Raises:
    ValueError: For a missing column or a group without a run of
      `reference_cohort_size`.
  """
  crossings = _first_reaching(frame, thresholds, accuracy_column,
                              [*group_by, COHORT_SIZE], {'time': time_column})
  keys = [*group_by, COHORT_SIZE, THRESHOLD]
  times = crossings.groupby(keys, sort=True, dropna=False)['time'].agg(
      lambda t: t.mean(skipna=False)).reset_index()
  reference = times[times[COHORT_SIZE] == reference_cohort_size].drop(
      columns=COHORT_SIZE).rename(columns={'time': 'reference_time'})
  result = times.merge(reference, on=[*group_by, THRESHOLD], how='left',
                       indicator=True)
  unmatched = result[result['_merge'] == 'left_only']
  if len(unmatched):
    group = unmatched.iloc[0][list(group_by)].to_dict()
    raise ValueError(
        f'no run with {COHORT_SIZE}={reference_cohort_size} (the reference)'
        + (f' for {group}' if group else ''))
  result = result.drop(columns='_merge')
  result['relative_time'] = result['time'] / result['reference_time']
  return result


def mean_update_norms(frame: pd.DataFrame,
                      at_round: Optional[int] = None,
                      min_round: int = 1) -> pd.DataFrame:
  """Each run's `‖Δ‖`: at one round, or its mean over rounds >= `min_round`.

  Rounds without a finite `update_norm` are left out of the mean.

  Returns:
    One row per run: `run`, `clients_per_round`, `update_norm`.

  Raises:
    ValueError: If a column is missing or a run has no such round.
  """
  _require_columns(frame, [UPDATE_NORM, COHORT_SIZE])
  if at_round is not None:
    rows = frame[frame[ROUND] == at_round]
  else:
    rows = frame[frame[ROUND] >= min_round]
  finite = rows[np.isfinite(rows[UPDATE_NORM].astype(float))]
  norms = finite.groupby(RUN, sort=False).agg(
      {COHORT_SIZE: 'first', UPDATE_NORM: 'mean'}).reset_index()
  missing = [r for r in frame[RUN].unique() if r not in set(norms[RUN])]
  if missing:
    which = (f'round {at_round}' if at_round is not None else
             f'rounds >= {min_round}')
    raise ValueError(f'no finite {UPDATE_NORM} at {which} in run(s)'
                     f' {", ".join(missing)}')
  return norms


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """`log ‖Δ‖ = intercept + exponent · log M`, least squares over runs.

  Section 4 of the paper predicts `exponent ≈ -1/2` for FedAvg (client
  updates nearly orthogonal, so their mean shrinks like 1/sqrt(M)).
  """

  intercept: float
  exponent: float
  r_squared: float  # of the fit in log-log space
  num_runs: int

  def predict(self, cohort_size: Any) -> np.ndarray:
    """The fitted `‖Δ‖` at cohort size(s) `cohort_size`."""
    return np.exp(self.intercept) * np.asarray(cohort_size,
                                               float)**self.exponent


def fit_update_norm_scaling(frame: pd.DataFrame,
                            at_round: Optional[int] = None,
                            min_round: int = 1) -> PowerLawFit:
  """Fits `log ‖Δ‖ = a + b log M` over runs (see `mean_update_norms`).

  Raises:
    ValueError: With fewer than two cohort sizes or a non-positive norm.
  """
  norms = mean_update_norms(frame, at_round, min_round)
  cohort_sizes = norms[COHORT_SIZE].to_numpy(float)
  values = norms[UPDATE_NORM].to_numpy(float)
  if np.unique(cohort_sizes).size < 2:
    raise ValueError('fitting ‖Δ‖ against M needs runs of at least two cohort'
                     f' sizes, got {sorted(set(cohort_sizes))}')
  if np.any(values <= 0):
    bad = norms[RUN][values <= 0].tolist()
    raise ValueError(f'{UPDATE_NORM} must be positive to fit logs; run(s)'
                     f' {", ".join(bad)} have {values[values <= 0].tolist()}')
  log_m, log_norm = np.log(cohort_sizes), np.log(values)
  exponent, intercept = np.polyfit(log_m, log_norm, 1)
  residual = log_norm - (intercept + exponent * log_m)
  total = np.sum((log_norm - log_norm.mean())**2)
  r_squared = 1.0 - np.sum(residual**2) / total if total > 0 else 1.0
  return PowerLawFit(float(intercept), float(exponent), float(r_squared),
                     len(norms))


COSINE = 'mean_pairwise_cosine'


def _mean_norm_factor(cohort_size: float, cosine: float) -> float:
  """The squared norm of the mean of `cohort_size` unit vectors with mean
  pairwise cosine `cosine`: `(1 + (M - 1) c) / M`."""
  return (1 + (cohort_size - 1) * cosine) / cohort_size


def update_norm_ratios(frame: pd.DataFrame,
                       at_round: Optional[int] = None,
                       min_round: int = 1) -> pd.DataFrame:
  """`‖Δ_1‖/‖Δ_2‖` against `sqrt(M_2/M_1)` for every pair M_1 < M_2.

  The norms are `mean_update_norms` averaged over the runs of each cohort
  size. Where the runs log the clients' mean pairwise cosine `c`, the ratio
  is also predicted with it: M updates of equal norm and pairwise cosine c
  average to a norm `sqrt((1 + (M - 1) c) / M)` times theirs, so
  `sqrt(M_2/M_1)` holds only for c = 0 (Section 4's orthogonal updates).

  Returns:
    One row per pair: `cohort_size_1`, `cohort_size_2`, `norm_1`, `norm_2`,
    `observed_ratio` = norm_1/norm_2, `predicted_ratio` = sqrt(M_2/M_1) and
    `ratio_to_prediction` = observed/predicted (1 when the law holds); with
    the cosine, `cosine_1`, `cosine_2` (each cohort size's mean over the same
    rounds), `cosine_predicted_ratio` and `ratio_to_cosine_prediction`.
  """
  per_cohort = mean_update_norms(frame, at_round, min_round).groupby(
      COHORT_SIZE)[UPDATE_NORM].mean()
  cosines = None
  if COSINE in frame:
    rows = (frame[frame[ROUND] == at_round] if at_round is not None
            else frame[frame[ROUND] >= min_round])
    cosines = rows.groupby(RUN).agg(
        **{COHORT_SIZE: (COHORT_SIZE, 'first'), COSINE: (COSINE, 'mean')}
    ).groupby(COHORT_SIZE)[COSINE].mean()
  columns = ['cohort_size_1', 'cohort_size_2', 'norm_1', 'norm_2',
             'observed_ratio', 'predicted_ratio', 'ratio_to_prediction']
  rows = []
  for m1, m2 in itertools.combinations(sorted(per_cohort.index), 2):
    observed = per_cohort[m1] / per_cohort[m2]
    predicted = math.sqrt(m2 / m1)
    row = {'cohort_size_1': m1, 'cohort_size_2': m2,
           'norm_1': per_cohort[m1], 'norm_2': per_cohort[m2],
           'observed_ratio': observed, 'predicted_ratio': predicted,
           'ratio_to_prediction': observed / predicted}
    if cosines is not None:
      c1, c2 = cosines.get(m1, np.nan), cosines.get(m2, np.nan)
      corrected = np.nan
      if np.isfinite(c1) and np.isfinite(c2):
        corrected = math.sqrt(max(0.0, _mean_norm_factor(m1, c1))
                              / max(1e-300, _mean_norm_factor(m2, c2)))
      row.update(cosine_1=c1, cosine_2=c2, cosine_predicted_ratio=corrected,
                 ratio_to_cosine_prediction=observed / corrected)
    rows.append(row)
  if cosines is not None:
    columns += ['cosine_1', 'cosine_2', 'cosine_predicted_ratio',
                'ratio_to_cosine_prediction']
  return pd.DataFrame(rows, columns=columns)


def predicted_update_norms(frame: pd.DataFrame,
                           reference_cohort_size: int = 50) -> pd.DataFrame:
  """Per round, `‖Δ‖` predicted from the reference cohort (Figure 8(c)).

  `predicted(M, t) = ‖Δ_ref(t)‖ · sqrt(M_ref / M)`, with `‖Δ_ref(t)‖` the mean
  over the runs of cohort size `reference_cohort_size` at round t.

  Returns:
    One row per cohort size and round: `clients_per_round`, `round`,
    `update_norm` (mean over that cohort size's runs) and
    `predicted_update_norm`.

  Raises:
    ValueError: If no run has the reference cohort size.
  """
  _require_columns(frame, [UPDATE_NORM, COHORT_SIZE, ROUND])
  observed = frame.groupby([COHORT_SIZE, ROUND])[UPDATE_NORM].mean()
  observed = observed.reset_index()
  reference = observed[observed[COHORT_SIZE] == reference_cohort_size]
  if reference.empty:
    raise ValueError(f'no run with {COHORT_SIZE}={reference_cohort_size} to'
                     ' predict from')
  reference = reference[[ROUND, UPDATE_NORM]].rename(
      columns={UPDATE_NORM: 'reference_norm'})
  result = observed.merge(reference, on=ROUND, how='left')
  result['predicted_update_norm'] = result['reference_norm'] * np.sqrt(
      reference_cohort_size / result[COHORT_SIZE].astype(float))
  return result.drop(columns='reference_norm')


def server_failure_rounds(run_frame: pd.DataFrame,
                          column: str = COHORT_ACCURACY,
                          after_round: int = 0) -> list[int]:
  """The rounds before which the server model's accuracy in `column` fell
  by at least half from the round before's: the paper's failure (Section
  3.1) read on the server model
  (`fl_common.diagnostics.catastrophic_failure_rounds`), on the round's
  cohort (`cohort/accuracy`) or on the fixed validation clients
  (`validation/accuracy`). Only consecutive rounds are compared: a fall
  across rounds without an evaluation between is not one round's. A
  failure found in the accuracy before round r happened in round r - 1's
  update; the round named is r, as the column's. Rounds up to
  `after_round` are left out (the first rounds' transient from the initial
  model)."""
  series = run_frame.sort_values(ROUND)[[ROUND, column]].dropna()
  rounds = series[ROUND].astype(int).tolist()
  accuracies = series[column].astype(float).tolist()
  return [rounds[i] for i in range(1, len(rounds))
          if rounds[i] == rounds[i - 1] + 1 and rounds[i] > after_round and
          diagnostics.is_catastrophic_failure(accuracies[i - 1],
                                              accuracies[i])]


def catastrophic_failures(frame: pd.DataFrame,
                          by: Sequence[str] = (COHORT_SIZE,),
                          detector: str = TRAIN_DETECTOR,
                          after_round: int = 0) -> pd.DataFrame:
  """Catastrophic training failures of each run (Section 3.1).

  With `TRAIN_DETECTOR`, counts the rounds the driver flagged in
  `catastrophic_failure` (train accuracy, averaged over local training,
  fell by at least half in one round); with `SERVER_DETECTOR` or
  `HELD_OUT_DETECTOR`, the rounds of `server_failure_rounds` on the
  cohort's or the validation clients' accuracy (runs with
  `--cohort_accuracy`, or evaluated every round). Failures at rounds up to
  `after_round` are not counted.

  Returns:
    One row per run: `run`, the `by` columns, `failures` (count) and
    `first_failure_round` (NaN if none).

  Raises:
    ValueError: If `detector` is none of these, or its column is missing.
  """
  if detector not in (TRAIN_DETECTOR, *DETECTOR_COLUMNS):
    raise ValueError(f'detector must be one of {TRAIN_DETECTOR!r},'
                     f' {", ".join(map(repr, DETECTOR_COLUMNS))}, got'
                     f' {detector!r}.')
  column = DETECTOR_COLUMNS.get(detector, CATASTROPHIC_FAILURE)
  _require_columns(frame, [column, *by])
  rows = []
  for run, run_frame in _runs(frame):
    if detector == TRAIN_DETECTOR:
      failed = run_frame[(run_frame[CATASTROPHIC_FAILURE] > 0) &
                         (run_frame[ROUND] > after_round)][ROUND].tolist()
    else:
      failed = server_failure_rounds(run_frame, column, after_round)
    rows.append({RUN: run, **_labels(run_frame, by),
                 'failures': len(failed),
                 'first_failure_round': (float(failed[0]) if failed
                                         else np.nan)})
  return pd.DataFrame(rows)


def accuracy_by_run(frame: pd.DataFrame,
                    accuracy_column: str = TEST_ACCURACY,
                    how: str = 'final',
                    by: Sequence[str] = (COHORT_SIZE,)) -> pd.DataFrame:
  """Each run's last evaluated (`final`) or highest (`best`) accuracy.

  Returns:
    One row per run: `run`, the `by` columns, `accuracy` (NaN if the run was
    never evaluated).
  """
  _check_how(how)
  _require_columns(frame, [accuracy_column, *by])
  rows = []
  for run, run_frame in _runs(frame):
    values = run_frame[accuracy_column].dropna()
    if values.empty:
      accuracy = np.nan
    else:
      accuracy = float(values.iloc[-1] if how == 'final' else values.max())
    rows.append({RUN: run, **_labels(run_frame, by), 'accuracy': accuracy})
  return pd.DataFrame(rows)


def final_percentiles(frame: pd.DataFrame,
                      accuracy_column: str = TEST_ACCURACY,
                      percentiles: Sequence[int] = PERCENTILES,
                      by: Sequence[str] = (COHORT_SIZE,)) -> pd.DataFrame:
  """Per-client accuracy percentiles at each run's last evaluation.

  Reads the `<accuracy_column>_p<q>` columns (Figure 6, Tables 6-9).

  Returns:
    One row per run: `run`, the `by` columns, `round` and `p<q>` per
    percentile q.

  Raises:
    ValueError: If a percentile column is missing or a run never has them.
  """
  columns = {f'p{q}': percentile_column(accuracy_column, q)
             for q in percentiles}
  _require_columns(frame, [*columns.values(), *by])
  rows = []
  for run, run_frame in _runs(frame):
    complete = run_frame.dropna(subset=list(columns.values()))
    if complete.empty:
      raise ValueError(f'run {run} has no round with all of'
                       f' {", ".join(columns.values())}')
    last = complete.iloc[-1]
    rows.append({RUN: run, **_labels(run_frame, by), ROUND: last[ROUND],
                 **{name: float(last[c]) for name, c in columns.items()}})
  return pd.DataFrame(rows)


def learning_rate_grid(frame: pd.DataFrame,
                       rows: str = CLIENT_LEARNING_RATE,
                       columns: str = SERVER_LEARNING_RATE,
                       accuracy_column: str = VALIDATION_ACCURACY,
                       how: str = 'final') -> pd.DataFrame:
  """Mean accuracy over a grid of two flags (appendix A.4 tuning).

  Each run contributes its `accuracy_by_run(..., how)`; runs sharing a grid
  cell (seeds) are averaged, as the paper selects "the values that maximize
  the average validation performance".

  Returns:
    A frame indexed by the `rows` values with one column per `columns`
    value, NaN where no run was made.

  Raises:
    ValueError: If a run has no value for `rows` or `columns` (e.g. a learning
      rate left to its tuned default).
  """
  per_run = accuracy_by_run(frame, accuracy_column, how, by=(rows, columns))
  unset = per_run[per_run[[rows, columns]].isna().any(axis=1)]
  if len(unset):
    raise ValueError(f'run(s) {", ".join(unset[RUN])} have no value for'
                     f' {rows!r} or {columns!r}; a grid needs both set')
  return per_run.pivot_table(index=rows, columns=columns, values='accuracy',
                             aggfunc='mean', dropna=False).sort_index(
                                 axis=0).sort_index(axis=1)


# Two validation means closer than this, relative to the best, are a tie:
# the runs log float32 accuracies (7 significant digits), so equal means
# (the same examples right) can differ by float rounding, and which of them
# wins would then depend on the machine.
TIE_TOLERANCE = 1e-6


def best_of(means: pd.Series) -> tuple[Any, list[Any]]:
  """The best of `means` (e.g. mean validation accuracy per beta) and the
  labels tied with it (within `TIE_TOLERANCE` of it, relative), ties going
  to the smallest label, as an exact tie goes to the first of a sorted
  index: a rule fixed in advance, not float rounding, decides them.

  Raises:
    ValueError: If `means` has no value.
  """
  means = means.dropna().sort_index()
  if means.empty:
    raise ValueError('nothing to choose from')
  best = means.max()
  tied = list(means.index[means >= best - TIE_TOLERANCE * abs(best)])
  return tied[0], tied


def best_learning_rates(grid: pd.DataFrame) -> tuple[Any, Any, float]:
  """`(row value, column value, accuracy)` of the grid's best cell (a tie,
  `best_of`, to the smallest row value, then column value).

  Raises:
    ValueError: If no cell has an accuracy.
  """
  stacked = grid.stack().dropna()
  if stacked.empty:
    raise ValueError('the grid has no accuracy to choose from')
  (row, column), _ = best_of(stacked)
  return row, column, float(stacked[row, column])


def mean_curves(frame: pd.DataFrame,
                y: str,
                x: str = ROUND,
                by: Sequence[str] = (COHORT_SIZE,)) -> pd.DataFrame:
  """`y` (and `x`) per round averaged over the runs sharing the `by` labels.

  Only rounds where `y` is recorded count (evaluation rounds for accuracy).
  Labels are taken per run (its first round's values), so a metric that
  changes within a run (a dynamic cohort) still labels the whole run.

  Returns:
    One row per label and round: the `by` columns, `round`, `x` (mean),
    `y` (mean), `<y>_std` (0 for a single run) and `num_runs`.
  """
  _require_columns(frame, [x, y, *by])
  values = [c for c in dict.fromkeys([RUN, ROUND, x, y]) if c not in by]
  labels = frame.groupby(RUN, sort=False)[list(by)].first()
  labelled = frame[values].join(labels, on=RUN)
  labelled = labelled[labelled[y].notna()]
  grouped = labelled.groupby([*by, ROUND], sort=True, dropna=False)
  return grouped.agg(**{
      **({x: (x, 'mean')} if x != ROUND else {}),
      y: (y, 'mean'),
      f'{y}_std': (y, lambda v: float(v.std(ddof=0))),
      'num_runs': (RUN, 'nunique'),
  }).reset_index()
