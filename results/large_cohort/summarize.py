"""Tables and figures of the FedAvg cohort-size runs on Synthetic (§3-4).

    .venv/bin/python results/large_cohort/summarize.py \
        --root=/tmp/e2runs/large_cohort

Reads every run directory under `--root` with `fl_common.analysis` and,
separately for the runs that weight client updates by examples (the driver's
default) and those with `--uniform_weighting`, compares the cohort sizes over
the rounds all runs reached (`--max_round`, default: the shortest run's last
round), so that a longer run's later, smaller norms do not bias the
comparison. Writes into this directory:

* `update_norm_ratios.csv` (`_uniform.csv` for the uniform runs; likewise
  every file below): for each pair M1 < M2, `‖Δ_1‖/‖Δ_2‖` (norms
  averaged over rounds `--min_round`..`--max_round`, and over each of
  `--windows`) against the paper's `sqrt(M2/M1)` and against
  `sqrt(E[Σp²]_M1 / E[Σp²]_M2)`, the ratio nearly orthogonal updates of
  equal norm give when the server weights client k by its examples
  (`p_k = n_k / Σ n`, as the driver's FedAvg does; the sqrt rule is the
  special case of equal weights, and the prediction of the uniform runs).
  `E[Σp²]` is estimated by drawing cohorts from the run's training clients
  (Synthetic's sizes are heavy-tailed, so the weighted mean averages fewer
  effective clients than M);
* `per_cohort_summary.csv`: per M, mean `‖Δ‖` and mean pairwise cosine over
  the window (and over its last 50 rounds), test accuracy at the window's
  end, best test accuracy, and rounds and examples to each accuracy
  threshold;
* `update_norm_vs_rounds.png` (with the sqrt-rule prediction from M=50),
  `cosine_vs_rounds.png`, `accuracy_vs_rounds.png`,
  `rounds_to_accuracy.png`.

A weighting with runs of a single cohort size is skipped.
"""

import argparse
import os
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
from experiment_driver import runtime  # pylint: disable=g-import-not-at-top
from fl_common import analysis  # pylint: disable=g-import-not-at-top
from fl_common import plots  # pylint: disable=g-import-not-at-top
from tasks import synthetic  # pylint: disable=g-import-not-at-top
from tasks import validation_split  # pylint: disable=g-import-not-at-top

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
COSINE = 'mean_pairwise_cosine'
WEIGHTING = 'uniform_weighting'  # hparams.json: False = by examples


def _floats(text: str) -> list[float]:
  return [float(v) for v in text.split(',') if v.strip()]


def _windows(text: str) -> list[tuple[int, int]]:
  """`'10-50,51-100'` -> `[(10, 50), (51, 100)]`."""
  return [tuple(int(r) for r in w.split('-')) for w in text.split(',')]


def expected_sum_of_squared_weights(cohort_size: int, seed: int = 0,
                                    validation_fraction: float = 0.2,
                                    num_draws: int = 4000) -> float:
  """`E[Σ_k p_k²]`, `p_k ∝` training examples, over uniform cohorts.

  The training clients and their example counts are those of the driver's
  Synthetic task with the given split seed and validation fraction.
  """
  clients = synthetic.generate_synthetic_clients()
  train, _ = synthetic.split_client_examples(clients, synthetic.LEAF_SEED)
  ids = [f'{i:04d}' for i in range(len(clients))]
  train_ids, _ = validation_split.split_client_ids(ids, validation_fraction,
                                                   seed)
  sizes = np.array([len(train[int(i)][1]) for i in train_ids], float)
  rng = np.random.default_rng(seed)
  total = 0.0
  for _ in range(num_draws):
    weights = sizes[rng.choice(len(sizes), cohort_size, replace=False)]
    total += np.sum((weights / weights.sum())**2)
  return total / num_draws


def _with_weighted_prediction(ratios: pd.DataFrame,
                              sum_sq: dict[int, float]) -> pd.DataFrame:
  ratios['weighted_orthogonal_ratio'] = [
      np.sqrt(sum_sq[int(m1)] / sum_sq[int(m2)])
      for m1, m2 in zip(ratios['cohort_size_1'], ratios['cohort_size_2'])]
  ratios['ratio_to_weighted_prediction'] = (
      ratios['observed_ratio'] / ratios['weighted_orthogonal_ratio'])
  return ratios


