"""Re-derives a report's effects from its runs, without this package's code.

    python tools/check_verdict.py adabest table2          # confirmatory
    python tools/check_verdict.py gel fig8 --archive=PATH # another archive

A reviewer who doubts a report need not trust `reproduce/`: this script
reads only what the report rests on, the frozen protocol
(`reproduce/protocols/<paper>/<experiment>.toml`: each effect's quantity,
treatment and baseline runs, pairing, test, margin) and the runs'
archive (`results/<paper>/<experiment>/local_confirmatory.tar.xz`: each
run's `hparams.json` and `metrics.csv`), and recomputes each effect with
pandas, SciPy and statsmodels as `docs/verdicts.md` states the rules:
paired differences (relative ones divided by the baseline), a paired t
test with its 95 % interval, TOST with its 90 % interval for an
equivalence (differences that are all equal: a sign test), Holm's correction
over the primary effects with at least 5 pairs; for a 0/1 outcome the exact
McNemar test with the exact interval of the discordant pairs' split
(Newcombe's without a discordant pair). It prints one line per
effect, to set beside the report's effects table.

It knows the quantities most effects use, read off a run's metrics.csv:
its final test accuracy, peak minus final, mean over the evaluations; the
rounds to the target (the first round whose test accuracy reaches the
run's `target_accuracy`, or a stated level such as "rounds to 70% test
accuracy"; the last round + 1 if none does), the cumulative gradient
computations there (none: the pair is left out) or the examples trained to
a level (none: the last count); train accuracy over the last rounds minus
the final test accuracy; the mean update norm from a round on; whether
the server model failed (its cohort's or validation clients' accuracy
halved from one round to the next). An effect of another quantity is
listed as not checked, and then neither is Holm's correction over the
primary effects. It imports nothing of this package.
"""

import argparse
import io
import json
import math
import os
import re
import sys
import tarfile
import tomllib

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats import contingency_tables
from statsmodels.stats import multitest
from statsmodels.stats import proportion
from statsmodels.stats import weightstats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCURACY = 'test/accuracy'
MIN_PAIRS = 5


def read_runs(archive: str) -> dict[str, tuple[dict, pd.DataFrame]]:
  """Run name -> (its hparams, its metrics sorted by round)."""
  found: dict[str, dict] = {}
  with tarfile.open(archive) as tar:
    for member in tar:
      parts = member.name.split('/')
      if len(parts) < 2 or parts[-1] not in ('hparams.json', 'metrics.csv'):
        continue
      data = tar.extractfile(member).read()
      found.setdefault(parts[-2], {})[parts[-1]] = data
  return {name: (json.loads(files['hparams.json']),
                 pd.read_csv(io.BytesIO(files['metrics.csv'])).sort_values(
                     'round'))
          for name, files in found.items()
          if {'hparams.json', 'metrics.csv'} <= set(files)}


def _same(a, b) -> bool:
  """Flag values compared as written on a command line (800 = 800.0)."""
  try:
    return float(a) == float(b)
  except (TypeError, ValueError):
    return str(a).lower() == str(b).lower()


def _value(hparams: dict, metrics: pd.DataFrame, flag: str):
  """A run's value of `flag`: its metrics column's (one value in every
  round, else no value), else its hparams'."""
  if flag in metrics:
    values = metrics[flag].dropna().unique()
    return values[0] if len(values) == 1 else float('nan')
  return hparams.get(flag)


def _matches(name: str, hparams: dict, metrics: pd.DataFrame,
             selector: dict) -> bool:
  for flag, wanted in selector.items():
    if flag == 'grid':
      if name != wanted and not name.startswith(f'{wanted}__'):
        return False
    elif not _same(_value(hparams, metrics, flag), wanted):
      return False
  return True


def _rounds_to(metrics: pd.DataFrame, level: float) -> float:
  """The first round whose test accuracy reaches `level`; the last round
  + 1 if none does (it needs more: never dropped as missing)."""
  reached = metrics[metrics[ACCURACY] >= level]
  return float(reached['round'].iloc[0] if len(reached)
               else metrics['round'].max() + 1)


def _at_first(metrics: pd.DataFrame, column: str, level: float,
              censored: bool) -> float:
  """`column` (carried forward) at the first row whose test accuracy
  reaches `level`; if none does, its last value when `censored` (it needs
  more), else NaN (the pair is left out)."""
  rows = metrics[[ACCURACY, column]].ffill()
  reached = rows[rows[ACCURACY] >= level][column]
  if len(reached):
    return float(reached.iloc[0])
  values = rows[column].dropna()
  return float(values.iloc[-1]) if censored and len(values) else math.nan


