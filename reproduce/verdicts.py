"""Verdicts: whether a report shows the paper's effect, computed, never typed.

An experiment declares the effects its paper reports as `Effect`s: a
quantity of each run (`final test accuracy`, `peak ‖Δ‖`, a 0/1 failure), the
runs of a treatment and of a baseline (by their flags), and what the paper
found. The declared part (direction, the paper's size, primary or secondary,
a 0/1 or continuous outcome, a difference or an equivalence claim and its
margin) comes from the experiment's frozen protocol
(`reproduce/protocols/<paper>/<experiment>.toml`, `reproduce.protocol`).
`assess_all` pairs the treatment's and the baseline's runs by seed (the same
seed: the same partition, initialization and client sampling), tests each
effect with the library test that fits its data, corrects the primary
effects' p-values together (Holm) and gives each effect a verdict;
`combine` gives the report's. The rules are stated once for readers, in
`docs/verdicts.md`, which every report links to.

Tests (two-sided, `ALPHA` = 0.05):

* a continuous quantity: the paired differences' one-sample t test and its
  95 % interval (`scipy.stats.ttest_1samp`), at least `MIN_PAIRS` pairs; a
  relative effect (the paper's size as a ratio, e.g. GeL's speed-up
  (b - g) / b) takes the per-pair ratios (t - b) / |b| instead;
* a 0/1 outcome (failed or not): the exact McNemar test on the discordant
  pairs (`statsmodels`' `mcnemar(exact=True)`, a sign test) with the exact
  interval that agrees with it (Clopper-Pearson on the discordant pairs'
  split, `proportion_confint(method='beta')`, mapped to the paired
  difference of proportions), or with no discordant pair Newcombe's
  interval (Wilson scores): never a zero-width interval;
* an equivalence claim ("no difference"): TOST against the protocol's
  margin (`statsmodels`' `DescrStatsW.ttost_mean`) with its 90 % interval;
* Holm's correction (`statsmodels`' `multipletests`) over the report's
  tested primary effects; a secondary effect is judged at `ALPHA` alone.

Per effect (`d`: the mean paired difference signed so that the paper's
direction is positive; `p`: its corrected p-value):

* fewer than `MIN_PAIRS` pairs: NOT TESTABLE AT THIS SCALE;
* `p >= ALPHA`: NOT REPRODUCED;
* `p < ALPHA`, `d < 0`: REVERSED;
* `p < ALPHA`, `d > 0`, the paper gives no size: DIRECTION ONLY;
* `p < ALPHA`, `d > 0`: REPRODUCED when `d` is at least `SIZE_FRACTION` of
  the paper's size, else PARTLY;
* an equivalence claim: REPRODUCED when TOST's `p < ALPHA`, else NOT
  REPRODUCED.

Per report (its primary effects): NOT TESTABLE when the experiment says its
scale cannot show the effect or no primary effect could be tested; REVERSED
when any primary effect is reversed; REPRODUCED when every one is
REPRODUCED or DIRECTION ONLY; PARTLY when at least half of them are
REPRODUCED, DIRECTION ONLY or PARTLY; else NOT REPRODUCED.

A deterministic claim (no seeds: GeL's Figure 3 coefficients, a tuned rate
against the paper's) is an `Exact`: REPRODUCED when its measured value
satisfies the stated condition, else NOT REPRODUCED.

Why one module: a quantity's kind (0/1 or continuous, relative or not)
picks its test, the test's corrected p-value and size its verdict, and the
effects' verdicts the report's; split, each part would import the others'
conventions.
"""

import dataclasses
import gc
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats import contingency_tables
from statsmodels.stats import multitest
from statsmodels.stats import proportion
from statsmodels.stats import weightstats

REPRODUCED = 'REPRODUCED'
PARTLY = 'PARTLY'
DIRECTION_ONLY = 'DIRECTION ONLY'
NOT_REPRODUCED = 'NOT REPRODUCED'
REVERSED = 'REVERSED'
NOT_TESTABLE = 'NOT TESTABLE AT THIS SCALE'
# A report's verdicts; an effect may also be DIRECTION ONLY.
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, REVERSED, NOT_TESTABLE)
# Not a verdict: a confirmatory report written before every run of its
# frozen design finished (`reproduce.core.write_report`). Its effects so far
# are shown, and counted nowhere.
INCOMPLETE = 'INCOMPLETE'
EFFECT_VERDICTS = (REPRODUCED, DIRECTION_ONLY, PARTLY, NOT_REPRODUCED,
                   REVERSED, NOT_TESTABLE)
