"""Verdicts: whether a report shows the paper's effect, computed, never typed.

An experiment declares the effects its paper reports as `Effect`s: a
quantity of each run (`final test accuracy`, `peak ‖Δ‖`, ...), the runs of a
treatment and of a baseline (by their flags), and the direction the paper
found (treatment above or below the baseline) with, where the paper gives it,
the size of that difference. `assess` pairs the treatment's and the
baseline's runs by seed (the same seed: the same partition, initialization
and client sampling), takes the paired differences and their 95 % Student-t
confidence interval, and gives each effect a verdict; `combine` gives the
experiment's. The rules are stated once for readers, in `docs/verdicts.md`,
which every report links to.

Per effect (`d`: the mean paired difference signed so that the paper's
direction is positive, `[lo, hi]` its confidence interval):

* fewer than 2 paired seeds: NOT TESTABLE AT THIS SCALE (no interval);
* `lo > 0`: REPRODUCED, or PARTLY when the paper gives a size and `d` is
  below half of it;
* `hi < 0`: REVERSED;
* otherwise (the interval holds 0): NOT REPRODUCED.

Per experiment: NOT TESTABLE when the experiment says its scale cannot show
the effect (`Experiment.not_testable`) or no effect could be tested;
REPRODUCED when every tested effect is and none was untestable; PARTLY when
at least one tested effect is REPRODUCED or PARTLY; REVERSED when none is and
at least one is REVERSED; else NOT REPRODUCED.

A deterministic claim (no seeds: GeL's Figure 3 coefficients) is an `Exact`:
REPRODUCED when its measured value satisfies the stated condition, else NOT
REPRODUCED.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
from scipy import stats

REPRODUCED = 'REPRODUCED'
PARTLY = 'PARTLY'
NOT_REPRODUCED = 'NOT REPRODUCED'
REVERSED = 'REVERSED'
NOT_TESTABLE = 'NOT TESTABLE AT THIS SCALE'
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, REVERSED, NOT_TESTABLE)
CONFIDENCE = 0.95
MIN_PAIRS = 2
# A tested effect smaller than this fraction of the paper's is PARTLY.
SIZE_FRACTION = 0.5
RULES_DOC = 'docs/verdicts.md'

RUN = 'run'
EXPERIMENT_NAME = 'experiment_name'
# A selection key naming the grid a run belongs to (`core.Grid.name`, the
# start of its experiment name), for grids that differ only in their length.
GRID = 'grid'


@dataclasses.dataclass(frozen=True)
class Quantity:
  """A number per run, read off its rows of the tidy frame."""

  name: str
  of_run: Callable[[pd.DataFrame], float]


def of_column(column: str, reduce: Callable[[pd.Series], float], name: str,
              first_round: int = 1) -> Quantity:
  """`reduce` of the run's non-empty values of `column` in rounds >=
  `first_round` (NaN when the column or every value is missing)."""
  def of_run(run: pd.DataFrame) -> float:
    if column not in run:
      return math.nan
    values = run[run['round'] >= first_round][column].dropna()
    return float(reduce(values)) if len(values) else math.nan
  return Quantity(name, of_run)


def final(column: str, name: Optional[str] = None) -> Quantity:
  """The run's last non-empty value of `column`."""
  return of_column(column, lambda v: v.iloc[-1], name or f'final {column}')


def peak(column: str, name: Optional[str] = None) -> Quantity:
  """The run's largest value of `column`."""
  return of_column(column, lambda v: v.max(), name or f'peak {column}')


def mean_after(column: str, first_round: int,
               name: Optional[str] = None) -> Quantity:
  """The run's mean of `column` over rounds >= `first_round`."""
  return of_column(column, lambda v: v.mean(),
                   name or f'mean {column} from round {first_round}',
                   first_round)


def median_after(column: str, first_round: int,
                 name: Optional[str] = None) -> Quantity:
  """The run's median of `column` over rounds >= `first_round`."""
  return of_column(column, lambda v: v.median(),
                   name or f'median {column} from round {first_round}',
                   first_round)


