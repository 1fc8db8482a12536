"""Figures of run directories, as in Charles et al. (2021).

    python -m reproduce.plots --run_dirs=/tmp/fl_papers/cohort_sweep \
        --output_dir=/tmp/figures --thresholds=0.5,0.6,0.7

`--run_dirs` takes run directories or roots holding them (comma-separated).
Every figure the runs have the columns for is written as a PNG; the others are
listed as skipped with the reason. Lines are labelled by `--by` (default the
cohort size M); runs with the same labels (seeds) are averaged, with a band of
one standard deviation, as the paper's "mean across the 5 trials".

| file | figure of the paper |
|---|---|
| accuracy_vs_rounds.png | Figures 2, 14-20 |
| accuracy_vs_examples.png | Figures 7 (right), 11, 42 |
| update_norm_vs_rounds.png | Figure 8 (a-c), 32-39 (dashed: sqrt rule) |
| accuracy_vs_cohort_size.png | Figures 5, 10, 21, 22 |
| rounds_to_accuracy.png | Figures 3, 4, 23-27 |
| relative_time_to_accuracy.png | Figures 28-31 (straggler model) |
| accuracy_percentiles.png | Figure 6 (box: p5, p25, p50, p75, p95) |
| learning_rate_grid.png | the tuning grid of appendix A.4 |

The plotting functions take the frame of `analysis.load_runs` and work for
any algorithm family's runs (e.g. the learning-rate grid over any two flags).

Why one module: each figure is a short function over `analysis` tables with
one shared style and command line; one file per figure would repeat both.
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pandas as pd  # pylint: disable=g-import-not-at-top

from reproduce import analysis  # pylint: disable=g-import-not-at-top

_SHORT_NAMES = {
    analysis.COHORT_SIZE: 'M',
    analysis.STRAGGLER_LAMBDA: 'λ',
    analysis.CLIENT_LEARNING_RATE: 'client lr',
    analysis.SERVER_LEARNING_RATE: 'server lr',
}


def _format_value(value: Any) -> str:
  if isinstance(value, (float, np.floating)):
    return f'{int(value)}' if float(value).is_integer() else f'{value:g}'
  return str(value)


def _label(by: Sequence[str], values: Sequence[Any]) -> str:
  return ', '.join(f'{_SHORT_NAMES.get(c, c)}={_format_value(v)}'
                   for c, v in zip(by, values))


def _groups(frame: pd.DataFrame, by: Sequence[str]):
  """Yields `(label, rows)` per distinct value of `by` (all rows if empty)."""
  if not by:
    yield '', frame
    return
  for values, rows in frame.groupby(list(by), sort=True, dropna=False):
    yield _label(by, values if isinstance(values, tuple) else (values,)), rows


def _save(fig: plt.Figure, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plot_curves(frame: pd.DataFrame, path: str, y: str,
                x: str = analysis.ROUND,
                by: Sequence[str] = (analysis.COHORT_SIZE,),
                ylabel: Optional[str] = None, xlabel: Optional[str] = None,
                log_x: bool = False, log_y: bool = False,
                title: Optional[str] = None,
                panels: Sequence[str] = ()) -> str:
  """`y` against `x`, one line per `by` label (mean ± std over its runs), in
  one panel per `panels` label (side by side, same y axis)."""
  groups = [(label, analysis.mean_curves(rows, y, x, by))
            for label, rows in _groups(frame, panels)]
  groups = [(label, curves) for label, curves in groups if not curves.empty]
  if not groups:
    raise ValueError(f'no run records {y!r}')
  fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4),
                           squeeze=False, sharey=True)
  for ax, (panel, curves) in zip(axes[0], groups):
    for label, rows in _groups(curves, by):
      line, = ax.plot(rows[x], rows[y], label=label or None)
      if rows['num_runs'].max() > 1:
        ax.fill_between(rows[x], rows[y] - rows[f'{y}_std'],
                        rows[y] + rows[f'{y}_std'], color=line.get_color(),
                        alpha=0.2)
    ax.set_xlabel(xlabel or x)
    if log_x:
      ax.set_xscale('log')
    if log_y:
      ax.set_yscale('log')
    if by:
      ax.legend(fontsize='small')
    if panel or title:
      ax.set_title(' / '.join(t for t in (title, panel) if t))
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(ylabel or y)
  return _save(fig, path)


def plot_accuracy_vs_rounds(frame: pd.DataFrame, path: str,
                            accuracy_column: str = analysis.TEST_ACCURACY,
                            by: Sequence[str] = (analysis.COHORT_SIZE,),
                            title: Optional[str] = None,
                            panels: Sequence[str] = ()) -> str:
  """Accuracy per communication round (Figures 2, 14-20)."""
  return plot_curves(frame, path, accuracy_column, analysis.ROUND, by,
                     xlabel='communication round', title=title,
                     panels=panels)


def plot_accuracy_vs_examples(frame: pd.DataFrame, path: str,
                              accuracy_column: str = analysis.TEST_ACCURACY,
                              by: Sequence[str] = (analysis.COHORT_SIZE,)
                              ) -> str:
  """Accuracy per cumulative examples processed (data efficiency, Fig. 7)."""
  return plot_curves(frame, path, accuracy_column,
                     analysis.CUMULATIVE_EXAMPLES, by,
                     xlabel='examples processed', log_x=True)


def plot_update_norm_vs_rounds(
    frame: pd.DataFrame, path: str,
    reference_cohort_size: Optional[int] = None) -> str:
  """`‖Δ‖` per round and cohort size (Figure 8 a-b, log scale).

  The title gives the exponent b of `analysis.fit_update_norm_scaling` (the
  paper: b ≈ -1/2). With `reference_cohort_size`, dashed lines show the
  inverse-square-root prediction from that cohort's norms (Figure 8 c).
  """
  curves = analysis.mean_curves(frame, analysis.UPDATE_NORM)
  if curves.empty:
    raise ValueError(f'no run records {analysis.UPDATE_NORM!r}')
  predicted = (analysis.predicted_update_norms(frame, reference_cohort_size)
               if reference_cohort_size is not None else None)
  fig, ax = plt.subplots(figsize=(6, 4))
  for cohort, rows in curves.groupby(analysis.COHORT_SIZE, sort=True):
    line, = ax.plot(rows[analysis.ROUND], rows[analysis.UPDATE_NORM],
                    label=_label([analysis.COHORT_SIZE], [cohort]))
    if predicted is not None and cohort != reference_cohort_size:
      prediction = predicted[predicted[analysis.COHORT_SIZE] == cohort]
      ax.plot(prediction[analysis.ROUND],
              prediction['predicted_update_norm'], '--',
              color=line.get_color())
  ax.set_yscale('log')
  ax.set_xlabel('communication round')
  ax.set_ylabel('‖Δ‖ (pseudo-gradient norm)')
  title = []
  if curves[analysis.COHORT_SIZE].nunique() > 1:
    fit = analysis.fit_update_norm_scaling(frame)
    title.append(f'fit of the mean over rounds: ‖Δ‖ ∝ M^{fit.exponent:.2f}')
  if predicted is not None:
    title.append('dashed: ‖Δ_ref‖·sqrt(M_ref/M),'
                 f' M_ref={reference_cohort_size}')
  ax.set_title('\n'.join(title), fontsize='small')
  ax.legend(fontsize='small')
  ax.grid(alpha=0.3)
  return _save(fig, path)


def _series(by: Sequence[str]) -> list[str]:
  """The labels other than the cohort size (it is the x axis)."""
  return [c for c in by if c != analysis.COHORT_SIZE]


def _cohort_size_axis(ax: plt.Axes, cohort_sizes: Sequence[float]) -> None:
  """A log-scale x axis ticked at the cohort sizes of the runs."""
  ticks = sorted(set(cohort_sizes))
  ax.set_xscale('log')
  ax.set_xticks(ticks, [_format_value(float(m)) for m in ticks])
  ax.minorticks_off()
  ax.set_xlabel('cohort size M')


def plot_accuracy_vs_cohort_size(
    frame: pd.DataFrame, path: str,
    accuracy_column: str = analysis.TEST_ACCURACY, how: str = 'final',
    by: Sequence[str] = (analysis.COHORT_SIZE,)) -> str:
  """Final or best accuracy against M, mean ± std over runs (Figures 5, 21)."""
  series = _series(by)
  per_run = analysis.accuracy_by_run(frame, accuracy_column, how,
                                     by=[analysis.COHORT_SIZE, *series])
  per_run = per_run.dropna(subset=['accuracy'])
  if per_run.empty:
    raise ValueError(f'no run has an evaluated {accuracy_column!r}')
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, rows in _groups(per_run, series):
    stats = rows.groupby(analysis.COHORT_SIZE)['accuracy'].agg(
        ['mean', lambda v: float(v.std(ddof=0))])
    ax.errorbar(stats.index, stats['mean'], yerr=stats.iloc[:, 1],
                marker='o', capsize=3, label=label or None)
  _cohort_size_axis(ax, per_run[analysis.COHORT_SIZE])
  ax.set_ylabel(f'{how} {accuracy_column}')
  if series:
    ax.legend(fontsize='small')
  ax.grid(alpha=0.3)
  return _save(fig, path)


def plot_rounds_to_accuracy(frame: pd.DataFrame, path: str,
                            thresholds: Sequence[float],
                            accuracy_column: str = analysis.TEST_ACCURACY
                            ) -> str:
  """Rounds to reach each threshold against M (Figures 3, 4, 23-27).

  Runs of one cohort size are averaged; a threshold some run never reaches
  leaves that point out.
  """
  crossings = analysis.threshold_crossings(frame, thresholds, accuracy_column)
  means = crossings.groupby([analysis.THRESHOLD, analysis.COHORT_SIZE])[
      'rounds'].agg(lambda v: v.mean(skipna=False)).reset_index()
  if means['rounds'].isna().all():
    raise ValueError(f'no run reaches any of the thresholds {list(thresholds)}'
                     f' in {accuracy_column!r}')
  fig, ax = plt.subplots(figsize=(6, 4))
  for threshold, rows in means.groupby(analysis.THRESHOLD, sort=True):
    ax.plot(rows[analysis.COHORT_SIZE], rows['rounds'], marker='o',
            label=f'{accuracy_column} ≥ {threshold:g}')
  _cohort_size_axis(ax, means[analysis.COHORT_SIZE])
  ax.set_ylabel('rounds to reach the threshold')
  ax.legend(fontsize='small')
  ax.grid(alpha=0.3)
  return _save(fig, path)


def plot_relative_time_to_accuracy(
    frame: pd.DataFrame, path: str, thresholds: Sequence[float],
    reference_cohort_size: int = 10,
    accuracy_column: str = analysis.TEST_ACCURACY,
    group_by: Sequence[str] = (analysis.STRAGGLER_LAMBDA,)) -> str:
  """Simulated time-to-accuracy relative to M_ref (Figures 28-31).

  One panel per `group_by` value (λ in the paper), one line per M.
  """
  relative = analysis.relative_time_to_accuracy(
      frame, thresholds, reference_cohort_size, accuracy_column,
      group_by=group_by)
  relative = relative[relative[analysis.COHORT_SIZE] != reference_cohort_size]
  if relative.empty:
    raise ValueError('relative time needs runs of a cohort size other than'
                     f' the reference {reference_cohort_size}')
  panels = list(_groups(relative, group_by))
  fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5),
                           squeeze=False, sharey=True)
  for ax, (title, rows) in zip(axes[0], panels):
    for cohort, cohort_rows in rows.groupby(analysis.COHORT_SIZE, sort=True):
      ax.plot(cohort_rows[analysis.THRESHOLD], cohort_rows['relative_time'],
              marker='o', label=_label([analysis.COHORT_SIZE], [cohort]))
    ax.axhline(1.0, color='gray', linewidth=0.8)
    ax.set_title(title, fontsize='small')
    ax.set_xlabel(f'{accuracy_column} reached')
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(f'time / time with M={reference_cohort_size}')
  axes[0][-1].legend(fontsize='small')
  return _save(fig, path)


def plot_accuracy_percentiles(frame: pd.DataFrame, path: str,
                              accuracy_column: str = analysis.TEST_ACCURACY,
                              by: Sequence[str] = (analysis.COHORT_SIZE,)
                              ) -> str:
  """Box plots of per-client accuracy percentiles (Figure 6).

  Whiskers at p5 and p95, box p25-p75, line at the median; each percentile
  is averaged over the runs sharing a label.
  """
  percentiles = analysis.final_percentiles(frame, accuracy_column, by=by)
  columns = [f'p{q}' for q in analysis.PERCENTILES]
  stats = []
  for label, rows in _groups(percentiles, by):
    p5, p25, p50, p75, p95 = rows[columns].mean().tolist()
    stats.append({'label': label, 'whislo': p5, 'q1': p25, 'med': p50,
                  'q3': p75, 'whishi': p95})
  fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stats)), 4))
  ax.bxp(stats, showfliers=False)
  ax.set_ylabel(f'per-client {accuracy_column}')
  ax.set_title('box: p25-p75, line: median, whiskers: p5 and p95',
               fontsize='small')
  ax.grid(alpha=0.3, axis='y')
  return _save(fig, path)


def plot_heatmap(grid: pd.DataFrame, path: str, *,
                 xlabel: Optional[str] = None, ylabel: Optional[str] = None,
                 colorbar_label: Optional[str] = None,
                 best: Optional[tuple[Any, Any]] = None,
                 title: Optional[str] = None, fmt: str = '.3f') -> str:
  """Heatmap of a 2-D grid (index: rows, columns: columns) with each cell's
  value written in it ('—' where NaN) and the `(row, column)` cell `best`
  boxed."""
  values = grid.to_numpy(float)
  fig, ax = plt.subplots(figsize=(1.1 * values.shape[1] + 2.5,
                                  0.8 * values.shape[0] + 1.8))
  image = ax.imshow(np.ma.masked_invalid(values), cmap='viridis',
                    origin='lower', aspect='auto')
  fig.colorbar(image, ax=ax, label=colorbar_label)
  ax.set_xticks(range(len(grid.columns)),
                [_format_value(v) for v in grid.columns])
  ax.set_yticks(range(len(grid.index)),
                [_format_value(v) for v in grid.index])
  ax.set_xlabel(xlabel or str(grid.columns.name or ''))
  ax.set_ylabel(ylabel or str(grid.index.name or ''))
  middle = np.nanmean(values) if np.isfinite(values).any() else 0.0
  for (i, j), value in np.ndenumerate(values):
    ax.text(j, i, format(value, fmt) if np.isfinite(value) else '—',
            ha='center', va='center', fontsize=8,
            color='black' if np.isfinite(value) and value > middle
            else 'white')
  if best is not None:
    ax.add_patch(plt.Rectangle(
        (list(grid.columns).index(best[1]) - 0.5,
         list(grid.index).index(best[0]) - 0.5), 1, 1, fill=False,
        edgecolor='red', linewidth=2))
  if title:
    ax.set_title(title)
  return _save(fig, path)


def plot_learning_rate_grid(
    frame: pd.DataFrame, path: str,
    rows: str = analysis.CLIENT_LEARNING_RATE,
    columns: str = analysis.SERVER_LEARNING_RATE,
    accuracy_column: str = analysis.VALIDATION_ACCURACY,
    how: str = 'final', title: Optional[str] = None) -> str:
  """Heatmap of mean accuracy over two flags; the best cell is boxed."""
  grid = analysis.learning_rate_grid(frame, rows, columns, accuracy_column,
                                     how)
  best_row, best_column, _ = analysis.best_learning_rates(grid)
  return plot_heatmap(grid, path, xlabel=_SHORT_NAMES.get(columns, columns),
                      ylabel=_SHORT_NAMES.get(rows, rows),
                      colorbar_label=f'{how} {accuracy_column}',
                      best=(best_row, best_column), title=title)


FIGURES = ('accuracy_vs_rounds', 'accuracy_vs_examples',
           'update_norm_vs_rounds', 'accuracy_vs_cohort_size',
           'rounds_to_accuracy', 'relative_time_to_accuracy',
           'accuracy_percentiles', 'learning_rate_grid')


def plot_gradient_coefficients(
    curves: Sequence[tuple[str, np.ndarray, np.ndarray, float]],
    path: str) -> str:
  """GeL's Figure 3: each update's gradient coefficients over the step k.

  `curves` holds `(label, measured, formula, momentum)`; as in the paper, the
  numerators `a_k (1 - momentum)` are drawn (measured: markers, formula:
  line).
  """
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for i, (label, measured, formula, momentum) in enumerate(curves):
    steps = np.arange(len(measured))
    (line,) = ax.plot(steps, np.asarray(formula) * (1 - momentum), '-',
                      alpha=0.5)
    # Smaller markers for later curves, so that coinciding ones stay visible.
    ax.plot(steps, np.asarray(measured) * (1 - momentum), 'os^D'[i % 4],
            markersize=max(8 - 2 * i, 3), color=line.get_color(), label=label)
  ax.xaxis.get_major_locator().set_params(integer=True)
  ax.set_xlabel('gradient step k')
  ax.set_ylabel('coefficient numerator a_k (1 - alpha)')
  ax.set_title('Gradient coefficients (markers: measured; lines: eq. (6))')
  ax.legend(fontsize='small')
  ax.grid(alpha=0.3)
  return _save(fig, path)


def default_thresholds(frame: pd.DataFrame,
                       accuracy_column: str) -> list[float]:
  """50, 60, 70, 80 and 90 % of the best accuracy any run reached."""
  best = frame[accuracy_column].max() if accuracy_column in frame else np.nan
  if not np.isfinite(best):
    raise ValueError(f'no run has an evaluated {accuracy_column!r}; pass'
                     ' --thresholds')
  return [round(float(best) * f, 4) for f in (0.5, 0.6, 0.7, 0.8, 0.9)]


def make_figures(frame: pd.DataFrame, output_dir: str,
                 figures: Sequence[str] = FIGURES,
                 accuracy_column: str = analysis.TEST_ACCURACY,
                 by: Sequence[str] = (analysis.COHORT_SIZE,),
                 thresholds: Optional[Sequence[float]] = None,
                 how: str = 'final',
                 straggler_reference_cohort_size: int = 10,
                 norm_reference_cohort_size: Optional[int] = None,
                 grid_rows: str = analysis.CLIENT_LEARNING_RATE,
                 grid_columns: str = analysis.SERVER_LEARNING_RATE,
                 grid_accuracy_column: str = analysis.VALIDATION_ACCURACY
                 ) -> tuple[dict[str, str], dict[str, str]]:
  """Writes `<output_dir>/<figure>.png` for each figure the runs allow.

  Returns:
    `(written, skipped)`: figure name -> PNG path, figure name -> why not.

  Raises:
    ValueError: For an unknown figure name.
  """
  unknown = [f for f in figures if f not in FIGURES]
  if unknown:
    raise ValueError(f'unknown figure(s) {", ".join(unknown)}; choose from'
                     f' {", ".join(FIGURES)}')
  def thresholds_or_default() -> Sequence[float]:
    return thresholds or default_thresholds(frame, accuracy_column)
  makers: dict[str, Callable[[str], str]] = {
      'accuracy_vs_rounds': lambda p: plot_accuracy_vs_rounds(
          frame, p, accuracy_column, by),
      'accuracy_vs_examples': lambda p: plot_accuracy_vs_examples(
          frame, p, accuracy_column, by),
      'update_norm_vs_rounds': lambda p: plot_update_norm_vs_rounds(
          frame, p, norm_reference_cohort_size),
      'accuracy_vs_cohort_size': lambda p: plot_accuracy_vs_cohort_size(
          frame, p, accuracy_column, how, by),
      'rounds_to_accuracy': lambda p: plot_rounds_to_accuracy(
          frame, p, thresholds_or_default(), accuracy_column),
      'relative_time_to_accuracy': lambda p: plot_relative_time_to_accuracy(
          frame, p, thresholds_or_default(), straggler_reference_cohort_size,
          accuracy_column),
      'accuracy_percentiles': lambda p: plot_accuracy_percentiles(
          frame, p, accuracy_column, by),
      'learning_rate_grid': lambda p: plot_learning_rate_grid(
          frame, p, grid_rows, grid_columns, grid_accuracy_column, how),
  }
  written, skipped = {}, {}
  for name in figures:
    try:
      written[name] = makers[name](os.path.join(output_dir, f'{name}.png'))
    except ValueError as e:
      skipped[name] = str(e)
  return written, skipped


def _floats(text: str) -> list[float]:
  try:
    return [float(v) for v in text.split(',') if v.strip()]
  except ValueError as e:
    raise argparse.ArgumentTypeError(
        f'expected comma-separated numbers, got {text!r}') from e


def _names(text: str) -> list[str]:
  return [v.strip() for v in text.split(',') if v.strip()]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m reproduce.plots',
      description=__doc__.split('\n\n')[0])
  parser.add_argument('--run_dirs', type=_names, required=True,
                      help='Comma-separated run directories or roots of them.')
  parser.add_argument('--output_dir', required=True,
                      help='Where the PNG files go.')
  parser.add_argument('--figures', type=_names, default=list(FIGURES),
                      help=f'Comma-separated subset of: {", ".join(FIGURES)}.')
  parser.add_argument('--accuracy_column', default=analysis.TEST_ACCURACY,
                      help='Evaluated accuracy to plot.')
  parser.add_argument('--by', type=_names, default=[analysis.COHORT_SIZE],
                      help='Comma-separated columns labelling the lines.')
  parser.add_argument('--thresholds', type=_floats, default=None,
                      help='Accuracy thresholds; default: 50-90%% of the best'
                      ' accuracy reached.')
  parser.add_argument('--how', choices=('final', 'best'), default='final',
                      help='Accuracy of a run: last evaluation or best one.')
  parser.add_argument('--straggler_reference_cohort_size', type=int,
                      default=10, help='M_ref of the relative time (B.5).')
  parser.add_argument('--norm_reference_cohort_size', type=int, default=None,
                      help='Draw the sqrt-rule prediction of ‖Δ‖ from this M.')
  parser.add_argument('--grid_rows', default=analysis.CLIENT_LEARNING_RATE,
                      help='Flag on the rows of the learning-rate grid.')
  parser.add_argument('--grid_columns', default=analysis.SERVER_LEARNING_RATE,
                      help='Flag on the columns of the learning-rate grid.')
  parser.add_argument('--grid_accuracy_column',
                      default=analysis.VALIDATION_ACCURACY,
                      help='Accuracy shown in the learning-rate grid.')
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Writes the figures; returns 0, 1 if none could be made, 2 for bad input."""
  args = _parser().parse_args(argv)
  try:
    frame = analysis.load_runs(args.run_dirs)
    written, skipped = make_figures(
        frame, args.output_dir, args.figures, args.accuracy_column, args.by,
        args.thresholds, args.how, args.straggler_reference_cohort_size,
        args.norm_reference_cohort_size, args.grid_rows, args.grid_columns,
        args.grid_accuracy_column)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for path in written.values():
    print(f'wrote   {path}')
  for name, reason in skipped.items():
    print(f'skipped {name}: {reason}')
  return 0 if written else 1


if __name__ == '__main__':
  sys.exit(main())