# Effect verdicts that count as reproducing for a report's verdict.
REPRODUCING = (REPRODUCED, DIRECTION_ONLY)
ALPHA = 0.05
CONFIDENCE = 0.95
MIN_PAIRS = 5
# A significant effect smaller than this fraction of the paper's is PARTLY.
SIZE_FRACTION = 0.5
RULES_DOC = 'docs/verdicts.md'

# Effect.outcome and Effect.test values.
CONTINUOUS = 'continuous'
BINARY = 'binary'
DIFFERENCE = 'difference'
EQUIVALENCE = 'equivalence'

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


def examples_to_level(column: str, level: float, examples_column: str,
                      name: Optional[str] = None) -> Quantity:
  """The run's `examples_column` (cumulative examples trained) at the first
  row whose `column` reaches `level`; the run's last value if none does
  (censored: it needs more), so failing to reach it is never dropped."""
  def of_run(run: pd.DataFrame) -> float:
    if column not in run or examples_column not in run:
      return math.nan
    rows = run[[column, examples_column]].ffill()
    reached = rows[rows[column] >= level]
    values = rows[examples_column].dropna()
    if not len(values):
      return math.nan
    return float(reached[examples_column].iloc[0] if len(reached)
                 else values.iloc[-1])
  return Quantity(name or f'examples to {column} {level:g}', of_run)


@dataclasses.dataclass(frozen=True)
class Exact:
  """A deterministic claim (no seeds): `value(frame)` is REPRODUCED when
  `holds(value)`, else NOT REPRODUCED; `expected` says what holds means."""

  claim: str
  value: Callable[[pd.DataFrame], float]
  holds: Callable[[float], bool]
  expected: str
  primary: bool = True


# A tuned rate reproduces the paper's when it is within this factor of it
# (on a grid of powers of 10 the paper's rate itself; on GeL's Table 5 grid
# the paper's rate or a neighbour).
TUNED_RATE_FACTOR = 2.0


def tuned_rate(claim: str, value: Callable[[pd.DataFrame], float],
               paper_rate: float) -> Exact:
  """A tuning table's claim: the rate `value` reads off the runs (chosen
  on validation clients) is the paper's, within `TUNED_RATE_FACTOR`."""
  return Exact(
      claim, value,
      lambda v: paper_rate / TUNED_RATE_FACTOR <= v <= (
          paper_rate * TUNED_RATE_FACTOR),
      f'within a factor of {TUNED_RATE_FACTOR:g} of {paper_rate:g}')


@dataclasses.dataclass(frozen=True)
class Effect:
  """One effect the paper reports, as a paired comparison of runs.

  `treatment` and `baseline` select runs by the flag values their
  `hparams.json` records (compared as values: 800, 800.0 and '800' alike;
  `None` matches a flag not recorded) and by `GRID`, their grid's name.
  `direction` is +1 when the paper has the treatment's quantity above the
  baseline's, -1 below. `paper_size` is the paper's (treatment - baseline)
  in the quantity's units (`relative`: as a ratio of the baseline's), if it
  has one comparable to ours. `pair_by` is the flag (or flags) whose equal
  values pair runs: the seed, or with one seed the cells of a grid.
  `outcome` is `CONTINUOUS` or `BINARY` (0/1 per run); `test` is
  `DIFFERENCE` or `EQUIVALENCE` (within +-`margin`); a secondary effect
  (`primary=False`) is reported but does not decide the report.
  """

  claim: str
  quantity: Quantity
  treatment: Mapping[str, Any]
  baseline: Mapping[str, Any]
  direction: int
  paper_size: Optional[float] = None
  pair_by: Union[str, tuple[str, ...]] = 'seed'
  outcome: str = CONTINUOUS
  test: str = DIFFERENCE
  margin: Optional[float] = None
  relative: bool = False
  primary: bool = True

  def __post_init__(self):
    if self.direction not in (1, -1):
      raise ValueError(f'direction must be +1 or -1, got {self.direction}')
    if self.outcome not in (CONTINUOUS, BINARY):
      raise ValueError(f'outcome must be {CONTINUOUS} or {BINARY}, got'
                       f' {self.outcome!r}')
    if self.test not in (DIFFERENCE, EQUIVALENCE):
      raise ValueError(f'test must be {DIFFERENCE} or {EQUIVALENCE}, got'
                       f' {self.test!r}')
    if (self.test == EQUIVALENCE) != (self.margin is not None):
      raise ValueError('an equivalence claim, and only one, has a margin')
    if self.test == EQUIVALENCE and (self.margin <= 0
                                     or self.outcome == BINARY):
      raise ValueError('an equivalence claim needs a positive margin on a'
                       ' continuous quantity')
    if self.relative and self.outcome == BINARY:
      raise ValueError('a 0/1 outcome has no relative size')

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
class Test:
  """A statistic of one effect's pairs: the mean difference (raw sign, or
  the mean ratio for a relative effect), its interval, its p-value."""

  pairs: int
  mean: float
  low: float
  high: float
  p_value: float
  method: str


