"""Tests of reproduce.analysis on small hand-made run directories."""

import math
import os

import numpy as np
import pandas as pd
import pytest

from reproduce import analysis
from tests import run_directories


def accuracy_run(root, name, cohort, accuracies, examples_per_round=10.0,
                 time_per_round=1.0, **hparams):
  """A run evaluated every round with the given test accuracies."""
  rounds = np.arange(1, len(accuracies) + 1)
  return run_directories.write_run(
      root, name, {'clients_per_round': cohort, **hparams}, {
          'round': rounds,
          'clients_per_round': [float(cohort)] * len(rounds),
          'test/accuracy': accuracies,
          'cumulative_examples_processed': examples_per_round * rounds,
          'cumulative_simulated_round_time': time_per_round * rounds,
      })


def norm_run(root, name, cohort, norms, seed=0):
  rounds = np.arange(1, len(norms) + 1)
  return run_directories.write_run(
      root, name, {'clients_per_round': cohort, 'seed': seed}, {
          'round': rounds, 'clients_per_round': [float(cohort)] * len(rounds),
          'update_norm': norms})


def test_load_runs_joins_flags_to_every_round(tmp_path):
  run_directories.write_run(tmp_path, 'a', {'task': 'emnist', 'seed': 1,
                                            'clients_per_round': 7,
                                            'server_learning_rate': None,
                                            'worker_addresses': ['h:1']},
                            {'round': [2, 1], 'clients_per_round': [5.0, 5.0],
                             'train/loss': [0.5, 0.9]})
  run_directories.write_run(tmp_path, 'b', {'task': 'emnist', 'seed': 2},
                            {'round': [1], 'train/loss': [0.7]})

  frame = analysis.load_runs([str(tmp_path)])

  assert list(frame[analysis.EXPERIMENT_NAME]) == ['a', 'a', 'b']
  assert list(frame['round']) == [1, 2, 1]  # sorted within a run
  assert list(frame['train/loss']) == [0.9, 0.5, 0.7]
  assert list(frame['seed']) == [1, 1, 2]
  # The per-round metric wins over the flag of the same name.
  assert list(frame['clients_per_round'][:2]) == [5.0, 5.0]
  assert frame['server_learning_rate'].isna().all()
  assert frame['worker_addresses'].iloc[0] == '["h:1"]'
  # A run directory given directly loads the same rows.
  single = analysis.load_runs(str(tmp_path / 'b'))
  assert list(single['train/loss']) == [0.7]


def test_load_runs_rejects_missing_or_incomplete_directories(tmp_path):
  with pytest.raises(ValueError, match='does not exist'):
    analysis.load_runs([str(tmp_path / 'nowhere')])
  with pytest.raises(ValueError, match='holds no metrics.csv'):
    analysis.load_runs([str(tmp_path)])
  os.makedirs(tmp_path / 'run')
  pd.DataFrame({'round': [1]}).to_csv(tmp_path / 'run' / 'metrics.csv')
  with pytest.raises(ValueError, match='hparams.json does not exist'):
    analysis.load_runs([str(tmp_path / 'run')])


def test_threshold_crossings_first_round_and_examples(tmp_path):
  accuracy_run(tmp_path, 'm10', 10, [0.1, 0.4, 0.3, 0.6, 0.7],
               examples_per_round=100.0)
  run_directories.write_run(tmp_path, 'm50', {'clients_per_round': 50}, {
      'round': [1, 2, 3, 4],
      'clients_per_round': [50.0] * 4,
      'test/accuracy': [np.nan, 0.5, np.nan, 0.65],  # evaluated every 2
      'cumulative_examples_processed': [500.0, 1000.0, 1500.0, 2000.0]})
  frame = analysis.load_runs([str(tmp_path)])

  crossings = analysis.threshold_crossings(frame, [0.3, 0.5, 0.65, 0.9])

  by_run = {(row.clients_per_round, row.threshold): (row.rounds, row.examples)
            for row in crossings.itertuples()}
  assert by_run[(10, 0.3)] == (2, 200.0)  # 0.4 >= 0.3 first at round 2
  assert by_run[(10, 0.5)] == (4, 400.0)  # the dip at round 3 does not count
  assert by_run[(10, 0.65)] == (5, 500.0)
  assert by_run[(50, 0.3)] == (2, 1000.0)  # NaN rounds are not evaluations
  assert by_run[(50, 0.5)] == (2, 1000.0)  # reaching counts (>=)
  assert by_run[(50, 0.65)] == (4, 2000.0)
  for cohort in (10, 50):
    rounds, examples = by_run[(cohort, 0.9)]
    assert math.isnan(rounds) and math.isnan(examples)


