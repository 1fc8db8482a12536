"""Tables and heatmap of the GeL evidence runs (see README.md here).

    python results/gel/summarize.py --root=/tmp/e1_gel/runs \
        --output_dir=results/gel

Reads the driver's run directories under `--root` with the package's own
readers (`fl_common.analysis`) and GeL's accounting (`gel_tff.accounting`):

* `table__*` runs (Tables 1-2 of Boukhari et al. 2024): per run, the first
  evaluation round reaching each test-accuracy threshold, the gradient
  computations until then, the best, last and mean (over evaluation rounds)
  accuracy, up to the run's planned last round (`--total_rounds` of its
  sweep, `PLANNED_ROUNDS` below), and the accuracy of its last checkpoint on
  all 11,179 test examples (the runs evaluate 200 of the 1,000 test clients);
  `rounds_to_target_per_run.csv` and, over seeds, `rounds_to_target.csv`
  (mean and std over the seeds that reached a threshold, and how many did)
  with the speedup of `<base>_gel` over `<base>_budgeted` (Table 1's
  `(R_baseline - R) / R`, of the means; only where every seed of both
  reached the threshold).
* `grid_<algorithm>/` roots (Figure 7): the (eta_l, eta) grid of final test
  accuracy per algorithm, `lr_grid.csv` and one 2x2 heatmap `lr_grid.png`
  with a shared color scale.
* `accuracy_vs_rounds_{fedavgcm,fedprox_fednova}.png`: test accuracy of the
  table runs.
"""

import argparse
import functools
import glob
import json
import os
import re

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pandas as pd  # pylint: disable=g-import-not-at-top

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from experiment_driver import runtime  # pylint: disable=g-import-not-at-top
from gel_tff import accounting  # pylint: disable=g-import-not-at-top
from fl_common import analysis  # pylint: disable=g-import-not-at-top
from fl_common import plots  # pylint: disable=g-import-not-at-top
from tasks import synthetic  # pylint: disable=g-import-not-at-top

THRESHOLDS = (0.60, 0.65, 0.70, 0.75, 0.80, 0.85)
ALGORITHM = 'algorithm'
SEED = 'seed'
# Rounds each table sweep ran, per (base, eta_l) (run_evidence.sh); rounds
# past them (a run stopped a little late) are ignored so that every run of a
# row is cut alike.
PLANNED_ROUNDS = {('fedavgcm', 0.01): 300, ('fedavgcm', 0.005): 300,
                  ('fedprox', 0.01): 250, ('fednova', 0.01): 250}
GRID_ALGORITHMS = ('fedavgcm_budgeted', 'fedavgcm_gel', 'fedyogi_budgeted',
                   'fedyogi_gel')


def _base(algorithm: str) -> str:
  return re.sub(r'_(gel|budgeted)$', '', algorithm)


def load_table_runs(root: str) -> pd.DataFrame:
  """The `table__*` runs under `root`, each cut at its planned rounds."""
  run_dirs = sorted(
      os.path.join(root, name) for name in os.listdir(root)
      if name.startswith('table__') and
      os.path.isfile(os.path.join(root, name, analysis.METRICS_FILE)))
  if not run_dirs:
    raise ValueError(f'no table__* run directories under {root!r}')
  frame = analysis.load_runs(run_dirs)
  planned = pd.Series(
      [PLANNED_ROUNDS[(_base(a), lr)] for a, lr in zip(
          frame[ALGORITHM], frame[analysis.CLIENT_LEARNING_RATE])],
      index=frame.index)
  return frame[frame[analysis.ROUND] <= planned].assign(planned_rounds=planned)