def drop_from_peak(column: str, name: Optional[str] = None) -> Quantity:
  """The run's largest value of `column` minus its last (a collapse after
  peaking is large; a run still improving has 0)."""
  return of_column(column, lambda v: v.max() - v.iloc[-1],
                   name or f'peak minus final {column}')


def area_under(column: str, name: Optional[str] = None) -> Quantity:
  """The mean of `column` over the run's evaluations (the area under its
  curve over the evaluated rounds, normalized): faster learning, higher."""
  return of_column(column, lambda v: v.mean(),
                   name or f'mean {column} over evaluations')


def any_positive(column: str, name: Optional[str] = None) -> Quantity:
  """1 if any round's `column` is > 0, else 0 (a failure flag; missing
  values count as 0)."""
  return of_column(column, lambda v: (v > 0).any(), name or f'any {column}')


def _first_round_at(run: pd.DataFrame, column: str, target: float) -> float:
  """The first round whose `column` reaches `target`; the last round + 1
  if none does (censored: it needs more), so that failing to reach the
  target is never dropped as missing."""
  reached = run[run[column] >= target]
  if len(reached):
    return float(reached['round'].iloc[0])
  return float(run['round'].max() + 1)


def rounds_to(column: str, target_column: str,
              name: Optional[str] = None) -> Quantity:
  """The first round whose `column` reaches the run's `target_column` value
  (`_first_round_at`)."""
  def of_run(run: pd.DataFrame) -> float:
    if column not in run or target_column not in run:
      return math.nan
    return _first_round_at(run, column, float(run[target_column].iloc[0]))
  return Quantity(name or f'rounds to the target {column}', of_run)


def rounds_to_level(column: str, level: float,
                    name: Optional[str] = None) -> Quantity:
  """The first round whose `column` reaches `level` (`_first_round_at`)."""
  def of_run(run: pd.DataFrame) -> float:
    if column not in run:
      return math.nan
    return _first_round_at(run, column, level)
  return Quantity(name or f'rounds to {column} {level:g}', of_run)


@dataclasses.dataclass(frozen=True)
class Exact:
  """A deterministic claim (no seeds): `value(frame)` is REPRODUCED when
  `holds(value)`, else NOT REPRODUCED; `expected` says what holds means."""

  claim: str
  value: Callable[[pd.DataFrame], float]
  holds: Callable[[float], bool]
  expected: str


@dataclasses.dataclass(frozen=True)
class Effect:
  """One effect the paper reports, as a paired comparison of runs.

  `treatment` and `baseline` select runs by the flag values their
  `hparams.json` records (compared as values: 800, 800.0 and '800' alike;
  `None` matches a flag not recorded) and by `GRID`, their grid's name.
  `direction` is +1 when the paper has the treatment's quantity above the
  baseline's, -1 below. `paper_size` is the paper's (treatment - baseline)
  in the quantity's units, if it has one comparable to ours. `pair_by` is the flag (or flags) whose equal values
  pair runs: the seed, or with one seed the cells of a grid.
  """

  claim: str
  quantity: Quantity
  treatment: Mapping[str, Any]
  baseline: Mapping[str, Any]
  direction: int
  paper_size: Optional[float] = None
  pair_by: Union[str, tuple[str, ...]] = 'seed'

  def __post_init__(self):
    if self.direction not in (1, -1):
      raise ValueError(f'direction must be +1 or -1, got {self.direction}')

  @property
  def pair_flags(self) -> tuple[str, ...]:
    return (self.pair_by,) if isinstance(self.pair_by, str) else self.pair_by

  @property
  def pairs_by_seed(self) -> bool:
    """One seed flag (`seed`, `partition_seed`), not a grid's cells."""
    return len(self.pair_flags) == 1 and self.pair_flags[0].endswith('seed')

  def pair_unit(self) -> str:
    """What its pairs are: seeds, or cells named by their flags."""
    return ('seeds' if self.pairs_by_seed
            else f'cells ({" x ".join(self.pair_flags)})')