@dataclasses.dataclass(frozen=True)
class Assessment:
  effect: Any  # Effect or Exact
  pairs: int
  mean: float  # treatment - baseline, raw sign (relative: the mean ratio)
  low: float
  high: float
  verdict: str
  reason: str
  p_value: float = math.nan  # uncorrected
  p_adjusted: float = math.nan  # Holm's, over the primary effects
  method: str = ''

  @property
  def primary(self) -> bool:
    return self.effect.primary


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


def paired_values(frame: pd.DataFrame,
                  effect: Effect) -> tuple[np.ndarray, np.ndarray]:
  """The treatment's and the baseline's quantity, pair by pair (pairs with
  a missing value on either side left out)."""
  treated = per_seed(frame, effect.treatment, effect.quantity,
                     effect.pair_by)
  base = per_seed(frame, effect.baseline, effect.quantity, effect.pair_by)
  keys = sorted(k for k in treated.keys() & base.keys()
                if not (math.isnan(treated[k]) or math.isnan(base[k])))
  return (np.array([treated[k] for k in keys], dtype=float),
          np.array([base[k] for k in keys], dtype=float))


def interval(diffs: np.ndarray) -> tuple[float, float, float]:
  """`(mean, low, high)`: the paired differences' mean and its Student-t
  interval at `CONFIDENCE` (at least 2 differences; for the readings)."""
  mean = float(np.mean(diffs))
  if np.all(diffs == diffs[0]):
    return mean, mean, mean
  low, high = stats.ttest_1samp(diffs, 0.0).confidence_interval(CONFIDENCE)
  return mean, float(low), float(high)


def t_test(diffs: np.ndarray) -> Test:
  """The one-sample t test of the paired differences against 0, with its
  `CONFIDENCE` interval (scipy). Differences that are all equal have no
  spread for a t test: an exact sign test decides them (all n of one sign:
  p = 2 / 2^n), and their interval is the single value."""
  n = len(diffs)
  mean = float(np.mean(diffs))
  if np.all(diffs == diffs[0]):
    nonzero = int(np.count_nonzero(diffs))
    p = (stats.binomtest(nonzero, nonzero).pvalue if nonzero else 1.0)
    return Test(n, mean, mean, mean, float(p),
                'sign test (every difference equal)')
  result = stats.ttest_1samp(diffs, 0.0)
  low, high = result.confidence_interval(CONFIDENCE)
  return Test(n, mean, float(low), float(high), float(result.pvalue),
              'paired t test')


def newcombe_interval(both: int, only_treatment: int, only_baseline: int,
                      neither: int,
                      confidence: float = CONFIDENCE) -> tuple[float, float]:
  """Newcombe's (1998, method 10) interval for a paired difference of
  proportions (treatment - baseline), from the Wilson score intervals of
  each arm's proportion (statsmodels) and the pairs' correlation. Its width
  is never zero for a finite number of pairs."""
  n = both + only_treatment + only_baseline + neither
  alpha = 1 - confidence
  p1, p2 = (both + only_treatment) / n, (both + only_baseline) / n
  l1, u1 = proportion.proportion_confint(both + only_treatment, n, alpha,
                                         method='wilson')
  l2, u2 = proportion.proportion_confint(both + only_baseline, n, alpha,
                                         method='wilson')
  margins = ((both + only_treatment) * (only_baseline + neither)
             * (both + only_baseline) * (only_treatment + neither))
  phi = ((both * neither - only_treatment * only_baseline) / math.sqrt(margins)
         if margins else 0.0)
  d = p1 - p2
  below = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
                        + (u2 - p2) ** 2, 0.0))
  above = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2)
                        + (p2 - l2) ** 2, 0.0))
  return max(d - below, -1.0), min(d + above, 1.0)