_ROUNDS_TO_LEVEL = re.compile(r'rounds to (\d+)% test accuracy')
_EXAMPLES_TO_LEVEL = re.compile(r'examples trained to (\d+)% test accuracy')
_TRAIN_GAP = re.compile(r'train accuracy \(last (\d+) rounds\) minus final'
                        r' test accuracy')
_NORM_FROM = re.compile(r'mean ‖Δ‖ from round (\d+)')


# 0/1: the server model's accuracy on a set of clients fell by half or
# more from one round to the next (the paper's Section 3.1 failure).
_FAILED_ON = {'the server model failed (0/1)': 'cohort/accuracy',
              'the server model failed on the validation clients (0/1)':
                  'validation/accuracy'}


def _failed(metrics: pd.DataFrame, column: str) -> float:
  if column not in metrics:
    return math.nan
  rows = metrics[['round', column]].dropna()
  rounds, accuracy = rows['round'].tolist(), rows[column].tolist()
  return float(any(
      rounds[i] == rounds[i - 1] + 1 and accuracy[i - 1] > 0
      and accuracy[i] <= accuracy[i - 1] / 2 for i in range(1, len(rows))))


def quantity(name: str, hparams: dict, metrics: pd.DataFrame) -> float:
  """The run's value of the quantity the protocol names (KeyError: one
  this script does not know)."""
  if name in _FAILED_ON:
    return _failed(metrics, _FAILED_ON[name])
  norm = _NORM_FROM.fullmatch(name)
  if norm:
    values = metrics[metrics['round'] >= int(norm.group(1))]['update_norm']
    return float(values.dropna().mean())
  if ACCURACY not in metrics:
    return math.nan
  accuracy = metrics[ACCURACY].dropna()
  if name == 'rounds to the target':
    return _rounds_to(metrics, float(hparams['target_accuracy']))
  if name == 'gradient computations to the target':
    return _at_first(metrics, 'cumulative_gradient_computations',
                     float(hparams['target_accuracy']), censored=False)
  level = _ROUNDS_TO_LEVEL.fullmatch(name)
  if level:
    return _rounds_to(metrics, int(level.group(1)) / 100)
  level = _EXAMPLES_TO_LEVEL.fullmatch(name)
  if level:
    return _at_first(metrics, 'cumulative_examples_processed',
                     int(level.group(1)) / 100, censored=True)
  gap = _TRAIN_GAP.fullmatch(name)
  if gap:
    last = metrics[metrics['round'] > metrics['round'].max()
                   - int(gap.group(1))]['train/accuracy'].dropna()
    return (float(last.mean() - accuracy.iloc[-1])
            if len(last) and len(accuracy) else math.nan)
  if name not in ('final test accuracy', 'peak minus final test accuracy',
                  'mean test accuracy over evaluations'):
    raise KeyError(name)
  if not len(accuracy):
    return math.nan
  if name == 'final test accuracy':
    return float(accuracy.iloc[-1])
  if name == 'peak minus final test accuracy':
    return float(accuracy.max() - accuracy.iloc[-1])
  return float(accuracy.mean())


def _pairs(runs, effect) -> tuple[np.ndarray, np.ndarray]:
  sides = []
  for side in ('treatment', 'baseline'):
    values = {}
    for name, (hparams, metrics) in runs.items():
      if _matches(name, hparams, metrics, effect[side]):
        key = tuple(str(_value(hparams, metrics, f))
                    for f in effect['pair_by'])
        assert key not in values, f'two runs pair as {key}: {name}'
        values[key] = quantity(effect['quantity'], hparams, metrics)
    sides.append(values)
  keys = sorted(k for k in sides[0].keys() & sides[1].keys()
                if not math.isnan(sides[0][k] + sides[1][k]))
  return (np.array([sides[0][k] for k in keys]),
          np.array([sides[1][k] for k in keys]))


def _newcombe(a: int, b: int, c: int, d: int) -> tuple[float, float]:
  """Newcombe's (1998) method 10 for a paired difference of proportions,
  (a + b) / n - (a + c) / n: each proportion's Wilson interval, combined
  with the pairs' phi correlation."""
  n = a + b + c + d
  p1, p2 = (a + b) / n, (a + c) / n
  l1, u1 = proportion.proportion_confint(a + b, n, 0.05, method='wilson')
  l2, u2 = proportion.proportion_confint(a + c, n, 0.05, method='wilson')
  product = (a + b) * (c + d) * (a + c) * (b + d)
  phi = (a * d - b * c) / math.sqrt(product) if product else 0.0
  delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
                        + (u2 - p2) ** 2))
  epsilon = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1)
                          * (p2 - l2) + (p2 - l2) ** 2))
  return max(-1.0, p1 - p2 - delta), min(1.0, p1 - p2 + epsilon)