def test_threshold_crossings_rejects_bad_thresholds_and_columns(tmp_path):
  accuracy_run(tmp_path, 'm10', 10, [0.1, 0.4])
  frame = analysis.load_runs([str(tmp_path)])
  with pytest.raises(ValueError, match='thresholds'):
    analysis.threshold_crossings(frame, [])
  with pytest.raises(ValueError, match='thresholds'):
    analysis.threshold_crossings(frame, [float('nan')])
  with pytest.raises(ValueError, match="'validation/accuracy'"):
    analysis.threshold_crossings(frame, [0.5],
                                 accuracy_column='validation/accuracy')


def test_relative_time_to_accuracy_divides_by_reference_cohort(tmp_path):
  # Per lambda: M=10 takes 1 time unit per round, larger cohorts more.
  for lam, slowdown in ((1.0, 1.0), (10.0, 3.0)):
    accuracy_run(tmp_path, f'm10_l{lam}', 10, [0.2, 0.4, 0.6, 0.8],
                 time_per_round=1.0, straggler_lambda=lam)
    accuracy_run(tmp_path, f'm100_l{lam}', 100, [0.4, 0.8, 0.8, 0.8],
                 time_per_round=2.0 * slowdown, straggler_lambda=lam)
  frame = analysis.load_runs([str(tmp_path)])

  result = analysis.relative_time_to_accuracy(frame, [0.4, 0.8, 0.9],
                                              reference_cohort_size=10)

  relative = {(r.straggler_lambda, r.clients_per_round, r.threshold):
              r.relative_time for r in result.itertuples()}
  # a = 0.4: M=10 needs 2 rounds (time 2), M=100 1 round (time 2·slowdown).
  assert relative[(1.0, 100, 0.4)] == pytest.approx(1.0)
  assert relative[(10.0, 100, 0.4)] == pytest.approx(3.0)
  # a = 0.8: M=10 at round 4 (time 4), M=100 at round 2 (time 4·slowdown).
  assert relative[(1.0, 100, 0.8)] == pytest.approx(1.0)
  assert relative[(10.0, 100, 0.8)] == pytest.approx(3.0)
  assert relative[(10.0, 10, 0.8)] == pytest.approx(1.0)
  assert math.isnan(relative[(1.0, 100, 0.9)])  # never reached


def test_relative_time_averages_seeds_and_needs_the_reference(tmp_path):
  accuracy_run(tmp_path, 'm10', 10, [0.5], time_per_round=2.0,
               straggler_lambda=1.0)
  accuracy_run(tmp_path, 'm20_s0', 20, [0.5], time_per_round=3.0,
               straggler_lambda=1.0, seed=0)
  accuracy_run(tmp_path, 'm20_s1', 20, [0.5], time_per_round=5.0,
               straggler_lambda=1.0, seed=1)
  accuracy_run(tmp_path, 'm20_l10', 20, [0.5], straggler_lambda=10.0)
  frame = analysis.load_runs([str(tmp_path)])

  with pytest.raises(ValueError, match=r"clients_per_round=10.*10\.0"):
    analysis.relative_time_to_accuracy(frame, [0.5])
  kept = frame[frame['straggler_lambda'] == 1.0]
  result = analysis.relative_time_to_accuracy(kept, [0.5])
  row = result[result['clients_per_round'] == 20].iloc[0]
  assert row['time'] == pytest.approx(4.0)  # mean of 3 and 5
  assert row['relative_time'] == pytest.approx(2.0)