def exact_paired_interval(only_treatment: int, only_baseline: int, pairs: int,
                          confidence: float = CONFIDENCE
                          ) -> Optional[tuple[float, float]]:
  """The exact interval of a paired difference of proportions that agrees
  with the exact McNemar test: the Clopper-Pearson interval (statsmodels,
  `beta`) of the share of discordant pairs that favour the treatment, p,
  mapped to the difference (m / n)(2p - 1) (m discordant of n pairs). None
  with no discordant pair (the map has no width there)."""
  discordant = only_treatment + only_baseline
  if not discordant:
    return None
  low, high = proportion.proportion_confint(only_treatment, discordant,
                                            1 - confidence, method='beta')
  scale = discordant / pairs
  return scale * (2 * low - 1), scale * (2 * high - 1)


def mcnemar_test(treated: np.ndarray, base: np.ndarray) -> Test:
  """The exact McNemar test (a sign test on the discordant pairs) of 0/1
  outcomes, with the exact interval that agrees with it
  (`exact_paired_interval`); with no discordant pair, Newcombe's interval
  (`newcombe_interval`). Neither has zero width.

  Raises:
    ValueError: If an outcome is not 0 or 1.
  """
  for values in (treated, base):
    if not np.isin(values, (0.0, 1.0)).all():
      raise ValueError(f'a 0/1 outcome has the values {sorted(set(values))}')
  t, b = treated.astype(bool), base.astype(bool)
  both, only_t = int(np.sum(t & b)), int(np.sum(t & ~b))
  only_b, neither = int(np.sum(~t & b)), int(np.sum(~t & ~b))
  p = (contingency_tables.mcnemar([[both, only_t], [only_b, neither]],
                                  exact=True).pvalue
       if only_t + only_b else 1.0)
  exact = exact_paired_interval(only_t, only_b, len(t))
  low, high = exact or newcombe_interval(both, only_t, only_b, neither)
  return Test(len(t), float(np.mean(t.astype(float) - b)), low, high,
              float(p), f'exact McNemar, {only_t} vs {only_b} discordant'
              + (' pairs' if exact else ' pairs, Newcombe interval'))


def tost_test(diffs: np.ndarray, margin: float) -> Test:
  """TOST: both one-sided t tests that the mean difference lies inside
  (-margin, +margin) (statsmodels), with the 90 % interval that matches
  it; p < ALPHA shows the two equivalent."""
  n = len(diffs)
  mean = float(np.mean(diffs))
  if np.all(diffs == diffs[0]):
    inside = abs(mean) < margin
    p = 0.5 ** n if inside else 1.0
    return Test(n, mean, mean, mean, p, f'TOST within +-{margin:g} (every'
                ' difference equal)')
  described = weightstats.DescrStatsW(diffs)
  p = described.ttost_mean(-margin, margin)[0]
  low, high = described.tconfint_mean(alpha=2 * ALPHA)
  return Test(n, mean, float(low), float(high), float(p),
              f'TOST within +-{margin:g}, 90 % interval')