def _binary_test(treated, base) -> dict:
  """Exact McNemar (p = 1 without a discordant pair) with its exact
  interval: Clopper-Pearson of the discordant pairs' split, mapped to the
  difference; Newcombe's without a discordant pair."""
  t, b = treated.astype(bool), base.astype(bool)
  both, only_t = int(np.sum(t & b)), int(np.sum(t & ~b))
  only_b, neither = int(np.sum(~t & b)), int(np.sum(~t & ~b))
  discordant, n = only_t + only_b, len(t)
  if discordant:
    p = contingency_tables.mcnemar([[both, only_t], [only_b, neither]],
                                   exact=True).pvalue
    low, high = proportion.proportion_confint(only_t, discordant, 0.05,
                                              method='beta')
    low, high = [discordant / n * (2 * x - 1) for x in (low, high)]
  else:
    p = 1.0
    low, high = _newcombe(both, only_t, only_b, neither)
  return {'pairs': n, 'mean': (only_t - only_b) / n, 'low': float(low),
          'high': float(high), 'p': float(p)}


def _test(effect, treated, base) -> dict:
  if effect.get('outcome') == 'binary' and len(treated):
    return _binary_test(treated, base)
  diffs = treated - base
  if effect.get('relative'):
    diffs = diffs / np.abs(base)
  n, mean = len(diffs), float(np.mean(diffs)) if len(diffs) else math.nan
  if n < 2:
    return {'pairs': n, 'mean': mean, 'low': math.nan, 'high': math.nan,
            'p': math.nan}
  equal = bool(np.all(diffs == diffs[0]))
  if effect.get('test') == 'equivalence' and equal:
    # No spread for TOST: a sign test, every difference inside the margin.
    p = 0.5 ** n if abs(mean) < effect['margin'] else 1.0
    low = high = mean
  elif effect.get('test') == 'equivalence':
    described = weightstats.DescrStatsW(diffs)
    p = described.ttost_mean(-effect['margin'], effect['margin'])[0]
    low, high = described.tconfint_mean(alpha=0.1)
  elif equal:
    nonzero = int(np.count_nonzero(diffs))
    p = stats.binomtest(nonzero, nonzero).pvalue if nonzero else 1.0
    low = high = mean
  else:
    result = stats.ttest_1samp(diffs, 0.0)
    p = result.pvalue
    low, high = result.confidence_interval(0.95)
  return {'pairs': n, 'mean': mean, 'low': float(low), 'high': float(high),
          'p': float(p)}


def check(paper: str, experiment: str, archive: str = None,
          repo: str = REPO) -> list[dict]:
  """Each effect of the protocol, in its order: its claim, whether it is
  primary, and (where its quantity is known here) its pairs, mean
  difference, interval, p-value and Holm-corrected p-value."""
  with open(os.path.join(repo, 'reproduce', 'protocols', paper,
                         f'{experiment}.toml'), 'rb') as f:
    effects = tomllib.load(f).get('effects', [])
  runs = read_runs(archive or os.path.join(
      repo, 'results', paper, experiment, 'local_confirmatory.tar.xz'))
  rows = []
  for effect in effects:
    row = {'claim': effect['claim'], 'primary': effect.get('primary', True)}
    try:
      row.update(_test(effect, *_pairs(runs, effect)))
    except KeyError:
      row['not_checked'] = f'quantity {effect["quantity"]!r}'
    rows.append(row)
  corrected = [r for r in rows if r['primary'] and
               r.get('pairs', MIN_PAIRS) >= MIN_PAIRS]
  if corrected and not any('not_checked' in r for r in corrected):
    adjusted = multitest.multipletests([r['p'] for r in corrected],
                                       method='holm')[1]
    for row, p in zip(corrected, adjusted):
      row['p_holm'] = float(p)
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('paper')
  parser.add_argument('experiment')
  parser.add_argument('--archive', help='the runs (default: the committed'
                      ' confirmatory archive of the experiment)')
  args = parser.parse_args(argv)
  try:
    rows = check(args.paper, args.experiment, args.archive)
  except FileNotFoundError as e:
    print(f'error: {e.filename}: no such file', file=sys.stderr)
    return 2
  for row in rows:
    head = f'{"primary  " if row["primary"] else "secondary"} {row["claim"]}'
    if 'not_checked' in row:
      print(f'{head}: not checked ({row["not_checked"]})')
      continue
    holm = row.get('p_holm')
    print(f'{head}: {row["pairs"]} pairs, {row["mean"]:+.4g}'
          f' [{row["low"]:+.4g}, {row["high"]:+.4g}], p {row["p"]:.3g}'
          + ('' if holm is None else f', p (Holm) {holm:.3g}'))
  return 0


if __name__ == '__main__':
  sys.exit(main())