@pytest.mark.parametrize('exponent', [-0.5, -0.3])
def test_fit_update_norm_scaling_recovers_the_exponent(tmp_path, exponent):
  # ‖Δ‖(M, t) = c(t) · M^exponent, with a round-dependent c(t).
  scale = np.array([5.0, 2.0, 1.0, 0.8])
  for cohort in (10, 50, 200, 800):
    norm_run(tmp_path, f'm{cohort}', cohort, scale * cohort**exponent)
  frame = analysis.load_runs([str(tmp_path)])

  fit = analysis.fit_update_norm_scaling(frame)
  assert fit.exponent == pytest.approx(exponent, abs=1e-9)
  assert np.exp(fit.intercept) == pytest.approx(scale.mean(), rel=1e-9)
  assert fit.r_squared == pytest.approx(1.0)
  assert fit.num_runs == 4
  at_round = analysis.fit_update_norm_scaling(frame, at_round=3)
  assert at_round.exponent == pytest.approx(exponent, abs=1e-9)
  assert at_round.predict(100) == pytest.approx(100**exponent)


def test_fit_update_norm_scaling_on_noisy_seeds_and_late_rounds(tmp_path):
  rng = np.random.default_rng(0)
  for cohort in (16, 64, 256, 1024):
    for seed in range(3):
      # Early rounds break the law; from round 3 on ‖Δ‖ = 2/sqrt(M)·noise.
      norms = np.concatenate([[1.0, 1.0], 2.0 / np.sqrt(cohort) *
                              rng.lognormal(0.0, 0.05, size=20)])
      norm_run(tmp_path, f'm{cohort}_s{seed}', cohort, norms, seed=seed)
  frame = analysis.load_runs([str(tmp_path)])

  late = analysis.fit_update_norm_scaling(frame, min_round=3)
  assert late.exponent == pytest.approx(-0.5, abs=0.02)
  assert late.num_runs == 12
  everything = analysis.fit_update_norm_scaling(frame)
  assert everything.exponent > -0.45  # the first rounds pull it up


def test_update_norm_ratios_match_sqrt_rule_only_for_inverse_sqrt(tmp_path):
  for cohort, norm in ((10, 1.0), (40, 0.5), (160, 0.5)):
    norm_run(tmp_path, f'm{cohort}', cohort, [norm, norm])
  frame = analysis.load_runs([str(tmp_path)])

  ratios = analysis.update_norm_ratios(frame).set_index(
      ['cohort_size_1', 'cohort_size_2'])

  assert ratios.loc[(10, 40), 'observed_ratio'] == pytest.approx(2.0)
  assert ratios.loc[(10, 40), 'predicted_ratio'] == pytest.approx(2.0)
  assert ratios.loc[(10, 40), 'ratio_to_prediction'] == pytest.approx(1.0)
  assert ratios.loc[(40, 160), 'ratio_to_prediction'] == pytest.approx(0.5)
  assert ratios.loc[(10, 160), 'predicted_ratio'] == pytest.approx(4.0)
  assert len(ratios) == 3


def test_update_norm_ratios_predicted_with_the_measured_cosine(tmp_path):
  # Unit client updates with pairwise cosine c average to a norm
  # sqrt((1 + (M - 1) c) / M): with c = 0.1, M = 10 gives sqrt(0.19) and
  # M = 100 sqrt(0.109); the round-1 transient (cosine 0.9) is left out.
  for cohort, cosine in ((10, 0.1), (100, 0.1)):
    norm = math.sqrt((1 + (cohort - 1) * cosine) / cohort)
    run_directories.write_run(tmp_path, f'm{cohort}', {
        'clients_per_round': cohort, 'seed': 0}, {
            'round': [1, 2, 3], 'clients_per_round': [float(cohort)] * 3,
            'update_norm': [5.0, norm, norm],
            'mean_pairwise_cosine': [0.9, cosine, cosine]})
  frame = analysis.load_runs([str(tmp_path)])
  [row] = analysis.update_norm_ratios(frame, min_round=2).to_dict('records')
  assert row['observed_ratio'] == pytest.approx(math.sqrt(0.19 / 0.109))
  assert row['predicted_ratio'] == pytest.approx(math.sqrt(10))
  assert row['cosine_predicted_ratio'] == pytest.approx(
      math.sqrt(0.19 / 0.109))
  assert row['ratio_to_cosine_prediction'] == pytest.approx(1.0)
  assert row['ratio_to_prediction'] < 0.45  # 1/sqrt(M) misses by 2.4x


