"""AdaBest (Varno et al. 2022): Table 2, Figure 3, FedDyn's instability, mu,
beta and the compute cost of Tables 4-5.

Local scale: the bundled digits (MLP 2x100, non-convex) and LEAF's Synthetic
pooled and re-partitioned (`synthetic_partitioned`, logistic regression),
each over the paper's 100 training clients (IID or Dirichlet label skew 0.3,
0.03; balanced), standing in for EMNIST-L, CIFAR-10 and CIFAR-100. Seeds are
partition seeds, as the paper's ("5 random data partitioning seeds").
FedAvg is AdaBest with beta = mu = 0 (`adabest_tff`: tested equal to TFF's
FedAvg), so that all four share every client setting.

Why one module: the seven experiments share the paper's tasks, its four
algorithms, AdaBest's beta by participation (`_with_beta`, `best_beta`) and
the instability reading (supplementary Figures 4-5 reuse Figure 1's).
"""

import dataclasses
import os

import numpy as np
import pandas as pd

from reproduce import analysis
from reproduce import plots
from reproduce import sweep
from reproduce import core
from reproduce import verdicts

ALGORITHM = 'algorithm'
M = analysis.COHORT_SIZE
PARTITIONS = (('iid', None), ('alpha=0.3', '0.3'), ('alpha=0.03', '0.03'))
# Client participation -> rounds (the paper: 1k, 1.2k and 2k rounds).
PAPER_ROUNDS = {'1%': 1000, '10%': 1200, '100%': 2000}
LOCAL_ROUNDS = 150
# Table 2 at the local scale: the paper's 1,000 rounds at 1 % participation
# (one client a round, where drift correction has the most to do and a round
# is cheapest); fewer at 10 % and 100 %, where a round costs 10-100 clients.
TABLE2_LOCAL_ROUNDS = {'1%': 1000, '10%': 300, '100%': 150}
# "We apply this decay in our experiments when norm of h plateaus" (Section
# 3.5); the paper gives no schedule. AdaBest's beta halves after this many
# rounds without a new minimum of ||h^t|| (`--adabest_beta_decay_patience`).
TABLE2_BETA_DECAY_PATIENCE = '100'
# Table 2's partition seeds at the local scale (0-2).
TABLE2_LOCAL_SEEDS = 3
# Table 2's effects were declared on digits first, whose 359 test examples
# cannot resolve the paper's margins (one example is 0.28 points, the
# margins 0.2-2 points: `_resolution_notes`); the re-partitioned Synthetic's
# 11,179 can. The same effects on Synthetic were declared after its runs of
# seeds 0-2 had been seen, so they are tested on fresh partition seeds
# (3-7), at the participations where the paper reads AdaBest's margin (1 %
# and 10 %), every algorithm beside AdaBest as on digits.
TABLE2_FRESH_TASK = 'synthetic_partitioned'
TABLE2_FRESH_PARTICIPATIONS = ('1%', '10%')
TABLE2_FRESH_SEEDS = 5
FRESH = 'fresh'  # ends a fresh-seed grid's name (`_in_fresh_grid`)
ALGORITHMS = ('fedavg', 'feddyn', 'scaffold', 'adabest')
EMNIST_L_STAND_INS = ('emnist_l', 'digits', 'synthetic_partitioned')
LOCAL_SUBSTITUTES = (
    'The bundled digits (1,437 training images, MLP 2x100) and LEAF\'s'
    ' Synthetic re-partitioned (logistic regression) over 100 clients stand'
    ' in for EMNIST-L, CIFAR-10 and CIFAR-100 (100 clients); the paper\'s'
    ' 1,000 rounds at 1 % participation, 300 at 10 % and 150 at 100 %'
    ' instead of 1,200 and 2,000; 3 partition seeds instead of 5. The paper\'s'
    ' numbers shown are its EMNIST-L rows, the closest task. AdaBest\'s beta'
    ' as the paper\'s: tuned over {0.2, 0.4, 0.6} at 1 % participation on'
    ' the held-out validation clients (the best by final validation accuracy'
    ' is shown, on test; the 1 % effects read the digits\' choice,'
    ' `TABLE2_TUNED_BETA`), 0.96 at 10 %, 0.98 at 100 %. Beta decays as the'
    ' paper applies it, when ||h|| plateaus (Section 3.5); the paper gives no'
    ' schedule, so here beta halves after'
    f' {TABLE2_BETA_DECAY_PATIENCE} rounds without a new minimum of ||h||.'
    ' The effects were declared on digits, whose test split cannot resolve'
    ' the paper\'s margins (the resolution notes below); the same effects on'
    ' Synthetic, which can, were declared after its seeds 0-2 had been seen,'
    f' so they are tested on fresh partition seeds 3-7 (Dirichlet 0.3, 1 %'
    ' and 10 % participation; AdaBest at beta'
    ' `TABLE2_FRESH_TUNED_BETA`, the validation clients\' choice on seeds'
    ' 0-2, at 1 %), and the table and the tuning read seeds 0-2 only.')


# Section 4 / D: "for 1% client participation experiments we search beta in
# [0.2, 0.4, 0.6] ... 0.96 and 0.98 are selected for 10% and 100%".
LOW_PARTICIPATION_BETAS = ('0.2', '0.4', '0.6')
BETA_BY_PARTICIPATION = {'10%': '0.96', '100%': '0.98'}
BETA = 'adabest_beta'
MU = 'adabest_mu'


def _adabest_beta(participation: str):
  """AdaBest's beta at a participation rate: a flag value, or the search
  set (an axis) at 1 %, as the paper tuned it."""
  return BETA_BY_PARTICIPATION.get(participation, LOW_PARTICIPATION_BETAS)


def _with_beta(algorithm: str, participation: str, flags: dict,
               axes: tuple[sweep.Axis, ...]) -> tuple[dict, tuple]:
  """`flags` and `axes` with AdaBest's beta at `participation` (a flag, or
  an axis of the values searched); other algorithms' as they are."""
  if algorithm != 'adabest':
    return flags, axes
  beta = _adabest_beta(participation)
  if isinstance(beta, tuple):
    return flags, (*axes, sweep.Axis(BETA, beta))
  return {**flags, BETA: beta}, axes


def _task_flags(task: str, num_clients: int) -> dict:
  return {'task': task, 'num_clients': str(num_clients),
          'rounds_per_eval': '10'}


def _algorithm_flags(algorithm: str) -> dict:
  if algorithm == 'fedavg':
    return {'algorithm': 'adabest', 'adabest_beta': '0', 'adabest_mu': '0'}
  return {'algorithm': algorithm}


def _tasks(scale: str) -> tuple[str, ...]:
  return (('emnist_l', 'cifar10', 'cifar100_partitioned') if scale == 'paper'
          else ('digits', 'synthetic_partitioned'))


def table2_grids(scale: str) -> tuple[core.Grid, ...]:
  grids = []
  for task in _tasks(scale):
    for name, alpha in PARTITIONS:
      for participation, paper_rounds in PAPER_ROUNDS.items():
        cohort = str(int(participation[:-1]))  # of 100 clients
        for algorithm in ALGORITHMS:
          flags = {**_task_flags(task, 100), **_algorithm_flags(algorithm)}
          if alpha:
            flags['dirichlet_alpha'] = alpha
          grid_name = f'table2_{task}_{name.replace("=", "")}_{algorithm}'
          flags, axes = _with_beta(algorithm, participation, flags,
                                   (sweep.Axis(M, (cohort,)),))
          if algorithm == 'adabest' and flags.get(BETA, '0.96') != '0.96':
            grid_name += f'_beta{flags[BETA]}'  # 0.96: the flag's default
          if algorithm == 'adabest':
            flags['adabest_beta_decay_patience'] = TABLE2_BETA_DECAY_PATIENCE
          grids.append(core.Grid(
              grid_name, flags,
              paper_rounds if scale == 'paper'
              else TABLE2_LOCAL_ROUNDS[participation],
              axes=axes, seed_flag='partition_seed',
              tied_seed_flags=('seed',),
              max_seeds=None if scale == 'paper' else TABLE2_LOCAL_SEEDS))
  if scale != 'paper':
    grids += _table2_fresh_grids()
  return tuple(grids)


def _table2_fresh_name(algorithm: str) -> str:
  return f'table2_{TABLE2_FRESH_TASK}_alpha0.3_{algorithm}_{FRESH}'


def _table2_fresh_grids() -> list[core.Grid]:
  """Table 2's Synthetic, Dirichlet 0.3 cells at 1 % and 10 %
  participation on fresh partition seeds (3-7), AdaBest at one beta."""
  grids = []
  for participation in TABLE2_FRESH_PARTICIPATIONS:
    cohort = participation[:-1]  # of 100 clients
    for algorithm in ALGORITHMS:
      flags = {**_task_flags(TABLE2_FRESH_TASK, 100),
               **_algorithm_flags(algorithm), 'dirichlet_alpha': '0.3'}
      if algorithm == 'adabest':
        flags[BETA] = BETA_BY_PARTICIPATION.get(participation,
                                                TABLE2_FRESH_TUNED_BETA)
        flags['adabest_beta_decay_patience'] = TABLE2_BETA_DECAY_PATIENCE
      grids.append(core.Grid(
          _table2_fresh_name(algorithm), flags,
          TABLE2_LOCAL_ROUNDS[participation], axes=(sweep.Axis(M, (cohort,)),),
          seed_flag='partition_seed', tied_seed_flags=('seed',),
          first_seed=TABLE2_LOCAL_SEEDS))
  return grids


def _label(frame: pd.DataFrame) -> pd.Series:
  """`fedavg` for AdaBest with beta = mu = 0, else the algorithm."""
  beta = pd.to_numeric(frame.get('adabest_beta'), errors='coerce')
  mu = pd.to_numeric(frame.get('adabest_mu'), errors='coerce')
  fedavg = (frame[ALGORITHM] == 'adabest') & (beta == 0) & (mu == 0)
  return pd.Series(np.where(fedavg, 'fedavg', frame[ALGORITHM]),
                   index=frame.index)