@functools.lru_cache
def synthetic_test_examples(num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """All clients' test examples of the Synthetic task, stacked."""
  _, test = synthetic.split_client_examples(
      synthetic.generate_synthetic_clients(num_classes=num_classes),
      synthetic.LEAF_SEED)
  return (np.concatenate([x for x, _ in test]),
          np.concatenate([y for _, y in test]))


def checkpoint_accuracy(run_dir: str) -> tuple[int, float]:
  """`(round, accuracy on x, y)` of the run's latest saved model.

  The driver's program state (`checkpoints/program_state_<round>`, a saved
  model returning the state) holds the logistic regression's kernel
  [60, C] and bias [C] (C: the run's `synthetic_num_classes`, 10 before it
  was recorded) as its only tensors of those shapes.
  """
  with open(os.path.join(run_dir, 'hparams.json')) as f:
    num_classes = json.load(f).get('synthetic_num_classes', 10)
  x, y = synthetic_test_examples(num_classes)
  path = max(glob.glob(os.path.join(run_dir, 'checkpoints', 'program_state_*')),
             key=lambda p: int(p.rsplit('_', 1)[1]))
  tensors = [t.numpy() for t in tf.nest.flatten(tf.saved_model.load(path)())]
  kernel, = [t for t in tensors
             if t.shape == (x.shape[1], num_classes)]
  bias, = [t for t in tensors if t.shape == (num_classes,)]
  predictions = np.argmax(x @ kernel + bias, axis=1)
  return int(path.rsplit('_', 1)[1]), float(np.mean(predictions == y))


def per_run_table(frame: pd.DataFrame) -> pd.DataFrame:
  """Rounds and gradient computations to each threshold, best/last accuracy."""
  by = [ALGORITHM, analysis.CLIENT_LEARNING_RATE, SEED, 'planned_rounds']
  crossings = analysis.threshold_crossings(frame, THRESHOLDS, by=by)
  rows = []
  for run, run_crossings in crossings.groupby(analysis.RUN, sort=False):
    metrics = frame[frame[analysis.RUN] == run]
    accuracy = metrics[analysis.TEST_ACCURACY].dropna()
    row = {column: run_crossings[column].iloc[0] for column in by}
    row.update(last_round=int(metrics[analysis.ROUND].max()),
               best_accuracy=float(accuracy.max()),
               best_round=int(metrics.loc[accuracy.idxmax(), analysis.ROUND]),
               last_accuracy=float(accuracy.iloc[-1]),
               mean_accuracy=float(accuracy.mean()))
    row['checkpoint_round'], row['checkpoint_full_test_accuracy'] = (
        checkpoint_accuracy(run))
    for threshold, rounds in zip(run_crossings[analysis.THRESHOLD],
                                 run_crossings['rounds']):
      key = f'{threshold:.2f}'
      row[f'rounds_to_{key}'] = rounds
      row[f'gradients_to_{key}'] = (
          accounting.total_until_round(
              metrics, [accounting.GRADIENT_COMPUTATIONS], int(rounds))
          if np.isfinite(rounds) else np.nan)
    rows.append(row)
  return pd.DataFrame(rows).sort_values(by).reset_index(drop=True)


def _mean_std(values: pd.Series) -> tuple[float, float, int]:
  """Mean and std (ddof 1; NaN for one seed) of the seeds that reached."""
  reached = values.dropna()
  std = float(reached.std(ddof=1)) if len(reached) > 1 else np.nan
  return float(reached.mean()) if len(reached) else np.nan, std, len(reached)


def summary_table(per_run: pd.DataFrame) -> pd.DataFrame:
  """Per algorithm and eta_l: mean ± std over seeds and GeL's speedup."""
  keys = [ALGORITHM, analysis.CLIENT_LEARNING_RATE]
  rows = []
  for (algorithm, learning_rate), runs in per_run.groupby(keys, sort=True):
    row = {ALGORITHM: algorithm, analysis.CLIENT_LEARNING_RATE: learning_rate,
           'seeds': len(runs),
           'planned_rounds': int(runs['planned_rounds'].max()),
           'best_accuracy_mean': runs['best_accuracy'].mean(),
           'last_accuracy_mean': runs['last_accuracy'].mean(),
           'mean_accuracy_mean': runs['mean_accuracy'].mean(),
           'full_test_accuracy_mean':
               runs['checkpoint_full_test_accuracy'].mean()}
    for threshold in THRESHOLDS:
      key = f'{threshold:.2f}'
      mean, std, reached = _mean_std(runs[f'rounds_to_{key}'])
      row.update({f'rounds_to_{key}_mean': mean, f'rounds_to_{key}_std': std,
                  f'rounds_to_{key}_reached': reached})
    rows.append(row)
  table = pd.DataFrame(rows)
  for threshold in THRESHOLDS:
    key = f'rounds_to_{threshold:.2f}_mean'
    reached = f'rounds_to_{threshold:.2f}_reached'
    speedups = []
    for _, row in table.iterrows():
      baseline = table[
          (table[ALGORITHM] == f'{_base(row[ALGORITHM])}_budgeted') &
          (table[analysis.CLIENT_LEARNING_RATE] ==
           row[analysis.CLIENT_LEARNING_RATE])]
      # Only when every seed of both rows reached the threshold: a mean over
      # the seeds that did would compare different seeds.
      usable = (row[ALGORITHM].endswith('_gel') and len(baseline) == 1 and
                row[reached] == row['seeds'] and
                baseline[reached].iloc[0] == baseline['seeds'].iloc[0] > 0)
      speedups.append(accounting.speedup(row[key], baseline[key].iloc[0])
                      if usable else np.nan)
    table[f'speedup_{threshold:.2f}'] = speedups
  return table


def grid_tables(root: str) -> tuple[dict[str, pd.DataFrame], list[int]]:
  """Final test accuracy over (eta_l, eta) per algorithm that has a grid.

  Returns:
    The grids by algorithm and the distinct last rounds of their runs.
  """
  grids, last_rounds = {}, set()
  for algorithm in GRID_ALGORITHMS:
    grid_root = os.path.join(root, f'grid_{algorithm}')
    if os.path.isdir(grid_root):
      frame = analysis.load_runs([grid_root])
      grids[algorithm] = analysis.learning_rate_grid(
          frame, accuracy_column=analysis.TEST_ACCURACY)
      last_rounds.update(
          frame.groupby(analysis.RUN)[analysis.ROUND].max().astype(int))
  return grids, sorted(last_rounds)


def plot_grids(grids: dict[str, pd.DataFrame], path: str, title: str) -> str:
  """The grids side by side on one color scale, best cell of each boxed."""
  low = min(np.nanmin(g.to_numpy(float)) for g in grids.values())
  high = max(np.nanmax(g.to_numpy(float)) for g in grids.values())
  fig, axes = plt.subplots(2, 2, figsize=(9, 7), squeeze=False,
                           constrained_layout=True)
  for ax, (algorithm, grid) in zip(axes.flat, grids.items()):
    values = grid.to_numpy(float)
    image = ax.imshow(np.ma.masked_invalid(values), cmap='viridis',
                      origin='lower', aspect='auto', vmin=low, vmax=high)
    ax.set_xticks(range(len(grid.columns)), [f'{v:g}' for v in grid.columns])
    ax.set_yticks(range(len(grid.index)), [f'{v:g}' for v in grid.index])
    ax.set_xlabel('server learning rate η')
    ax.set_ylabel('client learning rate η_l')
    ax.set_title(algorithm)
    for (i, j), value in np.ndenumerate(values):
      if np.isfinite(value):
        ax.text(j, i, f'{value:.3f}', ha='center', va='center', fontsize=9,
                color='black' if value > (low + high) / 2 else 'white')
    best_row, best_column, _ = analysis.best_learning_rates(grid)
    ax.add_patch(plt.Rectangle(
        (list(grid.columns).index(best_column) - 0.5,
         list(grid.index).index(best_row) - 0.5), 1, 1, fill=False,
        edgecolor='red', linewidth=2))
  for ax in list(axes.flat)[len(grids):]:
    ax.axis('off')
  fig.colorbar(image, ax=axes, label='final test accuracy', shrink=0.8)
  fig.suptitle(title)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def main() -> None:
  # No computation runs here: TFF's default runtime would only fail noisily
  # at exit.
  runtime.refuse_unmanaged_default_context()
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--root', required=True,
                      help='Root of the run directories (run_evidence.sh).')
  parser.add_argument('--output_dir', required=True,
                      help='Where the CSV and PNG files go.')
  args = parser.parse_args()
  os.makedirs(args.output_dir, exist_ok=True)
  frame = load_table_runs(args.root)
  per_run = per_run_table(frame)
  per_run.to_csv(os.path.join(args.output_dir, 'rounds_to_target_per_run.csv'),
                 index=False, float_format='%.6g')
  table = summary_table(per_run)
  table.to_csv(os.path.join(args.output_dir, 'rounds_to_target.csv'),
               index=False, float_format='%.6g')
  with pd.option_context('display.width', 250, 'display.max_columns', 50):
    print(per_run.to_string(index=False))
    print(table.to_string(index=False))
  bases = frame[ALGORITHM].map(_base)
  for name, shown in (('fedavgcm', ['fedavgcm']),
                      ('fedprox_fednova', ['fedprox', 'fednova'])):
    if bases.isin(shown).any():
      plots.plot_accuracy_vs_rounds(
          frame[bases.isin(shown)],
          os.path.join(args.output_dir, f'accuracy_vs_rounds_{name}.png'),
          by=(ALGORITHM, analysis.CLIENT_LEARNING_RATE))
  grids, last_rounds = grid_tables(args.root)
  if grids:
    pd.concat({algorithm: grid.rename(columns=lambda v: f'server_lr={v:g}')
               for algorithm, grid in grids.items()},
              names=[ALGORITHM]).to_csv(
        os.path.join(args.output_dir, 'lr_grid.csv'), float_format='%.4f')
    plot_grids(grids, os.path.join(args.output_dir, 'lr_grid.png'),
               'Synthetic: test accuracy after '
               f'{"/".join(map(str, last_rounds))} rounds')
    for algorithm, grid in grids.items():
      print(algorithm)
      print(grid.to_string(float_format='%.3f'))


if __name__ == '__main__':
  main()