def test_update_norm_analyses_reject_unusable_runs(tmp_path):
  norm_run(tmp_path, 'm10', 10, [1.0, 0.5])
  norm_run(tmp_path, 'm10b', 10, [1.0, 0.6], seed=1)
  frame = analysis.load_runs([str(tmp_path)])
  with pytest.raises(ValueError, match='two cohort sizes'):
    analysis.fit_update_norm_scaling(frame)
  with pytest.raises(ValueError, match='round 7'):
    analysis.mean_update_norms(frame, at_round=7)
  norm_run(tmp_path, 'm20', 20, [0.0, 0.0])
  with pytest.raises(ValueError, match='positive'):
    analysis.fit_update_norm_scaling(analysis.load_runs([str(tmp_path)]))


def test_mean_update_norms_skip_nonfinite_rounds(tmp_path):
  norm_run(tmp_path, 'm10', 10, [1.0, np.nan, 3.0, np.inf])
  norms = analysis.mean_update_norms(analysis.load_runs([str(tmp_path)]))
  assert norms['update_norm'].tolist() == [2.0]


def test_predicted_update_norms_scale_the_reference_per_round(tmp_path):
  norm_run(tmp_path, 'm50', 50, [2.0, 1.0])
  norm_run(tmp_path, 'm200_s0', 200, [1.1, 0.4])
  norm_run(tmp_path, 'm200_s1', 200, [0.9, 0.6], seed=1)
  frame = analysis.load_runs([str(tmp_path)])

  predicted = analysis.predicted_update_norms(frame, reference_cohort_size=50)

  rows = predicted.set_index(['clients_per_round', 'round'])
  assert rows.loc[(200, 1), 'predicted_update_norm'] == pytest.approx(1.0)
  assert rows.loc[(200, 2), 'predicted_update_norm'] == pytest.approx(0.5)
  assert rows.loc[(200, 1), 'update_norm'] == pytest.approx(1.0)  # mean
  assert rows.loc[(50, 2), 'predicted_update_norm'] == pytest.approx(1.0)
  with pytest.raises(ValueError, match='clients_per_round=10 '):
    analysis.predicted_update_norms(frame, reference_cohort_size=10)


def test_catastrophic_failures_counts_flagged_rounds(tmp_path):
  run_directories.write_run(tmp_path, 'failing', {'clients_per_round': 800}, {
      'round': [1, 2, 3, 4], 'clients_per_round': [800.0] * 4,
      'catastrophic_failure': [0.0, 1.0, 0.0, 1.0]})
  run_directories.write_run(tmp_path, 'fine', {'clients_per_round': 10}, {
      'round': [1, 2], 'clients_per_round': [10.0] * 2,
      'catastrophic_failure': [0.0, 0.0]})
  failures = analysis.catastrophic_failures(
      analysis.load_runs([str(tmp_path)])).set_index('clients_per_round')
  assert failures.loc[800, 'failures'] == 2
  assert failures.loc[800, 'first_failure_round'] == 2
  assert failures.loc[10, 'failures'] == 0
  assert math.isnan(failures.loc[10, 'first_failure_round'])