def test_of(effect: Effect, treated: np.ndarray, base: np.ndarray) -> Test:
  """The effect's test on its pairs (module docstring)."""
  if effect.outcome == BINARY:
    return mcnemar_test(treated, base)
  diffs = treated - base
  if effect.relative:
    diffs = diffs / np.abs(base)
  if effect.test == EQUIVALENCE:
    return tost_test(diffs, effect.margin)
  return t_test(diffs)


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the order given (statsmodels).

  `multipletests`' Holm branch runs a full `gc.collect()` at every call:
  ~0.3 s in a process holding TensorFlow, once per report and per test of
  one. The objects alive before the call are frozen for its length
  (`gc.freeze`), so that collection looks only at what the call made.
  """
  if not len(p_values):
    return []
  # A caller's own frozen objects are left as they were.
  freeze = gc.get_freeze_count() == 0
  if freeze:
    gc.freeze()
  try:
    adjusted = multitest.multipletests(list(p_values), alpha=ALPHA,
                                       method='holm')[1]
  finally:
    if freeze:
      gc.unfreeze()
  return [float(p) for p in adjusted]


def verdict_of(effect: Effect, test: Test,
               p_adjusted: Optional[float] = None) -> Assessment:
  """The verdict rules (module docstring) on an effect's test, at its
  corrected p-value (default: the uncorrected one)."""
  p = test.p_value if p_adjusted is None else p_adjusted
  unit = 'seed' if effect.pairs_by_seed else 'cell'
  if test.pairs < MIN_PAIRS:
    # (The interval of 2-4 pairs is shown, as a reading; it decides nothing.)
    return Assessment(effect, test.pairs, test.mean, test.low, test.high,
                      NOT_TESTABLE,
                      f'{test.pairs} paired {unit}{"s" if test.pairs != 1 else ""},'
                      f' fewer than {MIN_PAIRS}', test.p_value, p,
                      test.method)
  signed = effect.direction * test.mean
  size = None if effect.paper_size in (None, 0) else abs(effect.paper_size)
  if effect.test == EQUIVALENCE:
    verdict, reason = ((REPRODUCED, f'equivalent within +-{effect.margin:g}'
                        f' (p = {p:.3g})') if p < ALPHA else
                       (NOT_REPRODUCED, f'not shown equivalent within'
                        f' +-{effect.margin:g} (p = {p:.3g})'))
  elif p >= ALPHA:
    verdict, reason = NOT_REPRODUCED, f'not significant (p = {p:.3g})'
  elif signed < 0:
    verdict, reason = REVERSED, (f'significant against the paper\'s'
                                 f' direction (p = {p:.3g})')
  elif size is None:
    verdict, reason = DIRECTION_ONLY, (
        f'significant in the paper\'s direction (p = {p:.3g}); the paper'
        ' gives no size to compare')
  elif signed < SIZE_FRACTION * size:
    verdict, reason = PARTLY, (
        f'significant in the paper\'s direction (p = {p:.3g}), but'
        f' {signed:.3g} is below half the paper\'s {size:.3g}')
  else:
    verdict, reason = REPRODUCED, (
        f'significant in the paper\'s direction (p = {p:.3g}), at least half'
        f' the paper\'s size')
  return Assessment(effect, test.pairs, test.mean, test.low, test.high,
                    verdict, reason, test.p_value, p, test.method)


def verdict_of_differences(effect: Effect, diffs: np.ndarray) -> Assessment:
  """The verdict of one effect (uncorrected) on paired differences; a 0/1
  outcome's differences (+1, 0, -1) are taken as pairs whose ties failed
  on neither side (the test reads only the discordant pairs)."""
  diffs = np.asarray(diffs, dtype=float)
  if effect.outcome == BINARY:
    return verdict_of(effect, mcnemar_test((diffs > 0).astype(float),
                                           (diffs < 0).astype(float)))
  if len(diffs) < 2:
    return verdict_of(effect, Test(len(diffs), float(np.mean(diffs))
                                   if len(diffs) else math.nan, math.nan,
                                   math.nan, math.nan, ''))
  test = (tost_test(diffs, effect.margin) if effect.test == EQUIVALENCE
          else t_test(diffs))
  return verdict_of(effect, test)


def _exact(frame: pd.DataFrame, effect: Exact) -> Assessment:
  value = float(effect.value(frame))
  held = not math.isnan(value) and effect.holds(value)
  return Assessment(effect, 0, value, value, value,
                    REPRODUCED if held else NOT_REPRODUCED,
                    f'{value:.3g}, expected {effect.expected}',
                    method='exact claim')


def assess_all(frame: pd.DataFrame, effects: Sequence[Any]
               ) -> tuple[Assessment, ...]:
  """Every effect's test and verdict on `frame`, the primary effects'
  p-values corrected together (Holm)."""
  tests = {}
  for i, effect in enumerate(effects):
    if isinstance(effect, Exact):
      continue
    treated, base = paired_values(frame, effect)
    n = len(treated)
    diffs = (treated - base) / (np.abs(base) if effect.relative else 1.0)
    tests[i] = (test_of(effect, treated, base) if n >= 2 else
                Test(n, float(np.mean(diffs)) if n else math.nan,
                     math.nan, math.nan, math.nan, ''))
  primary = [i for i, t in tests.items()
             if effects[i].primary and t.pairs >= MIN_PAIRS]
  adjusted = dict(zip(primary, holm([tests[i].p_value for i in primary])))
  return tuple(_exact(frame, e) if isinstance(e, Exact) else
               verdict_of(e, tests[i], adjusted.get(i))
               for i, e in enumerate(effects))


def assess(frame: pd.DataFrame, effect) -> Assessment:
  """One effect's verdict on `frame`, uncorrected (`assess_all` corrects a
  report's primary effects together)."""
  return assess_all(frame, [effect])[0]