def _partition(frame: pd.DataFrame) -> pd.Series:
  alpha = frame['dirichlet_alpha'] if 'dirichlet_alpha' in frame else np.nan
  return pd.Series([('iid' if pd.isna(a) else f'alpha={a:g}')
                    for a in pd.Series(alpha, index=frame.index)],
                   index=frame.index)


def _with_validation(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
  """Each run's final test `accuracy` and final `validation` accuracy (NaN
  without validation clients), in percent."""
  per_run = analysis.accuracy_by_run(frame, by=by)
  per_run['accuracy'] *= 100
  if analysis.VALIDATION_ACCURACY in frame:
    validation = analysis.accuracy_by_run(
        frame, analysis.VALIDATION_ACCURACY, by=by).set_index(analysis.RUN)
    per_run['validation'] = 100 * per_run[analysis.RUN].map(
        validation['accuracy'])
  else:
    per_run['validation'] = np.nan
  return per_run


def best_beta(per_run: pd.DataFrame, setting: list[str]
              ) -> tuple[pd.DataFrame, list[str]]:
  """AdaBest's runs at its best beta per setting, as the paper tuned beta at
  1 % participation: by mean final accuracy over seeds on the held-out
  *validation* clients (`validation` column, never the test clients' that
  are then reported; a tie within float rounding goes to the smaller beta,
  `analysis.best_of`); other algorithms' runs, and settings with one beta,
  as they are. Returns the runs kept and a note per tuned setting.

  Raises:
    ValueError: If a setting with several betas has no validation accuracy
      to choose on.
  """
  adabest = (per_run['label'] == 'adabest') & per_run[BETA].notna()
  tuned = per_run[adabest]
  keep = ~adabest
  notes = []
  for key, part in tuned.groupby(setting, sort=False):
    if part[BETA].nunique() < 2:
      keep |= per_run.index.isin(part.index)
      continue
    means = part.groupby(BETA)['validation'].mean().dropna()
    if means.empty:
      raise ValueError(
          f'AdaBest\'s beta has no validation accuracy to be tuned on at'
          f' {key}; the runs need validation clients')
    best, tied = analysis.best_of(means)
    keep |= per_run.index.isin(part.index[part[BETA] == best])
    key = key if isinstance(key, tuple) else (key,)
    where = ' '.join(f'{k:g}' if isinstance(k, float) else str(k)
                     for k in key)
    notes.append(
        f'AdaBest\'s beta tuned over {", ".join(f"{b:g}" for b in means.index)}'
        f' at {where} on the validation clients: {best:g} (final validation'
        f' accuracy {", ".join(f"{v:.1f}" for v in means)}'
        + (f'; {" and ".join(f"{b:g}" for b in tied)} tie within float'
           f' rounding, and a tie goes to the smallest'
           if len(tied) > 1 else '') + ').')
  return per_run[keep], notes


def analyze_table2(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """The paper's table (seeds 0-2, AdaBest at the validation clients'
  beta at 1 %), its figures, and the notes; the fresh seeds' runs (the
  Synthetic effects' replication) apart, in a note of their own."""
  fresh = frame[_in_fresh_grid(frame)]
  frame = frame[~_in_fresh_grid(frame)]
  frame = frame.assign(label=_label(frame), partition=_partition(frame))
  if BETA not in frame:
    frame[BETA] = np.nan
  by = ['task', M, 'partition', 'label']
  per_run = _with_validation(frame, [*by, BETA])
  per_run, beta_notes = best_beta(per_run, ['task', M, 'partition'])
  frame = frame[frame[analysis.RUN].isin(per_run[analysis.RUN])]
  stats = core.over_seeds(per_run, by, ['accuracy'])
  setting = [f'participation={int(m)}% {p}'
             for m, p in zip(stats[M], stats['partition'])]
  stats[core.ROW] = [f'{r} ({t})' for r, t in zip(setting, stats['task'])]
  # Beside the paper's EMNIST-L rows: EMNIST-L itself and the local tasks
  # standing in for it (CIFAR has its own rows in the paper).
  stats[core.PAPER_ROW] = [r if t in EMNIST_L_STAND_INS else None
                           for r, t in zip(setting, stats['task'])]
  stats[core.QUANTITY] = [f'test_accuracy/{a}' for a in stats['label']]
  table = stats[[core.ROW, core.PAPER_ROW, core.QUANTITY, core.VALUE,
                 core.STD, core.NUM_RUNS]]
  # The paper's EMNIST-L rows beside each local task's same setting.
  figures = []
  for task, part in frame.groupby('task', sort=False):
    name = f'accuracy_vs_rounds_{task}.png'
    plots.plot_accuracy_vs_rounds(part, os.path.join(output_dir, name),
                                  by=[M, 'partition', 'label'],
                                  title=f'{task}: test accuracy')
    figures.append(name)
  best = stats.loc[stats.groupby(['task', M, 'partition'])[core.VALUE]
                   .idxmax()]
  notes = ['Best algorithm per setting (package): ' + '; '.join(
      f'{t} {int(m)}% {p}: {a}' for t, m, p, a in zip(
          best['task'], best[M], best['partition'], best['label'])) + '.',
           *beta_notes, *_tuned_beta_notes(per_run),
           *_beta_decay_notes(frame), *_resolution_notes(frame)]
  if not fresh.empty:
    notes += _table2_fresh_reading(fresh)
  return core.Analysis(table, figures, notes)


def _table2_fresh_reading(fresh: pd.DataFrame) -> list[str]:
  """The fresh seeds' final test accuracy, ‖x‖ and server ‖h‖ per
  participation and algorithm, mean over seeds; and per participation
  whether FedDyn's ‖x‖ outgrows AdaBest's and, if it does, whether its
  accuracy falls from its peak and its test loss climbs (Figure 1's
  collapse) or not."""
  fresh = fresh.assign(label=_label(fresh))
  server_h = verdicts.final('finalizer/oracle_gradient_estimate_norm')
  runs = pd.DataFrame([
      {M: run[M].iloc[0], 'label': run['label'].iloc[0],
       'accuracy': _ACCURACY.of_run(run), 'drop': _COLLAPSE.of_run(run),
       'rise': _LOSS_RISE.of_run(run), 'norm': _MODEL_NORM.of_run(run),
       'h': server_h.of_run(run)}
      for _, run in fresh.groupby(analysis.RUN)])
  means = runs.groupby([M, 'label']).mean()
  cells = []
  for (m, label), row in means.iterrows():
    h = '' if pd.isna(row.h) else f', ‖h‖ {row.h:.3g}'
    cells.append(f'{label} at {m:g} %: {100 * row.accuracy:.2f}'
                 f' (‖x‖ {row.norm:.3g}{h})')
  notes = [f'Fresh seeds ({_seed_span(fresh)}) on {TABLE2_FRESH_TASK}, Dirichlet 0.3,'
           ' final test accuracy in points, ‖x‖ and the server\'s ‖h‖ (mean'
           f' over seeds): {"; ".join(cells)}.']
  for m in sorted(means.index.get_level_values(M).unique()):
    if not {(m, 'feddyn'), (m, 'adabest')} <= set(means.index):
      continue
    feddyn, adabest = means.loc[(m, 'feddyn')], means.loc[(m, 'adabest')]
    if not feddyn.norm > adabest.norm:
      notes.append(
          f'At {m:g} %, FedDyn\'s ‖x‖ ends below AdaBest\'s'
          f' ({feddyn.norm:.3g} and {adabest.norm:.3g}): the growth the'
          ' paper blames for FedDyn\'s collapse does not occur at this'
          ' participation, so nothing costs FedDyn accuracy here.')
      continue
    loss = ('' if pd.isna(feddyn.rise) else
            f' and its test loss at {feddyn.rise:.2f} times its minimum'
            f' (AdaBest {adabest.rise:.2f})')
    # Figure 1's collapse: accuracy off its peak, the loss climbing back.
    collapses = feddyn['drop'] >= 0.01 or feddyn.rise >= 1.1
    notes.append(
        f'At {m:g} %, FedDyn\'s ‖x‖ ends {feddyn.norm / adabest.norm:.1f}'
        ' times AdaBest\'s (the growth the paper blames for FedDyn\'s'
        ' collapse), and its test accuracy ends'
        f' {100 * feddyn["drop"]:.2f} points below its peak (AdaBest'
        f' {100 * adabest["drop"]:.2f}){loss}: ' + (
            'the growth comes with a fall here, as in the paper\'s Figure 1.'
            if collapses else
            'a growing ‖x‖ does not collapse this task. Its labels come from'
            ' one linear model up to each client\'s scale, so the logistic'
            ' regression\'s loss keeps falling as ‖x‖ grows along that'
            ' model; the paper finds FedDyn\'s stability falling with the'
            ' task\'s difficulty (Section 3.5), and this task is convex.'))
  return notes


def _resolution_notes(frame: pd.DataFrame) -> list[str]:
  """How many of each task's test examples the paper's margins of AdaBest
  (its EMNIST-L rows of Table 2) amount to: a margin of a fraction of one
  test example cannot show in a task's final test accuracy."""
  if 'test/num_examples' not in frame:
    return []
  paper = core.paper_numbers('adabest', 'table2')
  paper = paper.assign(algorithm=paper[core.QUANTITY].str.split('/').str[1])
  wide = paper.pivot(index=core.ROW, columns='algorithm', values=core.VALUE)
  if 'adabest' not in wide:
    return []
  margins = {other: (wide['adabest'] - wide[other]).agg(['min', 'max'])
             for other in ('fedavg', 'scaffold', 'feddyn') if other in wide}
  notes = []
  for task, part in frame.groupby('task', sort=False):
    examples = part['test/num_examples'].dropna()
    if examples.empty:
      continue
    size = float(examples.median())
    point = 100 / size  # Accuracy points per test example.
    notes.append(
        f'Resolution: the test split of {task} holds {size:,.0f} examples,'
        f' one example {point:.2f} points of accuracy. The paper\'s margins of'
        ' AdaBest over each algorithm (EMNIST-L, Table 2, every setting) are '
        + '; '.join(f'{lo:+.2f} to {hi:+.2f} points over {other}'
                    f' ({lo / point:+.1f} to {hi / point:+.1f} test examples'
                    ' here)'
                    for other, (lo, hi) in margins.items()) + '.')
  return notes


def _tuned_beta_notes(per_run: pd.DataFrame) -> list[str]:
  """Whether the validation clients still choose the betas the 1 % effects
  read, on the effects' tasks and partition: `TABLE2_TUNED_BETA` on digits,
  `TABLE2_FRESH_TUNED_BETA` on the fresh seeds' Synthetic."""
  notes = []
  for task, who, name, beta in (
      ('digits', 'The 1 % effects', 'TABLE2_TUNED_BETA', TABLE2_TUNED_BETA),
      (TABLE2_FRESH_TASK, 'The fresh seeds\' 1 % effects',
       'TABLE2_FRESH_TUNED_BETA', TABLE2_FRESH_TUNED_BETA)):
    chosen = per_run[(per_run['label'] == 'adabest') & (per_run[M] == 1)
                     & (per_run['partition'] == 'alpha=0.3')
                     & (per_run['task'] == task)][BETA].dropna().unique()
    if len(chosen) != 1:
      continue
    same = float(beta) == chosen[0]
    notes.append(
        f'{who} read AdaBest at beta {beta} (`{name}`), ' + (
            f'the validation clients\' choice at {task}, Dirichlet 0.3.'
            if same else
            f'which the validation clients no longer choose at {task},'
            f' Dirichlet 0.3 (they choose {chosen[0]:g}): set it to their'
            ' choice and rerun.'))
  return notes


def _beta_decay_notes(frame: pd.DataFrame) -> list[str]:
  """AdaBest's beta at its runs' last round, per cohort size: how far the
  plateau rule decayed it (`finalizer/beta`)."""
  if 'finalizer/beta' not in frame:
    return []
  runs = frame[frame['label'] == 'adabest'].dropna(subset=['finalizer/beta'])
  if runs.empty:
    return []
  last = runs.sort_values(analysis.ROUND).groupby(analysis.RUN).tail(1)
  parts = [f'{task}, {int(m)} a round: {beta:g} -> '
           f'{part["finalizer/beta"].mean():.3g}'
           for (task, m, beta), part in last.groupby(['task', M, BETA],
                                                      sort=True)]
  return ['AdaBest\'s beta, as set -> at the last round (mean over runs,'
          ' after the decay on plateaus of ||h||): ' + '; '.join(parts) + '.']


# Seeds 0-2 for every grid (`max_seeds`), 3-7 for the fresh ones.
_table2_setting = core.setting_fn(table2_grids, TABLE2_FRESH_SEEDS,
                                  LOCAL_SUBSTITUTES)


INSTABILITY_SUBSTITUTES = (
    'The digits MLP (non-convex) over 1,000 clients with Dirichlet 0.3 label'
    ' skew, 5 clients per round, stands in for CIFAR-100\'s ResNet over 1,000'
    ' clients; 5,000 rounds, as the paper\'s Figure 1, and its 5 partition'
    ' seeds. AdaBest runs at the beta `fig_beta` chooses on the validation'
    ' clients at 5 of 1,000 (0.5, the lowest of its grid: a digits client'
    ' holds 1-2 images where a CIFAR-100 client holds 50, so its'
    ' pseudo-gradients are noisier, and Section 3.5 asks for a lower beta'
    ' when they are), and beside it at the paper\'s (0.9: supplementary'
    ' Figure 7 finds 0.8-0.95 best on CIFAR-100); the effects read the tuned'
    ' one. Both decay beta as the paper does when ||h|| plateaus (halved'
    f' after {TABLE2_BETA_DECAY_PATIENCE} rounds without a new minimum of'
    ' ||h||). The paper finds FedDyn\'s stability falling with the task\'s'
    ' difficulty (Section 3.5), and digits is far easier than CIFAR-100: so'
    ' the test loss, Figure 1\'s top panel (log scale), is read beside the'
    ' accuracy, whose argmax a growing ‖x‖ can leave in place while the loss'
    ' grows.')

# Supplementary Figure 7's best range at 5 of 1,000 clients a round
# (CIFAR-100: 0.8-0.95): the paper's value.
INSTABILITY_BETA = '0.9'
# The beta `fig_beta` chooses on the validation clients at 5 of 1,000 on
# digits (its report says whether it still does: `analyze_beta`).
INSTABILITY_TUNED_BETA = '0.5'
# Figure 1's length, at both scales.
INSTABILITY_ROUNDS = 5000


def instability_betas(scale: str) -> tuple[str, ...]:
  """AdaBest's betas at 5 of 1,000, the one the effects read first: the
  paper's on CIFAR-100; on digits the one tuned there, then the paper's."""
  if scale == 'paper':
    return (INSTABILITY_BETA,)
  return (INSTABILITY_TUNED_BETA, INSTABILITY_BETA)


def instability_grids(scale: str) -> tuple[core.Grid, ...]:
  task = 'cifar100_partitioned' if scale == 'paper' else 'digits'
  flags = {**_task_flags(task, 1000), M: '5', 'dirichlet_alpha': '0.3'}
  rounds = INSTABILITY_ROUNDS
  adabest = tuple(
      core.Grid(f'instability_{task}_adabest' + (
          '' if beta == INSTABILITY_BETA else f'_beta{beta}'),
                {**flags, ALGORITHM: 'adabest', BETA: beta,
                 'adabest_beta_decay_patience': TABLE2_BETA_DECAY_PATIENCE},
                rounds, seed_flag='partition_seed', tied_seed_flags=('seed',))
      for beta in instability_betas(scale))
  return (core.Grid(f'instability_{task}', flags, rounds,
                    axes=(sweep.Axis(ALGORITHM, ('feddyn', 'scaffold')),),
                    seed_flag='partition_seed',
                    tied_seed_flags=('seed',)),
          *adabest)


def _with_beta_label(frame: pd.DataFrame) -> pd.DataFrame:
  """AdaBest's runs named with their beta (`adabest beta=0.5`) where the
  frame holds more than one."""
  if BETA not in frame:
    return frame
  adabest = frame[ALGORITHM] == 'adabest'
  if frame.loc[adabest, BETA].nunique() < 2:
    return frame
  labels = frame[ALGORITHM].where(
      ~adabest, 'adabest beta=' + frame[BETA].map(lambda b: f'{b:g}'))
  return frame.assign(**{ALGORITHM: labels})


# The local task of the experiments whose effects need a test split that
# resolves the paper's margins (issue 91): LEAF Synthetic's training
# examples pooled and re-partitioned, its ~11k test examples the test set
# (one example is 0.01 points; digits' 359 test images made it 0.28).
SPLIT_RESOLVING_TASK = 'synthetic_partitioned'
_SPLIT_RESOLVING_WHY = (
    ' LEAF Synthetic\'s training examples pooled and re-partitioned'
    ' (`synthetic_partitioned`, logistic regression) stand in for the'
    ' paper\'s images: its ~11k test examples resolve the paper\'s margins,'
    ' which digits\' 359 test images could not. What the effects read is'
    ' the server state\'s accumulation of client gradients under partial'
    ' participation (FedDyn\'s h, AdaBest\'s decayed h), which needs no'
    ' non-convex model.')
EASY_TASK_SUBSTITUTES = (
    'Synthetic over 100 IID clients, 5 per round, stands in for'
    ' EMNIST-L\'s 100 IID training clients; 5,000 rounds. AdaBest at its'
    ' default beta (0.96), decayed on plateaus of ||h|| as in'
    ' `fig_feddyn_instability`.' + _SPLIT_RESOLVING_WHY)


EASY_TASK_ROUNDS = 5000


def easy_task_grids(scale: str) -> tuple[core.Grid, ...]:
  # Supplementary D.3 / Figure 4: the instability on an easy task (EMNIST-L,
  # 100 IID training clients) over many rounds; Figure 5 reads the same
  # runs' train and test accuracy.
  task = 'emnist_l' if scale == 'paper' else SPLIT_RESOLVING_TASK
  flags = {**_task_flags(task, 100), M: '5'}
  return (core.Grid(f'easy_{task}', flags, EASY_TASK_ROUNDS,
                    axes=(sweep.Axis(ALGORITHM, ('feddyn', 'scaffold')),),
                    seed_flag='partition_seed',
                    tied_seed_flags=('seed',)),
          core.Grid(f'easy_{task}_adabest',
                    {**flags, ALGORITHM: 'adabest',
                     'adabest_beta_decay_patience':
                         TABLE2_BETA_DECAY_PATIENCE}, EASY_TASK_ROUNDS,
                    seed_flag='partition_seed',
                    tied_seed_flags=('seed',)))


def analyze_easy_task(frame: pd.DataFrame, output_dir: str
                      ) -> core.Analysis:
  result = analyze_instability(frame, output_dir)
  # Figure 5: train (the round's clients, while training) and test accuracy.
  name = 'train_vs_test_accuracy.png'
  long = pd.concat([
      frame.assign(split='train', accuracy=frame['train/accuracy']),
      frame.assign(split='test', accuracy=frame['test/accuracy']),
  ], ignore_index=True)
  plots.plot_curves(long, os.path.join(output_dir, name), 'accuracy',
                    by=[ALGORITHM, 'split'], title='Train and test accuracy')
  train = frame.groupby(analysis.RUN).agg(
      algorithm=(ALGORITHM, 'first'),
      train=('train/accuracy',
             lambda a: a.dropna().tail(50).mean()))
  rows = [{core.ROW: algorithm, core.QUANTITY: 'train_accuracy_last_50_rounds',
           core.VALUE: part['train'].mean(), core.STD: part['train'].std(),
           core.NUM_RUNS: len(part)}
          for algorithm, part in train.groupby('algorithm')]
  table = pd.concat([result.table, pd.DataFrame(rows)], ignore_index=True
                    ).sort_values(core.ROW, kind='stable')
  return core.Analysis(table, [*result.figures, name], result.notes)


COLLAPSE_DROP = 0.1  # best minus final test accuracy


def _norm_columns(frame: pd.DataFrame) -> list[str]:
  """The norms the stateful algorithms log: ‖x‖ (`model_norms/...`), the
  server's ‖h‖ (`finalizer/..._norm`) and the cohort's mean client-state norm
  (`client_states/mean_norm`: h_i, or SCAFFOLD's c_i)."""
  return [c for c in frame.columns
          if c.startswith(('model_norms/', 'client_states/')) or (
              c.endswith('_norm') and c.startswith('finalizer/'))]


def analyze_instability(frame: pd.DataFrame, output_dir: str
                        ) -> core.Analysis:
  frame = _with_beta_label(frame)
  by = [ALGORITHM]
  accuracy = analysis.accuracy_by_run(frame, by=by)
  best = analysis.accuracy_by_run(frame, how='best', by=by)
  accuracy['drop'] = best['accuracy'] - accuracy['accuracy']
  rows = []
  for quantity, column, data in (('final_test_accuracy', 'accuracy', accuracy),
                                 ('best_minus_final', 'drop', accuracy)):
    for algorithm, part in data.groupby(ALGORITHM):
      rows.append({core.ROW: algorithm, core.QUANTITY: quantity,
                   core.VALUE: part[column].mean(),
                   core.STD: part[column].std(), core.NUM_RUNS: len(part)})
  figures = []
  # Figure 1 reads the test loss (log scale) above ‖x‖ and the accuracy.
  loss = [analysis.TEST_LOSS] if analysis.TEST_LOSS in frame else []
  for column in [analysis.TEST_ACCURACY, *loss, *_norm_columns(frame)]:
    name = column.replace('/', '_') + '.png'
    plots.plot_curves(frame, os.path.join(output_dir, name), column, by=by,
                      log_y=column != 'test/accuracy', title=column)
    figures.append(name)
    if column == analysis.TEST_ACCURACY:
      continue
    last = frame.dropna(subset=[column]).groupby(analysis.RUN).agg(
        algorithm=(ALGORITHM, 'first'), value=(column, 'last'))
    for algorithm, part in last.groupby(ALGORITHM):
      rows.append({core.ROW: algorithm, core.QUANTITY: f'final {column}',
                   core.VALUE: part['value'].mean(),
                   core.STD: part['value'].std(), core.NUM_RUNS: len(part)})
  notes = []
  if not _norm_columns(frame):
    notes.append('The runs log none of ‖x‖, ‖h‖, mean ‖h_i‖.')
  else:
    notes.append(_norm_growth_note(frame))
  if analysis.TEST_LOSS in frame:
    runs = frame.groupby(analysis.RUN)
    rise = pd.Series({run: _LOSS_RISE.of_run(rows) for run, rows in runs})
    rise = rise.groupby(runs[ALGORITHM].first()).mean().dropna()
    notes.append('The test loss ended at its minimum times (mean over'
                 ' seeds): ' + ', '.join(f'{a} {r:.3g}'
                                         for a, r in rise.items()) + '.')
  drops = accuracy.groupby(ALGORITHM)['drop'].mean()
  collapsed = sorted(drops[drops > COLLAPSE_DROP].index)
  for algorithm in drops.index[drops.index.str.startswith('feddyn')]:
    if drops[algorithm] <= COLLAPSE_DROP:
      notes.append(
          f'{algorithm} fell {drops[algorithm]:.3f} from its best test'
          ' accuracy (mean over seeds), where the paper\'s FedDyn collapses;'
          ' the paper expects less stability on harder tasks (Section'
          ' 3.5).')
  notes.append(
      (f'Collapsed (test accuracy fell by more than {COLLAPSE_DROP:g} from its'
       f' best, mean over seeds): {", ".join(collapsed)}.' if collapsed else
       f'No algorithm\'s test accuracy fell by more than {COLLAPSE_DROP:g}'
       ' from its best.') +
      ' The paper reports FedDyn collapsing and AdaBest stable (Figure 1);'
      ' read ‖x‖ (`model_norms/global_model_norm`) beside the accuracy.')
  return core.Analysis(pd.DataFrame(rows).sort_values(core.ROW,
                                                      kind='stable'),
                       figures, notes)


NORM_GROWTH = 1.1  # ‖x‖ at the last round over ‖x‖ halfway
_NORM_NAMES = {'model_norms/global_model_norm': '‖x‖',
               'finalizer/oracle_gradient_estimate_norm': 'the server\'s ‖h‖',
               'client_states/mean_norm': 'the cohort\'s mean ‖h_i‖ (SCAFFOLD:'
                                          ' ‖c_i‖)'}


def _norm_growth_note(frame: pd.DataFrame) -> str:
  """How ‖x‖, ‖h‖, mean ‖h_i‖ and the test loss move over the run, per
  algorithm: their mean over seeds at a tenth, half and all of the rounds
  (the paper's mechanism is the norms' growth, Section 3.4; Figure 1 shows
  the test loss growing with them)."""
  last = int(frame[analysis.ROUND].max())
  rounds = sorted({max(1, last // 10), max(1, last // 2), last})
  parts = []
  for column, name in {**_NORM_NAMES,
                       analysis.TEST_LOSS: 'the test loss'}.items():
    if column not in frame:
      continue
    values = frame[frame[analysis.ROUND].isin(rounds)].groupby(
        [ALGORITHM, analysis.ROUND])[column].mean().dropna()
    per_algorithm = [
        f'{algorithm} ' + ', '.join(f'{v:.3g}' for v in part.to_numpy())
        for algorithm, part in values.groupby(level=0)]
    if per_algorithm:
      parts.append(f'{name[0].upper()}{name[1:]}: ' + '; '.join(
          per_algorithm))
  note = (f'At rounds {", ".join(map(str, rounds))} (mean over seeds).'
          ' ' + '. '.join(parts) + '.')
  # The paper's claim is about both ‖x‖ and the server's ‖h‖.
  for column in ('model_norms/global_model_norm',
                 'finalizer/oracle_gradient_estimate_norm'):
    if column not in frame or len(rounds) != 3:
      continue
    x = frame[frame[analysis.ROUND].isin(rounds[1:])].groupby(
        [ALGORITHM, analysis.ROUND])[column].mean().unstack()
    growth = (x[rounds[2]] / x[rounds[1]]).dropna()
    growing = [f'{a} (x{g:.2f})' for a, g in growth.items()
               if g > NORM_GROWTH]
    name = _NORM_NAMES[column]
    note += (f' {name[0].upper()}{name[1:]} still growing over the second'
             f' half (by more than {NORM_GROWTH - 1:.0%}): '
             + (', '.join(growing) or 'none') + '.')
  return note


# Supplementary D.5 runs Figure 4's easy task (D.3) "for a large number of
# rounds"; at the local scale fewer than its 5,000 for cost (40 runs).
MU_LOCAL_ROUNDS = 2000
MU_VALUES = ('0.02', '0.04', '0.08', '0.16')


def mu_grids(scale: str) -> tuple[core.Grid, ...]:
  # Supplementary D.5 / Figure 6: mu in {0.02 * 2^k : k = 1..3} (and the
  # default 0.02), AdaBest and FedDyn, on D.3's easy task (EMNIST-L, 100 IID
  # clients, 5 a round), AdaBest decaying beta as in `fig_easy_task`.
  task = 'emnist_l' if scale == 'paper' else SPLIT_RESOLVING_TASK
  flags = {**_task_flags(task, 100), M: '5'}
  rounds = EASY_TASK_ROUNDS if scale == 'paper' else MU_LOCAL_ROUNDS
  mu = (sweep.Axis(MU, MU_VALUES),)
  return (core.Grid(f'mu_{task}_feddyn', {**flags, ALGORITHM: 'feddyn'},
                    rounds, axes=mu, seed_flag='partition_seed',
                    tied_seed_flags=('seed',)),
          core.Grid(f'mu_{task}_adabest',
                    {**flags, ALGORITHM: 'adabest',
                     'adabest_beta_decay_patience':
                         TABLE2_BETA_DECAY_PATIENCE}, rounds, axes=mu,
                    seed_flag='partition_seed',
                    tied_seed_flags=('seed',)))


MU_SUBSTITUTES = (
    'Synthetic over 100 IID clients, 5 per round, stands in for'
    ' EMNIST-L\'s 100 IID training clients, the setting of supplementary D.3'
    ' that D.5 names; 2,000 rounds, not Figure 4\'s 5,000, for cost (40 runs):'
    ' on digits FedDyn\'s ‖x‖ grew from the first hundreds of rounds, so'
    ' its dependence on mu has rounds to act.'
    ' AdaBest at its default beta (0.96), decayed on plateaus of ||h||.'
    + _SPLIT_RESOLVING_WHY)


def analyze_mu(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """Figure 6: test accuracy and ‖x‖ over the rounds per algorithm and mu
  (`_sensitivity` reads the accuracy), each algorithm's final ‖x‖ per mu,
  and how far its final accuracy and ‖x‖ spread over mu."""
  result = _sensitivity(MU, [ALGORITHM])(frame, output_dir)
  norm = 'model_norms/global_model_norm'
  if norm not in frame:
    return result
  name = 'model_norm_vs_rounds_per_mu.png'
  plots.plot_curves(frame, os.path.join(output_dir, name), norm,
                    by=[MU], panels=[ALGORITHM], log_y=True,
                    title='‖x‖ per mu')
  last = frame.dropna(subset=[norm]).groupby(analysis.RUN).agg(
      algorithm=(ALGORITHM, 'first'), mu=(MU, 'first'), value=(norm, 'last'))
  means = last.groupby(['algorithm', 'mu'])['value'].agg(['mean', 'std',
                                                          'count'])
  rows = [{core.ROW: f'algorithm={a}', core.QUANTITY: f'final ‖x‖/{MU}={m:g}',
           core.VALUE: r['mean'], core.STD: r['std'],
           core.NUM_RUNS: int(r['count'])} for (a, m), r in means.iterrows()]
  spreads = []
  for algorithm, part in means['mean'].groupby(level=0):
    part = part.droplevel(0)
    spreads.append(f'{algorithm} {part.min():.3g} (mu={part.idxmin():g}) to'
                   f' {part.max():.3g} (mu={part.idxmax():g})')
  table = pd.concat([result.table, pd.DataFrame(rows)], ignore_index=True
                    ).sort_values(core.ROW, kind='stable')
  return core.Analysis(
      table, [*result.figures, name],
      [*result.notes, 'Final ‖x‖ over mu (mean over seeds): '
       + '; '.join(spreads) + '.'])


# Supplementary D.6 / Figure 7 at the local scale. The first runs
# (partition seeds 0-4) put digits' optimum lower than CIFAR-100's: at 5 of
# 1,000 the validation clients chose beta 0.5 and beta 0.9 collapsed too (a
# digits client holds 1-2 images, so its pseudo-gradients are noisier, and
# D.6 asks for a lower beta when they are), so Figure 7's own pairs (0.9 vs
# 1 at 5; 1 at 50 vs 5) test the paper's CIFAR-100 values, not its claim.
# The claim, that the best beta moves up with participation because a low
# participation makes a high beta blow up ||x||, is tested on fresh seeds
# (seeds 5-9), with the two betas the validation clients chose on
# seeds 0-4: the low one at 5 of 1,000 and the high one at 50.
BETA_FRESH_LOW = '0.5'
BETA_FRESH_HIGH = '0.95'
# The papers' 5 seeds (Figure 1 and supplementary Figure 4: 5 partitions),
# the local seeds of `_simple_setting`'s experiments: 0-4, so the fresh
# grid's are 5-9.
BETA_LOCAL_SEEDS = 5


def _beta_grid_name(scale: str, fresh: bool = False) -> str:
  name = ('beta_cifar100_partitioned' if scale == 'paper'
          else 'beta_digits')
  return f'{name}_{FRESH}' if fresh else name


def beta_grids(scale: str) -> tuple[core.Grid, ...]:
  # Supplementary D.5 / Figure 7: beta x client participation of 1,000.
  task = 'cifar100_partitioned' if scale == 'paper' else 'digits'
  flags = {**_task_flags(task, 1000), 'algorithm': 'adabest',
           'dirichlet_alpha': '0.3'}
  rounds = 5000 if scale == 'paper' else 300
  grid = core.Grid(_beta_grid_name(scale), flags, rounds,
                   axes=(sweep.Axis(M, ('5', '10', '50')),
                         sweep.Axis(BETA, ('0.5', '0.8', '0.9', '0.95',
                                           '1'))),
                   seed_flag='partition_seed', tied_seed_flags=('seed',))
  if scale == 'paper':
    return (grid,)
  return (grid, core.Grid(
      _beta_grid_name(scale, fresh=True), flags, rounds,
      axes=(sweep.Axis(M, ('5', '50')),
            sweep.Axis(BETA, (BETA_FRESH_LOW, BETA_FRESH_HIGH))),
      seed_flag='partition_seed', tied_seed_flags=('seed',),
      first_seed=BETA_LOCAL_SEEDS))


SCALING_SUBSTITUTES = (
    'Synthetic stands in for CIFAR-100: the paper\'s 1,000 and 100 clients'
    ' (Dirichlet 0.3 label skew), balanced or with log-normal sizes (sigma'
    ' 0.3, the paper\'s unbalanced setting), 10 clients per round (1 % and'
    ' 10 % participation); 1,000 rounds, as `table2`\'s 1 % cells.'
    ' AdaBest\'s beta as the paper set it: searched over {0.2, 0.4, 0.6} at 1'
    ' % participation (1,000 clients) on the validation clients of the'
    ' exploratory runs, 0.96 at 10 % (100); the 1,000-client effects read'
    ' the beta so chosen (`SCALING_TUNED_BETA`).' + _SPLIT_RESOLVING_WHY)


SCALING_LOCAL_ROUNDS = 1000


def scaling_grids(scale: str) -> tuple[core.Grid, ...]:
  # Figure 3: 10 clients per round of 1,000 (local: 400) or 100, balanced or
  # unbalanced. AdaBest's beta as Table 2's at 1 % (tuned) and 10 %.
  task = 'cifar100_partitioned' if scale == 'paper' else SPLIT_RESOLVING_TASK
  large = '1000'
  grids = []
  for algorithm in ALGORITHMS:
    for num_clients, participation in ((large, '1%'), ('100', '10%')):
      flags = {'task': task, 'rounds_per_eval': '10', M: '10',
               'dirichlet_alpha': '0.3', 'num_clients': num_clients,
               **_algorithm_flags(algorithm)}
      flags, axes = _with_beta(
          algorithm, participation, flags,
          (sweep.Axis('unbalanced_sigma', ('0', '0.3')),))
      grids.append(core.Grid(f'fig3_{task}_{algorithm}_{num_clients}', flags,
                             5000 if scale == 'paper' else SCALING_LOCAL_ROUNDS,
                             axes=axes,
                             seed_flag='partition_seed',
                             tied_seed_flags=('seed',)))
  return tuple(grids)


def analyze_scaling(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  frame = frame.assign(label=_label(frame))
  if BETA not in frame:
    frame[BETA] = np.nan
  by = ['num_clients', 'unbalanced_sigma', 'label']
  per_run = _with_validation(frame, [*by, BETA])
  per_run, beta_notes = best_beta(per_run, ['num_clients', 'unbalanced_sigma'])
  frame = frame[frame[analysis.RUN].isin(per_run[analysis.RUN])]
  stats = core.over_seeds(per_run, by, ['accuracy'])
  stats[core.ROW] = [
      f'clients={int(n)} {"unbalanced" if s else "balanced"}'
      for n, s in zip(stats['num_clients'], stats['unbalanced_sigma'])]
  stats[core.QUANTITY] = [f'test_accuracy/{a}' for a in stats['label']]
  figures = []
  for (num_clients, sigma), part in frame.groupby(
      ['num_clients', 'unbalanced_sigma'], sort=False):
    name = (f'accuracy_vs_rounds_{int(num_clients)}_clients_'
            f'{"unbalanced" if sigma else "balanced"}.png')
    plots.plot_accuracy_vs_rounds(
        part, os.path.join(output_dir, name), by=['label'],
        title=f'{int(num_clients)} clients, '
              f'{"unbalanced" if sigma else "balanced"}, 10 per round')
    figures.append(name)
  best = stats.loc[stats.groupby(core.ROW, sort=False)[core.VALUE].idxmax()]
  notes = ['Best algorithm per setting (package): ' + '; '.join(
      f'{r}: {a}' for r, a in zip(best[core.ROW], best['label'])) + '.',
           *beta_notes]
  chosen = per_run[(per_run['label'] == 'adabest')
                   & (per_run['num_clients'] == 1000)].groupby(
                       'unbalanced_sigma')[BETA].first().dropna()
  if len(chosen):
    differ = [f'{sigma:g}' for sigma, beta in chosen.items()
              if float(SCALING_TUNED_BETA.get(f'{sigma:g}', 'nan')) != beta]
    notes.append(
        'The effects read AdaBest at beta ' + ', '.join(
            f'{b} (unbalanced_sigma {s})'
            for s, b in SCALING_TUNED_BETA.items()) + ' (`SCALING_TUNED_BETA`)'
        + (f', which the validation clients no longer choose at sigma'
           f' {", ".join(differ)}: set it to their choice and rerun.'
           if differ else ', the validation clients\' choice in each.'))
  return core.Analysis(stats[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                              core.NUM_RUNS]], figures, notes)


def _validation_means(frame: pd.DataFrame, keys) -> pd.Series:
  """Final validation accuracy per `keys` cell, mean over seeds (empty
  when no run logs it)."""
  if analysis.VALIDATION_ACCURACY not in frame:
    return pd.Series(dtype=float)
  return analysis.accuracy_by_run(
      frame, analysis.VALIDATION_ACCURACY, by=keys).groupby(keys)[
          'accuracy'].mean()


def _sensitivity(flag: str, by):
  """Final test accuracy over `flag`'s values per `by` row (mean over
  seeds). The reading names each row's best value on the validation clients
  (final validation accuracy, mean over seeds) with its test accuracy
  beside: the paper's sensitivity figures are curves, and naming their best
  point on test would be a selection on test."""
  def analyze(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
    per_run = analysis.accuracy_by_run(frame, by=[*by, flag])
    validation = _validation_means(frame, [*by, flag])
    stats = core.over_seeds(per_run, [*by, flag], ['accuracy'])
    stats[core.ROW] = [' '.join(
        f'{c}={r[c]:g}' if isinstance(r[c], (int, float)) else f'{c}={r[c]}'
        for c in by) for _, r in stats.iterrows()]
    stats[core.QUANTITY] = [f'final_test_accuracy/{flag}={v:g}'
                            for v in stats[flag]]
    name = f'accuracy_vs_{flag}.png'
    plots.plot_accuracy_vs_rounds(frame, os.path.join(output_dir, name),
                                  by=[*by, flag], title=f'{flag} sensitivity')
    notes = []
    for row, part in stats.dropna(subset=[core.VALUE]).groupby(
        core.ROW, sort=False):
      scores = pd.Series(
          [validation.get(tuple(r[c] for c in [*by, flag]), np.nan)
           for _, r in part.iterrows()], index=part[flag].to_numpy(),
          dtype=float)
      spread = (f'final test accuracy over {flag}'
                f' {part[core.VALUE].min():.3f}-{part[core.VALUE].max():.3f}.')
      if scores.notna().any():
        # A tie within float rounding goes to the smallest value (best_of).
        chosen, _ = analysis.best_of(scores)
        best = part[part[flag] == chosen].iloc[0]
        notes.append(
            f'{row}: best {flag} on the validation clients {best[flag]:g}'
            f' (final validation accuracy'
            f' {scores[scores.index == chosen].iloc[0]:.3f}; final test'
            f' accuracy there {best[core.VALUE]:.3f}); {spread}')
      else:
        notes.append(f'{row}: no validation accuracy logged, so no best'
                     f' {flag} is named; {spread}')
    return core.Analysis(stats[[core.ROW, core.QUANTITY, core.VALUE,
                                core.STD, core.NUM_RUNS]], [name], notes)
  return analyze


# Tables 4-5 (Supplementary C.1): compute cost per round, client and server
# side, in elementwise operations on the model's n parameters over K local
# steps (g: a mini-batch gradient): beyond FedAvg's K(g + ns + nm) on a
# client and |P|ns on the server, SCAFFOLD/m adds 2Kns + 2n(s + m) and
# 2ns + 2nm, FedDyn 3Kns + Knm + n(s + m) and 3ns + nm, AdaBest Kns + n(s + m)
# and 2ns + nm. As flops (s = m = 1): (client per K n, client per n, server
# per n).
COST_FORMULAS = {'fedavg': (0, 0, 0), 'scaffold': (2, 4, 4),
                 'feddyn': (4, 2, 4), 'adabest': (1, 2, 3)}
COST_ROUNDS = {'local': 15, 'paper': 100}
# The paper's local steps per round on CIFAR-100: 5 epochs over a client's
# 500 images in batches of 45 (Section 4.1), K = 5 * 500 / 45 ~ 56. A digits
# client of the cost grid holds 45 examples, one batch of 45 an epoch, so K
# is its epochs. The tables' differences are K-fold per-step terms; at the
# digits' 5 epochs (K = 5) they were lost in each round's fixed work (the
# first local runs: FedDyn, AdaBest and SCAFFOLD rounds 557, 558, 569 ms).
COST_LOCAL_STEPS = 56
COST_SUBSTITUTES = (
    'The digits task over 100 IID clients, 10 per round, stands in for'
    ' CIFAR-100, with the MLP widened to 2x1024 (`--digits_model=wide_mlp`,'
    ' n = 1.1M parameters, the order of the paper\'s CIFAR CNN: 833k): the'
    ' cost tables count elementwise passes over the n parameters, and with'
    ' AdaBest\'s 2x100 MLP (17.6k) a pass fits in a core\'s cache and is'
    ' lost in the runtime\'s per-client work (runs with it could not tell'
    ' the three algorithms apart); K = 56 local steps a round, the paper\'s'
    ' on CIFAR-100 (5 epochs of 500 images in batches of 45; a digits client'
    ' holds one batch, so 56 epochs here), since the tables\' differences'
    ' are per local step; 15 rounds, 5 partition seeds, one run at a time.'
    ' The paper counts operations, and so does the package: each'
    ' algorithm\'s local step, client conclusion and server update, the'
    ' functions its learning process runs, traced on this model and their'
    ' elementwise additions and multiplications counted'
    ' (`adabest_tff.cost`, `python -m experiment_driver.measure_costs`);'
    ' the client side at the runs\' K. Beside the counts it measures each'
    ' round\'s wall time (`round_time_sec`, median over rounds after the'
    ' first 5), which also holds what the formulas leave out (the'
    ' client-state store, the runtime). FedAvg here is the stateless'
    ' FedAvg (`--algorithm=fedopt`, server SGD at 1), as the paper\'s cost'
    ' tables count it.')


def cost_grids(scale: str) -> tuple[core.Grid, ...]:
  task = 'cifar100_partitioned' if scale == 'paper' else 'digits'
  rounds = COST_ROUNDS['paper' if scale == 'paper' else 'local']
  grids = []
  for algorithm in ALGORITHMS:
    flags = {'task': task, 'num_clients': '100', M: '10',
             'rounds_per_eval': str(rounds)}
    if task == 'digits':
      flags['digits_model'] = 'wide_mlp'
      flags['client_epochs'] = str(COST_LOCAL_STEPS)
    if algorithm == 'fedavg':
      flags.update({'algorithm': 'fedopt', 'server_optimizer': 'sgd',
                    'server_learning_rate': '1',
                    'client_learning_rate': '0.1', 'noclipping': None})
    else:
      flags.update(_algorithm_flags(algorithm))
    grids.append(core.Grid(f'cost_{task}_{algorithm}', flags, rounds,
                           seed_flag='partition_seed',
                           tied_seed_flags=('seed',),
                           # A smoke run checks the code, not the cost.
                           smoke_flags={'client_epochs': '5'}
                           if task == 'digits' else {}))
  return tuple(grids)


# The counted frame's columns (`experiment_driver.measure_costs`), renamed so
# that no run's flag (`algorithm`) selects them.
COUNTED_ALGORITHM, COUNTED_PHASE = 'counted_algorithm', 'counted_phase'


def measure_cost(scale: str) -> pd.DataFrame:
  """Each algorithm's additions and multiplications per parameter and phase
  (`adabest_tff.cost`), counted on the local runs' model at every scale:
  the counted ops are elementwise, so their count per parameter is the same
  for any model (bar O(1) scalar ops)."""
  del scale
  counted = core.measure_in_subprocess(
      'experiment_driver.measure_costs', ['--digits_model=wide_mlp'],
      'the cost tables\' arithmetic')
  return counted.rename(columns={'algorithm': COUNTED_ALGORITHM,
                                 'phase': COUNTED_PHASE})


def counted_flops(frame: pd.DataFrame, steps: int = COST_LOCAL_STEPS
                  ) -> dict[str, dict[str, float]]:
  """`{algorithm: {'step', 'conclusion', 'client', 'server': flops per
  parameter beyond FedAvg's}}` from the counted rows; `client` is `steps`
  local steps and the conclusion. Empty without counted rows."""
  if COUNTED_PHASE not in frame:
    return {}
  counted = frame.dropna(subset=[COUNTED_PHASE])
  flops = counted.set_index([COUNTED_ALGORITHM, COUNTED_PHASE])[
      ['additions', 'multiplications']].sum(axis=1)
  result = {}
  for algorithm in counted[COUNTED_ALGORITHM].unique():
    over = {phase: round(float(flops[(algorithm, phase)]
                               - flops[('fedavg', phase)]), 3)
            for phase in ('local_step', 'client_conclusion', 'server_update')}
    result[algorithm] = {
        'step': over['local_step'], 'conclusion': over['client_conclusion'],
        'client': steps * over['local_step'] + over['client_conclusion'],
        'server': over['server_update']}
  return result


# Rounds whose time is left out of a run's median: the first ones trace.
COST_WARMUP_ROUNDS = 5


def analyze_cost(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  del output_dir  # no figure: the paper's are tables
  counted = counted_flops(frame)
  if COUNTED_PHASE in frame:
    frame = frame[frame[COUNTED_PHASE].isna()]
  frame = frame.assign(label=np.where(frame[ALGORITHM] == 'fedopt', 'fedavg',
                                      frame[ALGORITHM]))
  # (A run shorter than the warm-up, e.g. a smoke run's, keeps its last.)
  warmup = min(COST_WARMUP_ROUNDS, frame[analysis.ROUND].max() - 1)
  timed = frame[frame[analysis.ROUND] > warmup]
  per_run = timed.groupby([analysis.RUN, 'label'], sort=False)[
      'round_time_sec'].median().mul(1000).rename('round_ms').reset_index()
  stats = core.over_seeds(per_run, ['label'], ['round_ms'])
  stats[core.ROW] = 'all'
  stats[core.QUANTITY] = [f'round_time_ms/{a}' for a in stats['label']]
  means = dict(zip(stats['label'], stats[core.VALUE]))
  rows = [stats[[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                 core.NUM_RUNS]]]
  extra = []
  ranked = sorted((m, a) for a, m in means.items() if not np.isnan(m))
  for rank, (_, algorithm) in enumerate(ranked, start=1):
    extra.append({core.ROW: 'all', core.QUANTITY: f'cost_rank/{algorithm}',
                  core.VALUE: rank, core.STD: np.nan,
                  core.NUM_RUNS: int((per_run['label'] == algorithm).sum())})
    if 'fedavg' in means:
      extra.append({core.ROW: 'all',
                    core.QUANTITY: f'time_over_fedavg/{algorithm}',
                    core.VALUE: means[algorithm] / means['fedavg'],
                    core.STD: np.nan, core.NUM_RUNS: None})
  for algorithm, over in counted.items():
    if algorithm == 'fedavg':
      continue
    for key, quantity in (('step', 'step'), ('conclusion', 'conclusion'),
                          ('server', 'server')):
      extra.append({core.ROW: 'all',
                    core.QUANTITY: f'{quantity}_flops_over_fedavg/{algorithm}',
                    core.VALUE: over[key], core.STD: np.nan,
                    core.NUM_RUNS: None})
  notes = _counted_notes(counted)
  fedavg = frame[frame['label'] == 'fedavg']
  # n from AdaBest's or FedDyn's broadcast (the float32 model to each client;
  # SCAFFOLD's carries its control variate too, FedAvg's is not counted), K
  # from the batches FedAvg's clients trained.
  model_only = frame[frame['label'].isin(['adabest', 'feddyn'])].dropna(
      subset=['bytes_down']) if 'bytes_down' in frame else frame.iloc[:0]
  if len(fedavg) and len(model_only):
    first = model_only.iloc[0]
    n = first['bytes_down'] / first[M] / 4
    steps = (fedavg['client_work/train/num_batches'] / fedavg[M]).median()
    flops = {a: (c * steps * n + d * n, e * n)
             for a, (c, d, e) in COST_FORMULAS.items()}
    examples = (fedavg['client_work/train/num_examples'] / fedavg[M]).median()
    # FedAvg's client arithmetic: its updates and ~6 flops per parameter and
    # example for a gradient (forward and backward of dense layers).
    own = 2 * steps * n + 6 * n * examples
    notes.append(
        f'Tables 4-5 evaluated for this model (n = {n:,.0f} parameters, K ='
        f' {steps:g} local steps of {examples / steps:g} examples per client):'
        ' extra elementwise flops over FedAvg per client and round, and at the'
        ' server per round: ' +
        '; '.join(f'{a} {c:,.0f} ({100 * c / own:.1f} % of FedAvg\'s client'
                  f' arithmetic) and {s:,.0f}'
                  for a, (c, s) in flops.items() if a != 'fedavg') +
        '. In flops they are this small a part of a round\'s arithmetic; a'
        ' round\'s time also holds memory traffic (each elementwise pass'
        ' reads and writes the n parameters) and the runtime, which the'
        ' measured times include.')
  if ranked:
    spread = per_run.groupby('label')['round_ms'].agg(['min', 'max'])
    notes.append('Measured order, cheapest first (mean of the runs\''
                 ' medians; the runs\' range): ' + ' < '.join(
                     f'{a} ({m:.1f} ms; {spread.loc[a, "min"]:.1f}-'
                     f'{spread.loc[a, "max"]:.1f})' for m, a in ranked) +
                 '. Where ranges overlap, the order is within the machine\'s'
                 ' noise.')
  return core.Analysis(pd.concat([*rows, pd.DataFrame(extra)],
                                 ignore_index=True), [], notes)


# The effects each experiment's verdict tests (`reproduce.verdicts`), paired
# by partition seed.
_ACCURACY = verdicts.final(analysis.TEST_ACCURACY, 'final test accuracy')
_COLLAPSE = verdicts.drop_from_peak(analysis.TEST_ACCURACY,
                                    'peak minus final test accuracy')
# Figure 1's top panel: the test loss (log scale) climbs back from its
# minimum as ‖x‖ grows. Its last value over its smallest (still improving: 1).
_LOSS_RISE = verdicts.of_column(analysis.TEST_LOSS,
                                lambda v: v.iloc[-1] / v.min(),
                                'final over minimum test loss')
_FEDAVG = {'algorithm': 'adabest', BETA: '0', 'adabest_mu': '0'}
_EFFECT_SEED = 'partition_seed'


def _effect(claim, quantity, treatment, baseline, direction):
  return verdicts.Effect(claim, quantity, treatment, baseline, direction,
                         pair_by=_EFFECT_SEED)


# AdaBest's beta at 1 % participation on the local digits, as
# `analyze_table2`'s validation clients chose it (0.2 at every partition);
# its reading says whether the runs still choose it. The paper scale's
# EMNIST-L needs its own choice first.
TABLE2_TUNED_BETA = '0.2'
# AdaBest's beta at 1 % on the re-partitioned Synthetic, Dirichlet 0.3, as
# the validation clients chose it on seeds 0-2: the fresh seeds' runs.
TABLE2_FRESH_TUNED_BETA = '0.6'


def table2_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  # At 10 % participation, where beta is the paper's (0.96), not searched;
  # locally also at 1 %, where the paper finds AdaBest's margin largest,
  # with the beta the validation clients chose.
  task = _tasks(scale)[0]
  cells = [('10', '0.96')] + ([] if scale == 'paper'
                              else [('1', TABLE2_TUNED_BETA)])
  effects = []
  for cohort, beta in cells:
    setting = {'task': task, 'dirichlet_alpha': '0.3', M: cohort}
    adabest = {**setting, 'algorithm': 'adabest', BETA: beta}
    effects += [
        _effect(f'AdaBest ends above {name} ({task}, Dirichlet 0.3,'
                f' {cohort} % participation)', _ACCURACY, adabest,
                {**setting, **other}, 1)
        for name, other in (('FedAvg', _FEDAVG),
                            ('FedDyn', {'algorithm': 'feddyn'}),
                            ('SCAFFOLD', {'algorithm': 'scaffold'}))]
  if scale == 'paper':
    return tuple(effects)
  # The same effects on the task that resolves them, on fresh seeds.
  for participation in TABLE2_FRESH_PARTICIPATIONS:
    cohort = participation[:-1]
    cell = lambda algorithm: {verdicts.GRID: _table2_fresh_name(algorithm),
                              M: cohort}
    effects += [
        _effect(f'fresh seeds: AdaBest ends above {name}'
                f' ({TABLE2_FRESH_TASK}, Dirichlet 0.3, {cohort} %'
                ' participation)', _ACCURACY, cell('adabest'),
                cell(algorithm), 1)
        for name, algorithm in (('FedAvg', 'fedavg'), ('FedDyn', 'feddyn'),
                                ('SCAFFOLD', 'scaffold'))]
  return tuple(effects)


_MODEL_NORM = verdicts.final('model_norms/global_model_norm', 'final ‖x‖')


def instability_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  feddyn = {'algorithm': 'feddyn'}
  adabest = {'algorithm': 'adabest', BETA: instability_betas(scale)[0]}
  return (
      _effect('FedDyn collapses after its peak more than AdaBest', _COLLAPSE,
              feddyn, adabest, 1),
      _effect('FedDyn ends below AdaBest', _ACCURACY, feddyn, adabest, -1),
      _effect('FedDyn\'s test loss climbs back from its minimum more than'
              ' AdaBest\'s', _LOSS_RISE, feddyn, adabest, 1),
      _effect('FedDyn\'s ‖x‖ ends above AdaBest\'s (the mechanism)',
              _MODEL_NORM, feddyn, adabest, 1),
  )


def easy_task_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  return (*(
      _effect(f'FedDyn collapses after its peak more than {name}', _COLLAPSE,
              {'algorithm': 'feddyn'}, {'algorithm': other}, 1)
      for name, other in (('AdaBest', 'adabest'), ('SCAFFOLD', 'scaffold'))),
          _effect('FedDyn\'s ‖x‖ ends above AdaBest\'s (the mechanism)',
                  _MODEL_NORM, {'algorithm': 'feddyn'},
                  {'algorithm': 'adabest'}, 1))


# AdaBest's beta at 10 of 1,000 (local) per unbalanced_sigma, as
# `analyze_scaling`'s validation clients chose it in the exploratory runs;
# its reading says whether the runs still choose it. The paper's 1,000
# clients are its main cells, where "the gain is largest".
SCALING_TUNED_BETA = {'0': '0.6', '0.3': '0.6'}


def scaling_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  # 100 clients (10 %): AdaBest's beta is the paper's, not searched; 1,000
  # at the local scale: the beta its validation clients chose (the paper
  # scale's need their own choice first). Against FedAvg (the paper's
  # baseline of every cell), then FedDyn and SCAFFOLD (the claim's "leads
  # ... all").
  cells = [('100', '0.96', kind, sigma)
           for kind, sigma in (('balanced', '0'), ('unbalanced', '0.3'))]
  if scale != 'paper':
    cells += [('1000', SCALING_TUNED_BETA[sigma], kind, sigma)
              for kind, sigma in (('balanced', '0'), ('unbalanced', '0.3'))]
  baselines = (('FedAvg', _FEDAVG), ('FedDyn', {'algorithm': 'feddyn'}),
               ('SCAFFOLD', {'algorithm': 'scaffold'}))
  return tuple(
      _effect(f'AdaBest ends above {name} ({clients} clients, {kind})',
              _ACCURACY, {'algorithm': 'adabest', BETA: beta,
                          'num_clients': clients, 'unbalanced_sigma': sigma},
              {**baseline, 'num_clients': clients, 'unbalanced_sigma': sigma},
              1)
      for name, baseline in baselines
      for clients, beta, kind, sigma in cells)


def _counted_notes(counted: dict[str, dict[str, float]]) -> list[str]:
  """What the counts show beside Tables 4-5, and where they differ."""
  if not counted:
    return []
  names = {'adabest': 'AdaBest', 'feddyn': 'FedDyn', 'scaffold': 'SCAFFOLD'}
  parts = [f'{names[a]} {c["step"]:g} per step, {c["conclusion"]:g} to'
           f' conclude, {c["client"]:g} a round at K = {COST_LOCAL_STEPS},'
           f' {c["server"]:g} on the server'
           for a, c in counted.items() if a in names]
  return [
      'Counted flops per parameter beyond FedAvg\'s (additions plus'
      ' multiplications in the functions each process runs): '
      + '; '.join(parts) + '. Per local step the counts are the paper\'s'
      ' (AdaBest ns, SCAFFOLD 2ns, FedDyn 3ns + nm), and with K steps a'
      ' round they decide the client side. Where they differ from Tables'
      ' 4-5: AdaBest\'s conclusion also divides h_i by t - t\'_i (Algorithm'
      ' 2 writes ns + nm for a line with two products). On the server, TFF'
      ' aggregates the clients\' pseudo-gradients x - θ_K, not their models:'
      ' FedDyn\'s θ^{t-1} - θ̄^t, a pass in Algorithm 2, is then the aggregate'
      ' ḡ itself, AdaBest\'s θ̄^{t-1} - θ̄^t is h^{t-1} + ḡ (Remark 2; a pass,'
      ' as in Algorithm 2), and x̄ = x - ḡ costs each algorithm a pass that'
      ' FedAvg\'s server step (x - η_g ḡ) pays too; SCAFFOLD is option II as'
      ' the paper ran it (x - η_g ḡ and c + Σ(c_i⁺ - c_i)/|S|), not'
      ' Algorithm 2\'s SCAFFOLD/m. Counted beyond FedAvg\'s, the three server'
      ' updates then cost the same, so the server half of the claim does not'
      ' hold for this implementation: its saving is FedDyn\'s pass, which'
      ' aggregating pseudo-gradients gives FedDyn too.']


def cost_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  seconds = verdicts.median_after('round_time_sec', COST_WARMUP_ROUNDS + 1,
                                  'median round seconds')
  others = (('FedDyn', 'feddyn'), ('SCAFFOLD', 'scaffold'))
  timed = tuple(
      _effect(f'an AdaBest round costs less than a {name} round', seconds,
              {'algorithm': 'adabest'}, {'algorithm': other}, -1)
      for name, other in others)
  # The tables themselves, counted: the other's flops minus AdaBest's.
  sides = (('client round', 'client',
            f'{COST_LOCAL_STEPS} local steps and the conclusion'),
           ('server update', 'server', 'after the cohort\'s mean'))
  counted = tuple(
      verdicts.Exact(
          f'AdaBest\'s {side} costs fewer counted flops than {name}\'s'
          f' ({what}; per parameter, {name} minus AdaBest)',
          lambda f, key=key, other=other: _counted_margin(f, key, other),
          lambda v: v > 0, 'above 0')
      for side, key, what in sides for name, other in others)
  return timed + counted


def _counted_margin(frame: pd.DataFrame, key: str, other: str) -> float:
  counted = counted_flops(frame)
  if 'adabest' not in counted or other not in counted:
    return float('nan')
  return counted[other][key] - counted['adabest'][key]


def mu_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  # mu = 0.02 is "the value that works best for FedDyn" (D.5): FedDyn's
  # dependence shows away from it, at the largest mu.
  # D.5's claim is a contrast of sensitivities: AdaBest's accuracy does not
  # depend on mu (an equivalence, its margin in the protocol), FedDyn's
  # "heavily relies on the choice of mu".
  feddyn = {'algorithm': 'feddyn', MU: '0.16'}
  adabest = {'algorithm': 'adabest', MU: '0.16'}
  return (_effect('AdaBest ends at the same accuracy at mu 0.16 as at 0.02',
                  _ACCURACY, adabest, {'algorithm': 'adabest', MU: '0.02'},
                  1),
          _effect('FedDyn ends lower at mu 0.16 than at 0.02', _ACCURACY,
                  feddyn, {'algorithm': 'feddyn', MU: '0.02'}, -1),
          _effect('at the largest mu (0.16) AdaBest ends above FedDyn',
                  _ACCURACY, adabest, feddyn, 1),
          _effect('at the largest mu FedDyn falls from its peak more than'
                  ' AdaBest', _COLLAPSE, feddyn, adabest, 1),
          _effect('at the largest mu FedDyn\'s ‖x‖ ends above AdaBest\'s'
                  ' (Figure 6\'s bottom row)', _MODEL_NORM, feddyn, adabest,
                  1))


def _seed_span(frame: pd.DataFrame) -> str:
  """The runs' partition seeds as `first-last` (or the one seed)."""
  seeds = sorted(frame[_EFFECT_SEED].dropna().astype(int).unique())
  return f'{seeds[0]}' + (f'-{seeds[-1]}' if len(seeds) > 1 else '')


def _in_fresh_grid(frame: pd.DataFrame) -> pd.Series:
  """Whether each row's run is of a fresh-seed grid (its name ends in
  `_fresh`: `fig_beta`'s, Table 2's Synthetic)."""
  names = frame[analysis.EXPERIMENT_NAME].astype(str)
  return names.str.contains(f'_{FRESH}(?:__|$)', regex=True)


def analyze_beta(frame: pd.DataFrame, output_dir: str) -> core.Analysis:
  """`_sensitivity` over beta per participation on seeds 0-4; the
  validation clients' choice per participation (the paper's claim is its
  trend, read here and tested on the fresh seeds by `beta_effects`);
  whether the fresh grid and `fig_feddyn_instability` still run the betas
  chosen here; and the fresh seeds' accuracy and ‖x‖ per cell."""
  fresh = frame[_in_fresh_grid(frame)]
  frame = frame[~_in_fresh_grid(frame)]
  result = _sensitivity(BETA, [M])(frame, output_dir)
  means = _validation_means(frame, [M, BETA]).dropna()
  if means.empty:
    return result
  choices = means.groupby(level=0).apply(
      lambda part: analysis.best_of(part.droplevel(0))[0])
  trend = ', '.join(f'{b:g} at {m:g}' for m, b in choices.items())
  rises = choices.is_monotonic_increasing and choices.nunique() > 1
  notes = [*result.notes, (
      f'The validation clients\' beta per clients a round: {trend}; it'
      + (' rises with participation, as the paper\'s.' if rises else
         ' does not rise with participation throughout.'))]
  used = {5: ('`fig_feddyn_instability`', INSTABILITY_TUNED_BETA),
          50: ('the fresh seeds\' grid', BETA_FRESH_HIGH)}
  for m, (who, beta) in used.items():
    if m not in choices.index:
      continue
    chosen = f'{choices[m]:g}'
    notes.append(
        f'At {m} of 1,000 the validation clients choose beta {chosen};'
        f' {who} runs AdaBest at {beta}: ' + (
            'the same.' if float(chosen) == float(beta) else
            'not the same: set it to the choice and rerun it.'))
  if not fresh.empty:
    notes.append(_fresh_reading(fresh))
  return dataclasses.replace(result, notes=notes)


def _fresh_reading(fresh: pd.DataFrame) -> str:
  """The fresh seeds' final test accuracy and ‖x‖ per (M, beta) cell, mean
  over seeds."""
  runs = pd.DataFrame([
      {M: run[M].iloc[0], BETA: run[BETA].iloc[0],
       'accuracy': _ACCURACY.of_run(run), 'norm': _MODEL_NORM.of_run(run)}
      for _, run in fresh.groupby(analysis.RUN)])
  cells = '; '.join(
      f'beta {beta:g} at {m:g}: {row.accuracy:.3f} (‖x‖ {row.norm:.3g})'
      for (m, beta), row in runs.groupby([M, BETA]).mean().iterrows())
  return (f'Fresh seeds ({_seed_span(fresh)}), final test accuracy and'
          f' ‖x‖ (mean over seeds): {cells}.')


def beta_effects(scale: str) -> tuple[verdicts.Effect, ...]:
  grid = {verdicts.GRID: _beta_grid_name(scale)}
  effects = (
      _effect('at 5 of 1,000 clients a round, beta 0.9 ends above'
              ' beta 1', _ACCURACY, {**grid, M: '5', BETA: '0.9'},
              {**grid, M: '5', BETA: '1'}, 1),
      # D.6: "the curve corresponding to beta = 1.0 rising as the rate of
      # client participation increases".
      _effect('beta 1 ends higher at 50 than at 5 of 1,000 clients a'
              ' round', _ACCURACY, {**grid, M: '50', BETA: '1'},
              {**grid, M: '5', BETA: '1'}, 1))
  if scale == 'paper':
    return effects
  # D.6's claim and its mechanism on the fresh seeds (seeds 5-9).
  fresh = {verdicts.GRID: _beta_grid_name(scale, fresh=True)}
  low, high = BETA_FRESH_LOW, BETA_FRESH_HIGH
  return (*effects,
          _effect(f'fresh seeds: at 5 of 1,000 clients a round, beta {low}'
                  f' ends above beta {high} (a low participation needs a'
                  ' lower beta)', _ACCURACY, {**fresh, M: '5', BETA: low},
                  {**fresh, M: '5', BETA: high}, 1),
          _effect(f'fresh seeds: at 50 of 1,000 clients a round, beta {high}'
                  f' ends above beta {low} (closer to 1 with more)',
                  _ACCURACY, {**fresh, M: '50', BETA: high},
                  {**fresh, M: '50', BETA: low}, 1),
          _effect(f'fresh seeds: at beta {high}, ‖x‖ ends larger at 5 than'
                  ' at 50 of 1,000 clients a round (the explosion D.6'
                  ' explains it by)', _MODEL_NORM,
                  {**fresh, M: '5', BETA: high},
                  {**fresh, M: '50', BETA: high}, 1))


BETA_SUBSTITUTES = (
    'The digits MLP over 1,000 clients (Dirichlet 0.3) stands in for'
    ' CIFAR-100; 300 rounds, 5 partition seeds. Figure 7\'s pairs are read'
    ' on seeds 0-4; they carry the paper\'s CIFAR-100 values (0.9 best, 1'
    ' rising), and on digits the optimum sits lower (a digits client holds'
    ' 1-2 images where a CIFAR-100 client holds 50, so its pseudo-gradients'
    ' are noisier and D.6 asks for a lower beta). D.6\'s claim itself, that'
    ' the best beta moves up with participation because at a low one a high'
    ' beta blows up ‖x‖, was declared after those runs and is tested on'
    f' fresh seeds 5-9 at the betas the validation clients chose on seeds'
    f' 0-4: {BETA_FRESH_LOW} (at 5 of 1,000) and {BETA_FRESH_HIGH} (at 50).')


def _simple_setting(grids_fn, substitutes):
  return core.setting_fn(grids_fn, local_seeds=BETA_LOCAL_SEEDS,
                         substitutes=substitutes)


EXPERIMENTS = (
    core.Experiment(
        'adabest', 'table2',
        'Table 2 (IID, Dirichlet 0.3 and 0.03; 1 %, 10 %, 100 % participation)',
        'AdaBest is the most accurate of FedAvg, FedDyn, SCAFFOLD and AdaBest'
        ' in most settings, its margin largest at low participation; at'
        ' 100 % FedDyn and AdaBest nearly coincide.',
        _table2_setting, analyze_table2, effects=table2_effects),
    core.Experiment(
        'adabest', 'fig_feddyn_instability',
        'Figure 1 (5 of 1,000 clients per round)',
        'At low participation FedDyn\'s ‖x‖ and ‖h‖ grow without bound and its'
        ' accuracy collapses after peaking; AdaBest stays stable.',
        _simple_setting(instability_grids, INSTABILITY_SUBSTITUTES),
        analyze_instability, effects=instability_effects),
    core.Experiment(
        'adabest', 'fig_easy_task',
        'Supplementary Figures 4-5 (100 IID clients, many rounds; train vs'
        ' test accuracy)',
        'Even on an easy task (EMNIST-L, 100 IID clients) FedDyn fails to'
        ' converge when training runs for many rounds, its ‖x‖ growing;'
        ' AdaBest and SCAFFOLD do not.',
        _simple_setting(easy_task_grids, EASY_TASK_SUBSTITUTES),
        analyze_easy_task, effects=easy_task_effects),
    core.Experiment(
        'adabest', 'fig3',
        'Figure 3 (1,000 vs 100 clients, balanced vs unbalanced, 10 per'
        ' round)',
        'On CIFAR-100 with 10 clients per round, AdaBest leads FedAvg, FedDyn'
        ' and SCAFFOLD in all four settings, its gain largest with 1,000'
        ' clients.',
        _simple_setting(scaling_grids, SCALING_SUBSTITUTES),
        analyze_scaling, effects=scaling_effects),
    core.Experiment(
        'adabest', 'table_cost',
        'Supplementary Tables 4-5 (compute cost, client and server side)',
        'AdaBest costs less compute than SCAFFOLD/m and FedDyn, on the clients'
        ' and on the server (all more than FedAvg).',
        _simple_setting(cost_grids, COST_SUBSTITUTES), analyze_cost,
        max_parallel=1, measure=measure_cost, effects=cost_effects),
    core.Experiment(
        'adabest', 'fig_mu',
        'Supplementary Figure 6 (mu sensitivity, AdaBest vs FedDyn)',
        'AdaBest is insensitive to mu; FedDyn\'s stability depends on it.',
        _simple_setting(mu_grids, MU_SUBSTITUTES), analyze_mu,
        effects=mu_effects),
    core.Experiment(
        'adabest', 'fig_beta',
        'Supplementary Figure 7 (beta x client participation)',
        'The best beta rises with participation: 0.8-0.95 at 5 of 1,000'
        ' clients per round, closer to 1 with more.',
        _simple_setting(beta_grids, BETA_SUBSTITUTES),
        analyze_beta, effects=beta_effects),
)