def test_the_server_detector_reads_the_cohort_accuracy_before_each_round(
    tmp_path):
  # The averaged train accuracy never halves; the server model does, before
  # round 3 (0.6 -> 0.25) and again before round 5 (0.5 -> 0.2), its rows
  # out of order and one unevaluated round between.
  run_directories.write_run(tmp_path, 'failing', {'clients_per_round': 800}, {
      'round': [5, 1, 2, 3, 4, 6], 'clients_per_round': [800.0] * 6,
      'catastrophic_failure': [0.0] * 6,
      'cohort/accuracy': [0.2, 0.1, 0.6, 0.25, np.nan, 0.3]})
  run_directories.write_run(tmp_path, 'fine', {'clients_per_round': 10}, {
      'round': [1, 2, 3], 'clients_per_round': [10.0] * 3,
      'catastrophic_failure': [0.0, 1.0, 0.0],
      'cohort/accuracy': [0.0, 0.4, 0.21]})
  frame = analysis.load_runs([str(tmp_path)])
  server = analysis.catastrophic_failures(
      frame, detector=analysis.SERVER_DETECTOR).set_index('clients_per_round')
  assert server.loc[800, 'failures'] == 1  # 0.25 -> 0.2 is not a halving
  assert server.loc[800, 'first_failure_round'] == 3
  assert server.loc[10, 'failures'] == 0  # from 0 nothing can be lost
  train = analysis.catastrophic_failures(frame).set_index('clients_per_round')
  assert train.loc[800, 'failures'] == 0 and train.loc[10, 'failures'] == 1
  with pytest.raises(ValueError, match='detector must be'):
    analysis.catastrophic_failures(frame, detector='test')
  with pytest.raises(ValueError, match='cohort/accuracy'):
    analysis.catastrophic_failures(frame.drop(columns='cohort/accuracy'),
                                   detector=analysis.SERVER_DETECTOR)


def test_the_held_out_detector_reads_the_validation_clients_round_to_round(
    tmp_path):
  # Evaluated every round, the validation accuracy halves before round 3
  # (0.8 -> 0.3) and before round 5 (0.7 -> 0.35); evaluated every 2 rounds,
  # a halving from round 2 to 4 spans two rounds' updates and is not one.
  run_directories.write_run(tmp_path, 'every_round', {'clients_per_round': 800},
                            {'round': [1, 2, 3, 4, 5],
                             'clients_per_round': [800.0] * 5,
                             'validation/accuracy': [0.5, 0.8, 0.3, 0.7,
                                                     0.35]})
  run_directories.write_run(tmp_path, 'sparse', {'clients_per_round': 10}, {
      'round': [1, 2, 3, 4], 'clients_per_round': [10.0] * 4,
      'validation/accuracy': [np.nan, 0.8, np.nan, 0.3]})
  failures = analysis.catastrophic_failures(
      analysis.load_runs([str(tmp_path)]),
      detector=analysis.HELD_OUT_DETECTOR).set_index('clients_per_round')
  assert failures.loc[800, 'failures'] == 2
  assert failures.loc[800, 'first_failure_round'] == 3
  assert failures.loc[10, 'failures'] == 0


def test_accuracy_by_run_final_and_best(tmp_path):
  run_directories.write_run(tmp_path, 'run', {'clients_per_round': 10}, {
      'round': [1, 2, 3, 4], 'clients_per_round': [10.0] * 4,
      'test/accuracy': [np.nan, 0.7, 0.6, np.nan]})
  run_directories.write_run(tmp_path, 'never', {'clients_per_round': 20}, {
      'round': [1], 'clients_per_round': [20.0], 'test/accuracy': [np.nan]})
  frame = analysis.load_runs([str(tmp_path)])
  final = analysis.accuracy_by_run(frame, how='final').set_index(
      'clients_per_round')['accuracy']
  best = analysis.accuracy_by_run(frame, how='best').set_index(
      'clients_per_round')['accuracy']
  assert final[10] == pytest.approx(0.6)
  assert best[10] == pytest.approx(0.7)
  assert math.isnan(final[20]) and math.isnan(best[20])
  with pytest.raises(ValueError, match="'median'"):
    analysis.accuracy_by_run(frame, how='median')


def test_final_percentiles_read_the_last_evaluation(tmp_path):
  columns = {f'test/accuracy_p{q}': [q / 200, np.nan, q / 100, np.nan]
             for q in analysis.PERCENTILES}
  run_directories.write_run(tmp_path, 'run', {'clients_per_round': 10}, {
      'round': [1, 2, 3, 4], 'clients_per_round': [10.0] * 4, **columns})
  frame = analysis.load_runs([str(tmp_path)])
  row = analysis.final_percentiles(frame).iloc[0]
  assert row['round'] == 3
  assert [row[f'p{q}'] for q in analysis.PERCENTILES] == pytest.approx(
      [0.05, 0.25, 0.5, 0.75, 0.95])
  with pytest.raises(ValueError, match='validation/accuracy_p5'):
    analysis.final_percentiles(frame, accuracy_column='validation/accuracy')