@dataclasses.dataclass(frozen=True)
class Assessment:
  effect: Any  # Effect or Exact
  pairs: int
  mean: float  # treatment - baseline, raw sign
  low: float
  high: float
  verdict: str
  reason: str


def _select(frame: pd.DataFrame, flags: Mapping[str, Any]) -> pd.DataFrame:
  """The rows of the runs whose every row matches `flags` (a per-round
  column such as `clients_per_round` must match in every round, so a run
  with a growing cohort matches no fixed cohort size)."""
  mask = pd.Series(True, index=frame.index)
  for flag, value in flags.items():
    if flag == GRID:
      names = frame[EXPERIMENT_NAME].astype(str)
      mask &= (names == value) | names.str.startswith(f'{value}__')
      continue
    if flag not in frame:
      if value is None:
        continue
      return frame.iloc[0:0]
    column = frame[flag]
    if value is None:
      mask &= column.isna()
    else:
      mask &= column.map(_text) == _text(value)
  # (A row of no run, e.g. a measured one beside the runs, is never one.)
  whole = mask.groupby(frame[RUN]).transform('all')
  return frame[whole.where(frame[RUN].notna(), False).astype(bool)]


def _text(value: Any) -> str:
  """A flag value as text, so that 800, 800.0 and '800' are alike."""
  if isinstance(value, (bool, np.bool_)):
    return str(bool(value))
  if isinstance(value, (int, float, np.integer, np.floating)):
    if isinstance(value, (float, np.floating)) and math.isnan(value):
      return 'nan'
    value = float(value)
    return str(int(value)) if value == int(value) else repr(value)
  text = str(value)
  try:
    return _text(float(text)) if text.lower() not in ('true', 'false') else (
        str(text.lower() == 'true'))
  except ValueError:
    return text


def per_seed(frame: pd.DataFrame, flags: Mapping[str, Any],
             quantity: Quantity,
             pair_by: Union[str, Sequence[str]]) -> dict[Any, float]:
  """The quantity of each selected run, keyed by its `pair_by` value.

  Raises:
    ValueError: If two selected runs share a `pair_by` value (the selection
      names too few flags to single a run out).
  """
  runs = _select(frame, flags)
  columns = (pair_by,) if isinstance(pair_by, str) else tuple(pair_by)
  values = {}
  for run_name, run in runs.groupby(RUN, sort=True):
    key = tuple(_text(run[c].iloc[0]) if c in run else '0' for c in columns)
    if key in values:
      raise ValueError(
          f'two runs with {dict(zip(columns, key))} match {dict(flags)} (one is'
          f' {run_name}); name more flags')
    values[key] = quantity.of_run(run.sort_values('round'))
  return values


def assess(frame: pd.DataFrame, effect) -> Assessment:
  """The effect's paired differences, interval and verdict on `frame` (an
  `Exact` claim: its value, checked)."""
  if isinstance(effect, Exact):
    value = float(effect.value(frame))
    held = not math.isnan(value) and effect.holds(value)
    return Assessment(effect, 0, value, value, value,
                      REPRODUCED if held else NOT_REPRODUCED,
                      f'{value:.3g}, expected {effect.expected}')
  treated = per_seed(frame, effect.treatment, effect.quantity,
                     effect.pair_by)
  base = per_seed(frame, effect.baseline, effect.quantity, effect.pair_by)
  seeds = sorted(k for k in treated.keys() & base.keys()
                 if not (math.isnan(treated[k]) or math.isnan(base[k])))
  diffs = np.array([treated[k] - base[k] for k in seeds], dtype=float)
  return verdict_of_differences(effect, diffs)


def interval(diffs: np.ndarray) -> tuple[float, float, float]:
  """`(mean, low, high)`: the paired differences' mean and its Student-t
  interval at `CONFIDENCE` (at least 2 differences)."""
  n = len(diffs)
  mean = float(np.mean(diffs))
  half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)
               * np.std(diffs, ddof=1) / math.sqrt(n))
  return mean, mean - half, mean + half