def _summarize_weighting(window: pd.DataFrame, uniform: bool,
                         args: argparse.Namespace,
                         max_round: int) -> tuple[pd.DataFrame, pd.DataFrame]:
  """Norm ratios and per-M summary of the runs of one client weighting."""
  weighting = 'uniform' if uniform else 'examples'
  ratios = []
  for first, last in [(args.min_round, max_round), *args.windows]:
    if last <= max_round:
      part = analysis.update_norm_ratios(
          window[window[analysis.ROUND] <= last], min_round=first)
      part.insert(0, 'rounds', f'{first}-{last}')
      ratios.append(part)
  ratios = pd.concat(ratios, ignore_index=True)
  cohort_sizes = sorted(int(m) for m in window[analysis.COHORT_SIZE].unique())
  # Uniform weights p_k = 1/M give Σp² = 1/M: the prediction is the sqrt rule.
  sum_sq = {m: 1.0 / m if uniform else expected_sum_of_squared_weights(m)
            for m in cohort_sizes}
  print(f'[{weighting}] E[sum p^2] per M:',
        {m: round(v, 4) for m, v in sum_sq.items()},
        'effective cohort 1/E:', {m: round(1 / v, 1) for m, v in sum_sq.items()})
  ratios = _with_weighted_prediction(ratios, sum_sq)
  ratios.insert(0, 'weighting', weighting)
  fit = analysis.fit_update_norm_scaling(window, min_round=args.min_round)
  print(f'[{weighting}] fit over M: ||Delta|| ~ M^{fit.exponent:.3f} (R^2'
        f' {fit.r_squared:.3f}); sqrt rule: M^-0.5')

  in_window = window[window[analysis.ROUND] >= args.min_round]
  late = window[window[analysis.ROUND] > max_round - 50]
  crossings = analysis.threshold_crossings(window, args.thresholds)
  rows = []
  for cohort, rows_m in in_window.groupby(analysis.COHORT_SIZE):
    run_rows = window[window[analysis.COHORT_SIZE] == cohort]
    evaluated = run_rows[run_rows[analysis.TEST_ACCURACY].notna()]
    row = {
        'weighting': weighting,
        'clients_per_round': int(cohort),
        'effective_cohort_1_over_E_sum_p2': 1 / sum_sq[int(cohort)],
        'update_norm_exponent_fit': fit.exponent,
        'mean_update_norm': rows_m[analysis.UPDATE_NORM].mean(),
        'mean_update_norm_last50': late[late[analysis.COHORT_SIZE] == cohort][
            analysis.UPDATE_NORM].mean(),
        'mean_pairwise_cosine': rows_m[COSINE].mean(),
        'mean_pairwise_cosine_last50': late[late[analysis.COHORT_SIZE] ==
                                            cohort][COSINE].mean(),
        'test_accuracy_at_window_end': evaluated[
            analysis.TEST_ACCURACY].iloc[-1],
        'best_test_accuracy': evaluated[analysis.TEST_ACCURACY].max(),
        'catastrophic_failures': int(run_rows[
            analysis.CATASTROPHIC_FAILURE].fillna(0).sum()),
    }
    for _, crossing in crossings[crossings[analysis.COHORT_SIZE] ==
                                 cohort].iterrows():
      threshold = crossing[analysis.THRESHOLD]
      row[f'rounds_to_{threshold:g}'] = crossing['rounds']
      row[f'examples_to_{threshold:g}'] = crossing['examples']
    rows.append(row)

  suffix = '_uniform' if uniform else ''
  print(plots.plot_update_norm_vs_rounds(
      window, os.path.join(OUT_DIR, f'update_norm_vs_rounds{suffix}.png'),
      reference_cohort_size=args.reference_cohort_size))
  print(plots.plot_accuracy_vs_rounds(
      window, os.path.join(OUT_DIR, f'accuracy_vs_rounds{suffix}.png')))
  print(plots.plot_rounds_to_accuracy(
      window, os.path.join(OUT_DIR, f'rounds_to_accuracy{suffix}.png'),
      args.thresholds))
  fig, ax = plt.subplots(figsize=(6, 4))
  for cohort, rows_m in window.groupby(analysis.COHORT_SIZE):
    ax.plot(rows_m[analysis.ROUND], rows_m[COSINE], label=f'M={int(cohort)}',
            linewidth=0.8)
  ax.axhline(0.0, color='gray', linewidth=0.8)
  ax.set_xlabel('communication round')
  ax.set_ylabel('mean pairwise cosine of client updates (eq. 5)')
  ax.set_title(f'client updates weighted by {weighting}')
  ax.legend(fontsize='small')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  path = os.path.join(OUT_DIR, f'cosine_vs_rounds{suffix}.png')
  fig.savefig(path, dpi=120)
  plt.close(fig)
  print(path)
  return ratios, pd.DataFrame(rows)


def main() -> None:
  # No computation runs here: TFF's default runtime would only fail noisily
  # at exit.
  runtime.refuse_unmanaged_default_context()
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--root', default='/tmp/e2runs/large_cohort')
  parser.add_argument('--min_round', type=int, default=10,
                      help='First round of the norm/cosine window (the paper:'
                      ' the rule holds "after a small number of rounds").')
  parser.add_argument('--max_round', type=int, default=None)
  parser.add_argument('--windows', type=_windows,
                      default=[(10, 100), (101, 200), (201, 300)],
                      help='Round windows over which norms are also averaged.')
  parser.add_argument('--thresholds', type=_floats,
                      default=[0.6, 0.65, 0.7, 0.75, 0.8, 0.85])
  parser.add_argument('--reference_cohort_size', type=int, default=50)
  args = parser.parse_args()

  frame = analysis.load_runs([args.root])
  last_rounds = frame.groupby(analysis.RUN)[analysis.ROUND].max()
  max_round = args.max_round or int(last_rounds.min())
  window = frame[frame[analysis.ROUND] <= max_round]
  print(f'runs: {dict(last_rounds)}; common window: rounds'
        f' {args.min_round}..{max_round}')
  for uniform, runs in window.groupby(WEIGHTING, sort=True):
    if runs[analysis.COHORT_SIZE].nunique() < 2:
      print(f'uniform_weighting={uniform}: one cohort size only, skipped')
      continue
    ratios, summary = _summarize_weighting(runs, bool(uniform), args,
                                           max_round)
    suffix = '_uniform' if uniform else ''
    ratios.to_csv(os.path.join(OUT_DIR, f'update_norm_ratios{suffix}.csv'),
                  index=False, float_format='%.4f')
    summary.to_csv(os.path.join(OUT_DIR, f'per_cohort_summary{suffix}.csv'),
                   index=False, float_format='%.4f')
    with pd.option_context('display.width', 250, 'display.max_columns', 40):
      print(ratios.to_string(index=False))
      print(summary.T)


if __name__ == '__main__':
  main()