def test_learning_rate_grid_averages_seeds_and_finds_the_best(tmp_path):
  accuracies = {(0.1, 1.0): [0.6, 0.8], (0.1, 0.01): [0.3],
                (1.0, 1.0): [0.5], (1.0, 0.01): [0.1]}
  for (client_lr, server_lr), values in accuracies.items():
    for seed, value in enumerate(values):
      run_directories.write_run(
          tmp_path, f'c{client_lr}_s{server_lr}_seed{seed}', {
              'client_learning_rate': client_lr,
              'server_learning_rate': server_lr, 'seed': seed}, {
                  'round': [1, 2], 'clients_per_round': [10.0, 10.0],
                  'validation/accuracy': [0.0, value]})
  frame = analysis.load_runs([str(tmp_path)])

  grid = analysis.learning_rate_grid(frame)

  assert list(grid.index) == [0.1, 1.0]
  assert list(grid.columns) == [0.01, 1.0]
  assert grid.loc[0.1, 1.0] == pytest.approx(0.7)
  assert grid.loc[1.0, 0.01] == pytest.approx(0.1)
  assert analysis.best_learning_rates(grid) == (0.1, 1.0, pytest.approx(0.7))
  # A cell equal to the best but for float rounding ties with it, and the
  # tie goes to the smaller client rate, wherever it stands in the grid.
  grid.loc[1.0, 0.01] = grid.loc[0.1, 1.0] + 1e-9
  assert analysis.best_learning_rates(grid)[:2] == (0.1, 1.0)
  grid.loc[1.0, 0.01] = grid.loc[0.1, 1.0] + 1e-3
  assert analysis.best_learning_rates(grid) == (1.0, 0.01,
                                                pytest.approx(0.701))


def test_learning_rate_grid_rejects_unset_learning_rates(tmp_path):
  run_directories.write_run(tmp_path, 'tuned_default', {
      'client_learning_rate': 0.1, 'server_learning_rate': None}, {
          'round': [1], 'validation/accuracy': [0.5]})
  with pytest.raises(ValueError, match='tuned_default'):
    analysis.learning_rate_grid(analysis.load_runs([str(tmp_path)]))


def test_mean_curves_average_runs_with_the_same_label(tmp_path):
  accuracy_run(tmp_path, 'a', 10, [0.2, 0.4], examples_per_round=10.0)
  accuracy_run(tmp_path, 'b', 10, [0.4, 0.8], examples_per_round=30.0)
  accuracy_run(tmp_path, 'c', 50, [0.9, 0.9])
  frame = analysis.load_runs([str(tmp_path)])

  curves = analysis.mean_curves(frame, 'test/accuracy',
                                x='cumulative_examples_processed')

  m10 = curves[curves['clients_per_round'] == 10]
  assert m10['test/accuracy'].tolist() == pytest.approx([0.3, 0.6])
  assert m10['test/accuracy_std'].tolist() == pytest.approx([0.1, 0.2])
  assert m10['cumulative_examples_processed'].tolist() == pytest.approx(
      [20.0, 40.0])
  assert m10['num_runs'].tolist() == [2, 2]
  assert curves[curves['clients_per_round'] == 50]['num_runs'].tolist() == [
      1, 1]


def test_best_of_breaks_ties_within_float_rounding_toward_the_smallest():
  # 0.7 and 0.7 + 1e-8 are the same examples right, rounded apart.
  means = pd.Series([0.5, 0.7 + 1e-8, 0.7], index=[3, 2, 1])
  assert analysis.best_of(means) == (1, [1, 2])
  # Apart by more than rounding: the larger wins whatever its label.
  assert analysis.best_of(pd.Series([0.5, 0.7 + 1e-4, 0.7],
                                    index=[3, 2, 1])) == (2, [2])
  # Relative to the best: the same in percent.
  assert analysis.best_of(100 * means) == (1, [1, 2])
  assert analysis.best_of(pd.Series([np.nan, 0.6], index=[1, 2])) == (2, [2])
  with pytest.raises(ValueError, match='nothing to choose from'):
    analysis.best_of(pd.Series([np.nan], index=[1]))
