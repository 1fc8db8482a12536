"""Tests of reproduce.plots: every figure type becomes a non-empty PNG."""

import os
import subprocess
import sys

import numpy as np
import pytest

from reproduce import analysis
from reproduce import plots
from tests import run_directories

_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_ROUNDS = 6


@pytest.fixture(name='runs_root')
def fixture_runs_root(tmp_path):
  """Cohorts 10 and 40, two seeds, two straggler λ, a 2x2 lr grid."""
  rounds = np.arange(1, _ROUNDS + 1)
  evaluated = rounds % 2 == 0
  for cohort in (10, 40):
    for lam in (1.0, 10.0):
      for seed in (0, 1):
        accuracy = 1.0 - 0.8**(rounds * cohort / 10) - 0.01 * seed
        metrics = {
            'round': rounds,
            'clients_per_round': [float(cohort)] * _ROUNDS,
            'test/accuracy': np.where(evaluated, accuracy, np.nan),
            'validation/accuracy': np.where(evaluated, accuracy, np.nan),
            'cumulative_examples_processed': 20.0 * cohort * rounds,
            'cumulative_simulated_round_time': (1 + lam) * rounds * cohort,
            'update_norm': 1.0 / np.sqrt(cohort) / rounds,
            'catastrophic_failure': [0.0] * _ROUNDS,
        }
        for q in analysis.PERCENTILES:
          metrics[analysis.percentile_column('test/accuracy', q)] = np.where(
              evaluated, accuracy * q / 100, np.nan)
        run_directories.write_run(tmp_path, f'M{cohort}_l{lam}_s{seed}', {
            'clients_per_round': cohort, 'straggler_lambda': lam,
            'seed': seed, 'client_learning_rate': 0.1 * (1 + seed),
            'server_learning_rate': 1.0 if lam == 1.0 else 0.1}, metrics)
  return str(tmp_path)


def _assert_png(path):
  assert os.path.getsize(path) > 1000
  with open(path, 'rb') as f:
    assert f.read(8) == _PNG_SIGNATURE


@pytest.mark.parametrize('plot', [
    lambda f, p: plots.plot_accuracy_vs_rounds(f, p),
    lambda f, p: plots.plot_accuracy_vs_examples(f, p),
    lambda f, p: plots.plot_update_norm_vs_rounds(f, p),
    lambda f, p: plots.plot_update_norm_vs_rounds(f, p,
                                                  reference_cohort_size=10),
    lambda f, p: plots.plot_accuracy_vs_cohort_size(f, p, how='best'),
    lambda f, p: plots.plot_accuracy_vs_cohort_size(
        f, p, by=('clients_per_round', 'straggler_lambda')),
    lambda f, p: plots.plot_rounds_to_accuracy(f, p, [0.3, 0.6]),
    lambda f, p: plots.plot_relative_time_to_accuracy(f, p, [0.3, 0.6]),
    lambda f, p: plots.plot_accuracy_percentiles(f, p),
    lambda f, p: plots.plot_learning_rate_grid(f, p),
    lambda f, p: plots.plot_learning_rate_grid(
        f, p, rows='seed', columns='clients_per_round',
        accuracy_column='test/accuracy', how='best'),
])
def test_each_plot_writes_a_png(runs_root, tmp_path, plot):
  frame = analysis.load_runs([runs_root])
  path = str(tmp_path / 'figures' / 'figure.png')
  assert plot(frame, path) == path
  _assert_png(path)


def test_panels_split_the_curves_one_axis_per_value(runs_root, tmp_path,
                                                   monkeypatch):
  frame = analysis.load_runs([runs_root])
  figures = []
  save = plots._save
  monkeypatch.setattr(plots, '_save',
                      lambda fig, path: figures.append(fig) or save(fig, path))
  plots.plot_accuracy_vs_rounds(frame, str(tmp_path / 'f.png'),
                                by=['seed'], panels=['straggler_lambda'])
  axes = figures[0].axes
  assert len(axes) == 2
  # Each panel holds its own λ's lines: one per seed.
  assert [len(ax.get_lines()) for ax in axes] == [2, 2]
  assert [ax.get_title().split('=')[-1] for ax in axes] == ['1', '10']


def test_plots_reject_runs_without_the_data(runs_root, tmp_path):
  frame = analysis.load_runs([runs_root])
  path = str(tmp_path / 'figure.png')
  with pytest.raises(ValueError, match="'train/loss'"):
    plots.plot_accuracy_vs_rounds(frame, path, accuracy_column='train/loss')
  with pytest.raises(ValueError, match='no run reaches'):
    plots.plot_rounds_to_accuracy(frame, path, [1.5])
  with pytest.raises(ValueError, match='other than the reference'):
    plots.plot_relative_time_to_accuracy(
        frame[frame['clients_per_round'] == 10], path, [0.3])
  assert not os.path.exists(path)


def test_make_figures_writes_every_figure_or_says_why_not(runs_root,
                                                          tmp_path):
  frame = analysis.load_runs([runs_root])
  written, skipped = plots.make_figures(frame, str(tmp_path),
                                        norm_reference_cohort_size=40)
  assert sorted(written) == sorted(plots.FIGURES)
  assert not skipped
  for name, path in written.items():
    assert path == str(tmp_path / f'{name}.png')
    _assert_png(path)

  without_norms = frame.drop(columns='update_norm')
  written, skipped = plots.make_figures(
      without_norms, str(tmp_path / 'partial'),
      figures=['accuracy_vs_rounds', 'update_norm_vs_rounds'])
  assert list(written) == ['accuracy_vs_rounds']
  assert "'update_norm'" in skipped['update_norm_vs_rounds']
  with pytest.raises(ValueError, match='bogus'):
    plots.make_figures(frame, str(tmp_path), figures=['bogus'])


def test_default_thresholds_follow_the_best_accuracy(runs_root):
  frame = analysis.load_runs([runs_root])
  best = frame['test/accuracy'].max()
  assert plots.default_thresholds(frame, 'test/accuracy') == pytest.approx(
      [best * f for f in (0.5, 0.6, 0.7, 0.8, 0.9)], abs=1e-4)
  with pytest.raises(ValueError, match='--thresholds'):
    plots.default_thresholds(frame, 'train/accuracy')


def test_command_line(runs_root, tmp_path, capsys):
  output_dir = tmp_path / 'out'
  code = plots.main([f'--run_dirs={runs_root}', f'--output_dir={output_dir}',
                     '--figures=accuracy_vs_rounds,rounds_to_accuracy',
                     '--thresholds=0.3,0.6', '--by=clients_per_round'])
  assert code == 0
  assert sorted(os.listdir(output_dir)) == ['accuracy_vs_rounds.png',
                                            'rounds_to_accuracy.png']
  assert 'wrote' in capsys.readouterr().out

  code = plots.main([f'--run_dirs={tmp_path / "missing"}',
                     f'--output_dir={output_dir}'])
  assert code == 2
  assert 'missing' in capsys.readouterr().err


@pytest.mark.parametrize('module', ['reproduce.plots', 'reproduce.sweep'])
def test_the_experiment_tools_start_without_noise(module):
  # `reproduce` imports its experiments lazily: imported eagerly, they
  # imported these modules before `python -m` ran them (a RuntimeWarning).
  result = subprocess.run([sys.executable, '-m', module, '--help'],
                          capture_output=True, text=True, timeout=120,
                          cwd=run_directories.REPO)
  assert result.returncode == 0
  assert result.stdout.startswith(f'usage: python -m {module}')
  assert result.stderr == ''
