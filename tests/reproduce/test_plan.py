"""`python -m reproduce ... --plan`: runs and device-hours from bench figures."""

import json

import pytest

from reproduce import __main__ as cli
from reproduce import plan
from reproduce import sweep


def _bench(tmp_path):
  path = tmp_path / 'bench.json'
  path.write_text(json.dumps({'scaling': [
      {'workload': 'emnist_cnn', 'clients': 10, 'package_ms_per_client': 50},
      {'workload': 'emnist_cnn', 'clients': 200,
       'package_ms_per_client': 36.0},
      {'workload': 'stackoverflow_lstm', 'clients': 50,
       'package_ms_per_client': 72.0}]}))
  return str(path)


def _points(tmp_path, task, clients, rounds, seeds=('0', '1')):
  flags = {'task': task}
  if clients is not None:
    flags['clients_per_round'] = str(clients)
  return sweep.build_points((sweep.Axis('seed', seeds),), str(tmp_path),
                            rounds, name_prefix=task, flags=flags)


def test_hours_are_cost_per_client_times_clients_times_rounds(tmp_path):
  points = (_points(tmp_path, 'emnist', 100, 500) +
            _points(tmp_path, 'leaf_shakespeare', None, 1000, ('0',)) +
            _points(tmp_path, 'cifar10', 10, 10))
  rows = plan.estimate(points, _bench(tmp_path))
  assert [(r.task, r.workload, r.own_model, r.runs, r.client_rounds)
          for r in rows] == [
              ('emnist', 'emnist_cnn', True, 2, 100_000),
              ('leaf_shakespeare', 'stackoverflow_lstm', False, 1, 10_000),
              ('cifar10', None, False, 2, 200)]
  # At the largest cohort measured: 36 ms, not the 50 of 10 clients.
  assert rows[0].hours == pytest.approx(36 * 100_000 / 3.6e6)  # 1.0 h
  assert rows[1].hours == pytest.approx(72 * 10_000 / 3.6e6)
  assert rows[2].hours is None
  text = '\n'.join(plan.lines('g', points, _bench(tmp_path)))
  assert 'emnist_cnn 36.0 ms at 200 clients' in text
  assert 'stackoverflow_lstm*' in text and 'not estimated: cifar10' in text
  assert '1.2 (tasks not estimated left out)' in text


def test_plan_runs_nothing_and_refuses_flags_it_ignores(tmp_path, capsys):
  assert cli.main(['large_cohort', 'fig_catastrophic', '--scale=paper',
                   '--plan', f'--root_output_dir={tmp_path}']) == 0
  out = capsys.readouterr().out
  assert out.startswith('large_cohort fig_catastrophic --scale=paper: ')
  assert 'results/bench/bench.json' in out
  assert not list(tmp_path.iterdir())
  assert cli.main(['gel', 'fig2', '--plan', '--launcher=slurm',
                   '--partition=gpu']) == 2
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line == 'error: --plan runs nothing; --partition does nothing with it'


def test_plan_without_bench_figures_is_one_error_line(tmp_path):
  points = sweep.build_points((sweep.Axis('seed', ('0',)),), str(tmp_path),
                              1, name_prefix='x', flags={'task': 'emnist'})
  with pytest.raises(ValueError, match=r'^no benchmark figures to plan with:'
                     r' .*missing.json \(No such file or directory\); `make'
                     r' bench` writes them$'):
    plan.estimate(points, str(tmp_path / 'missing.json'))