def combine(verdicts: Sequence[str],
            not_testable: Optional[str] = None) -> str:
  """The report's verdict from its primary effects' (module docstring)."""
  if not_testable:
    return NOT_TESTABLE
  if any(v == REVERSED for v in verdicts):
    return REVERSED
  tested = [v for v in verdicts if v != NOT_TESTABLE]
  if not tested:
    return NOT_TESTABLE
  if all(v in REPRODUCING for v in verdicts):
    return REPRODUCED
  if 2 * sum(v in (*REPRODUCING, PARTLY) for v in verdicts) >= len(verdicts):
    return PARTLY
  return NOT_REPRODUCED


def _format(value: float) -> str:
  # Float32 sums leave ~1e-8 where paired runs end equal: shown as +0.
  return '—' if math.isnan(value) else f'{round(value, 6) + 0.0:+.3g}'


def _paper(effect: Effect) -> str:
  if effect.test == EQUIVALENCE:
    return f'no difference (margin +-{effect.margin:g})'
  if effect.paper_size is None:
    return 'above' if effect.direction > 0 else 'below'
  return (f'{effect.paper_size:+.3g}'
          + (' (relative)' if effect.relative else ''))


def primary_first(assessments: Sequence[Assessment]) -> list[Assessment]:
  """The order a report lists its effects in: the primary effects, which
  its verdict is made of, then the secondary ones; each in the protocol's
  order."""
  return sorted(assessments, key=lambda a: not a.primary)


def effects_table(assessments: Sequence[Assessment]) -> pd.DataFrame:
  """One row per effect, as the reports print it (`primary_first`)."""
  rows = []
  for a in primary_first(assessments):
    if isinstance(a.effect, Exact):
      rows.append({'effect (paper)': a.effect.claim,
                   'primary': 'yes' if a.primary else 'no',
                   'quantity': 'exact', 'pairs': '—',
                   'treatment − baseline [interval]': f'{a.mean:.3g}',
                   'p (Holm)': '—', 'paper': a.effect.expected,
                   'verdict': a.verdict})
      continue
    rows.append({
        'effect (paper)': a.effect.claim,
        'primary': 'yes' if a.primary else 'no',
        'quantity': a.effect.quantity.name + (
            ' (relative)' if a.effect.relative else ''),
        'pairs': (a.pairs if a.effect.pairs_by_seed else f'{a.pairs} cells'),
        'treatment − baseline [interval]': (
            f'{_format(a.mean)} [{_format(a.low)}, {_format(a.high)}]'),
        'p (Holm)': ('—' if math.isnan(a.p_adjusted)
                     else f'{a.p_adjusted:.3g}'),
        'paper': _paper(a.effect),
        'verdict': a.verdict,
    })
  return pd.DataFrame(rows)


def package_sentence(assessments: Sequence[Assessment]) -> str:
  """What was measured, one clause per effect: the primary effects (the
  verdict's) first, then the secondary ones, said to be so."""
  def clause(a: Assessment) -> str:
    if isinstance(a.effect, Exact) or a.pairs < MIN_PAIRS:
      return f'{a.effect.claim}: {a.reason}'
    return (f'{a.effect.claim}: {a.effect.quantity.name} differs by'
            f' {_format(a.mean)} ([{_format(a.low)}, {_format(a.high)}],'
            f' {a.method}, {a.pairs} paired {a.effect.pair_unit()}) ->'
            f' {a.verdict}')
  primary = [clause(a) for a in assessments if a.primary]
  secondary = [clause(a) for a in assessments if not a.primary]
  sentences = []
  if primary:
    sentences.append('; '.join(primary) + '.')
  if secondary:
    sentences.append(('Secondary (not in the verdict): ' if primary else
                      'Secondary only (no primary effect): ')
                     + '; '.join(secondary) + '.')
  return ' '.join(sentences)


def counts(assessments: Sequence[Assessment]) -> dict[str, int]:
  """Effects per effect verdict, primary ones only."""
  found = dict.fromkeys(EFFECT_VERDICTS, 0)
  for a in assessments:
    if a.primary:
      found[a.verdict] += 1
  return found