def verdict_of_differences(effect: Effect, diffs: np.ndarray) -> Assessment:
  """The verdict rules (module docstring) on paired differences."""
  n = len(diffs)
  if n < MIN_PAIRS:
    return Assessment(effect, n, float(diffs.mean()) if n else math.nan,
                      math.nan, math.nan, NOT_TESTABLE,
                      f'{n} paired seed{"s" if n != 1 else ""}: no'
                      ' confidence interval')
  mean, low, high = interval(diffs)
  signed_low, signed_high = sorted((effect.direction * low,
                                    effect.direction * high))
  signed_mean = effect.direction * mean
  if signed_low > 0:
    if (effect.paper_size is not None and effect.paper_size != 0 and
        signed_mean < SIZE_FRACTION * abs(effect.paper_size)):
      verdict, reason = PARTLY, (
          f'the paper\'s direction, but {signed_mean:.3g} is below half the'
          f' paper\'s {abs(effect.paper_size):.3g}')
    else:
      verdict, reason = REPRODUCED, ('the interval excludes 0 in the'
                                     ' paper\'s direction')
  elif signed_high < 0:
    verdict, reason = REVERSED, ('the interval excludes 0 against the'
                                 ' paper\'s direction')
  else:
    verdict, reason = NOT_REPRODUCED, 'the interval holds 0'
  return Assessment(effect, n, mean, low, high, verdict, reason)


def combine(verdicts: Sequence[str],
            not_testable: Optional[str] = None) -> str:
  """The experiment's verdict from its effects' (module docstring)."""
  if not_testable:
    return NOT_TESTABLE
  tested = [v for v in verdicts if v != NOT_TESTABLE]
  if not tested:
    return NOT_TESTABLE
  if all(v == REPRODUCED for v in tested) and len(tested) == len(verdicts):
    return REPRODUCED
  if any(v in (REPRODUCED, PARTLY) for v in tested):
    return PARTLY
  if any(v == REVERSED for v in tested):
    return REVERSED
  return NOT_REPRODUCED


def _format(value: float) -> str:
  # Float32 sums leave ~1e-8 where paired runs end equal: shown as +0.
  return '—' if math.isnan(value) else f'{round(value, 6) + 0.0:+.3g}'


def effects_table(assessments: Sequence[Assessment]) -> pd.DataFrame:
  """One row per effect, as the reports print it."""
  rows = []
  for a in assessments:
    if isinstance(a.effect, Exact):
      rows.append({'effect (paper)': a.effect.claim, 'quantity': 'exact',
                   'paired seeds': '—',
                   'treatment − baseline, 95 % CI': f'{a.mean:.3g}',
                   'paper': a.effect.expected, 'verdict': a.verdict})
      continue
    rows.append({
        'effect (paper)': a.effect.claim,
        'quantity': a.effect.quantity.name,
        'paired seeds': (a.pairs if a.effect.pairs_by_seed
                         else f'{a.pairs} cells'),
        'treatment − baseline, 95 % CI': (
            f'{_format(a.mean)} [{_format(a.low)}, {_format(a.high)}]'),
        'paper': ('—' if a.effect.paper_size is None
                  else f'{a.effect.paper_size:+.3g}'),
        'verdict': a.verdict,
    })
  return pd.DataFrame(rows)


def package_sentence(assessments: Sequence[Assessment]) -> str:
  """What was measured, one clause per effect."""
  clauses = []
  for a in assessments:
    if isinstance(a.effect, Exact):
      clauses.append(f'{a.effect.claim}: {a.reason}')
    elif a.pairs < MIN_PAIRS:
      clauses.append(f'{a.effect.claim}: {a.reason}')
    else:
      clauses.append(
          f'{a.effect.claim}: {a.effect.quantity.name} differs by'
          f' {_format(a.mean)} (95 % CI [{_format(a.low)},'
          f' {_format(a.high)}], {a.pairs} paired {a.effect.pair_unit()})')
  return '; '.join(clauses) + '.' if clauses else ''
