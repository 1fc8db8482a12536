"""Tests of reproduce.sweep, with a fake driver for run_experiment.py."""

import json
import os
import shlex
import sys
import textwrap

import pandas as pd
import pytest

from experiment_driver import prestart
from reproduce import sweep

# Records each call, fails for --clients_per_round=13, else writes rounds
# 1..total_rounds to metrics.csv as a finished driver run would.
_FAKE_DRIVER = textwrap.dedent('''\
    import os, sys
    calls_path = sys.argv[1]
    flags = dict(a[2:].split('=', 1) for a in sys.argv[2:] if '=' in a)
    with open(calls_path, 'a') as f:
      f.write(' '.join(sys.argv[2:]) + '\\n')
    if flags.get('clients_per_round') == '13':
      print('Traceback (most recent call last):', file=sys.stderr)
      print('error: cohort 13 is unlucky', file=sys.stderr)
      sys.exit(2)
    run_dir = os.path.join(flags['root_output_dir'], flags['experiment_name'])
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
      f.write('round,train/loss\\n')
      for r in range(1, int(flags['total_rounds']) + 1):
        f.write(f'{r},0.5\\n')
    print('done')
''')


@pytest.fixture(name='fake_driver')
def fixture_fake_driver(tmp_path):
  """`(command, calls)`: the fake command and a reader of its calls."""
  script = tmp_path / 'fake_driver.py'
  script.write_text(_FAKE_DRIVER)
  calls_path = tmp_path / 'calls.txt'

  def calls():
    if not calls_path.exists():
      return []
    return [line.split() for line in calls_path.read_text().splitlines()]

  return (sys.executable, str(script), str(calls_path)), calls


def _experiment_name(call):
  return next(a.split('=', 1)[1] for a in call
              if a.startswith('--experiment_name='))


def _write_metrics(run_dir, rounds):
  os.makedirs(run_dir, exist_ok=True)
  pd.DataFrame({'round': rounds}).to_csv(os.path.join(run_dir, 'metrics.csv'),
                                         index=False)


def test_build_points_commands_and_names():
  points = sweep.build_points(
      axes=[sweep.Axis('clients_per_round', ('10', '50')),
            sweep.Axis('server_learning_rate', ('0.1', '1'))],
      root_output_dir='/out', total_rounds=7, name_prefix='emnist',
      flags={'task': 'emnist', 'noclipping': None}, command=('drv', '-x'))

  assert [p.experiment_name for p in points] == [
      'emnist__clients_per_round=10__server_learning_rate=0.1',
      'emnist__clients_per_round=10__server_learning_rate=1',
      'emnist__clients_per_round=50__server_learning_rate=0.1',
      'emnist__clients_per_round=50__server_learning_rate=1',
  ]
  assert points[1].command == (
      'drv', '-x', '--task=emnist', '--noclipping', '--clients_per_round=10',
      '--server_learning_rate=1', '--root_output_dir=/out',
      '--experiment_name=emnist__clients_per_round=10__server_learning_rate=1',
      '--total_rounds=7')
  assert points[2].values == {'clients_per_round': '50',
                              'server_learning_rate': '0.1'}
  assert points[2].run_dir == os.path.join('/out', points[2].experiment_name)
  assert all(p.total_rounds == 7 for p in points)


def test_presets_are_the_paper_grids():
  learning_rate = sweep.PRESETS['learning_rate']
  for axis in learning_rate.axes:
    assert [float(v) for v in axis.values] == pytest.approx(
        [10.0**i for i in range(-3, 2)])
  assert [a.flag for a in learning_rate.axes] == ['client_learning_rate',
                                                  'server_learning_rate']
  local_steps = {a.flag: a.values for a in sweep.PRESETS['local_steps'].axes}
  assert [int(v) for v in local_steps['max_elements_per_client']] == [
      2**i for i in range(9)]  # 1..256
  assert [int(v) for v in local_steps['clients_per_round']] == [
      2**i for i in range(4, 11)]  # 16..1024
  assert sweep.PRESETS['local_steps'].flags['train_batch_size'] == '1'
  straggler = {a.flag: a.values for a in sweep.PRESETS['straggler'].axes}
  assert [float(v) for v in straggler['straggler_lambda']] == [
      0.1, 1.0, 10.0, 100.0]
  assert '10' in straggler['clients_per_round']  # the reference cohort
  points = sweep.build_points(sweep.PRESETS['local_steps'].axes, '/o', 1,
                              flags=sweep.PRESETS['local_steps'].flags)
  assert len(points) == 7 * 9


@pytest.mark.parametrize('kwargs, message', [
    ({'axes': []}, 'at least one axis'),
    ({'axes': [sweep.Axis('seed', ('0',))] * 2}, 'repeat'),
    ({'flags': {'clients_per_round': '5'}}, 'both an axis and fixed'),
    ({'flags': {'experiment_name': 'x'}}, 'experiment_name'),
    ({'axes': [sweep.Axis('total_rounds', ('5',))]}, 'total_rounds'),
    ({'total_rounds': 0}, 'total_rounds must be >= 1, got 0'),
    ({'name_prefix': 'a b'}, "'a b'"),
    ({'axes': [sweep.Axis('data_dir', ('a/b', 'a_b'))]}, 'same experiment'),
])
def test_build_points_rejects_bad_grids(kwargs, message):
  arguments = {'axes': [sweep.Axis('clients_per_round', ('10',))],
               'root_output_dir': '/out', 'total_rounds': 3, **kwargs}
  with pytest.raises(ValueError, match=message):
    sweep.build_points(**arguments)


def test_parsing_axes_and_driver_flags():
  assert sweep.parse_axis('seed:0, 1,2') == sweep.Axis('seed', ('0', '1', '2'))
  with pytest.raises(ValueError, match="'seed'"):
    sweep.parse_axis('seed')
  with pytest.raises(ValueError, match='no values'):
    sweep.parse_axis('seed:')
  with pytest.raises(ValueError, match='repeats'):
    sweep.parse_axis('seed:1,1')
  assert sweep.parse_driver_flags(['--task=a=b', '--noclipping']) == {
      'task': 'a=b', 'noclipping': None}
  with pytest.raises(ValueError, match="'emnist'"):
    sweep.parse_driver_flags(['--task', 'emnist'])


def test_run_sweep_skips_finished_resumes_unfinished_reports_failures(
    tmp_path, fake_driver):
  command, calls = fake_driver
  root = str(tmp_path / 'runs')
  points = sweep.build_points(
      [sweep.Axis('clients_per_round', ('10', '13', '20', '30'))], root,
      total_rounds=3, name_prefix='p', command=command)
  finished, failing, unfinished, new = points
  _write_metrics(finished.run_dir, [1, 2, 3])
  _write_metrics(unfinished.run_dir, [1])
  lines = []

  results = sweep.run_sweep(points, print_fn=lines.append)

  assert [r.status for r in results] == ['skipped', 'failed', 'succeeded',
                                         'succeeded']
  assert sorted(_experiment_name(c) for c in calls()) == sorted(
      [failing.experiment_name, unfinished.experiment_name,
       new.experiment_name])
  assert results[1].exit_code == 2
  assert results[1].last_error_line == 'error: cohort 13 is unlucky'
  assert all(sweep.is_finished(p) for p in (finished, unfinished, new))
  assert any('FAILED (exit 2): error: cohort 13 is unlucky' in line
             for line in lines)
  assert any('resuming' in line and unfinished.experiment_name in line
             for line in lines)
  log = os.path.join(root, 'sweep_logs', f'{new.experiment_name}.stdout')
  assert open(log).read() == 'done\n'
  summary = sweep.summary_lines(results)
  assert summary[0] == 'sweep: 4 points, 1 skipped, 2 succeeded, 1 failed'
  assert summary[1].startswith(f'failed: {failing.experiment_name} (exit 2)')

  # Rerunning runs only the failed point again.
  again = sweep.run_sweep(points, parallel=2, print_fn=lines.append)
  assert [r.status for r in again] == ['skipped', 'failed', 'skipped',
                                       'skipped']
  assert len(calls()) == 4


def test_run_sweep_in_parallel_keeps_grid_order(tmp_path, fake_driver):
  command, calls = fake_driver
  points = sweep.build_points(
      [sweep.Axis('seed', ('0', '1', '2')),
       sweep.Axis('clients_per_round', ('5', '13'))],
      str(tmp_path / 'runs'), total_rounds=2, command=command)
  results = sweep.run_sweep(points, parallel=3, print_fn=lambda _: None)
  assert [r.point for r in results] == points
  assert [r.status for r in results] == ['succeeded', 'failed'] * 3
  assert len(calls()) == 6
  with pytest.raises(ValueError, match='parallel must be >= 1, got 0'):
    sweep.run_sweep(points, parallel=0)


def test_sweeps_given_a_prestarter_run_through_it_and_leave_it_open(
    tmp_path, fake_driver):
  command, calls = fake_driver

  class Recording(prestart.Prestarter):
    def __init__(self):
      super().__init__()
      self.commands, self.closed = [], False

    def run(self, command, *args, **kwargs):
      self.commands.append(command)
      return super().run(command, *args, **kwargs)

    def close(self):
      self.closed = True
      super().close()

  shared = Recording()
  for seed in ('0', '1'):  # two sweeps, as `reproduce all` runs experiments
    points = sweep.build_points(
        [sweep.Axis('seed', (seed,)), sweep.Axis('clients_per_round', ('5',))],
        str(tmp_path / 'runs'), total_rounds=2, command=command)
    (result,) = sweep.run_sweep(points, print_fn=lambda _: None,
                                prestarter=shared)
    assert result.status == 'succeeded'
  assert len(shared.commands) == len(calls()) == 2 and not shared.closed
  shared.close()


def test_a_command_that_cannot_start_is_a_failed_point(tmp_path):
  points = sweep.build_points([sweep.Axis('seed', ('0',))], str(tmp_path), 1,
                              command=(str(tmp_path / 'no_such_program'),))
  result, = sweep.run_sweep(points, print_fn=lambda _: None)
  assert result.status == 'failed'
  assert 'no_such_program' in result.last_error_line


def test_is_finished_needs_the_last_round(tmp_path):
  point, = sweep.build_points([sweep.Axis('seed', ('0',))], str(tmp_path), 5)
  assert not sweep.is_finished(point)
  _write_metrics(point.run_dir, [])
  assert not sweep.is_finished(point)
  _write_metrics(point.run_dir, [1, 2, 4])
  assert not sweep.is_finished(point)
  _write_metrics(point.run_dir, [1, 2, 5])
  assert sweep.is_finished(point)


def test_a_finished_run_of_other_flags_is_not_the_points(tmp_path):
  """A grid whose fixed flags changed (a tuned rate) keeps its run names:
  the old run must not stand for the new point."""
  point, = sweep.build_points(
      [sweep.Axis('clients_per_round', ('10',))], str(tmp_path), 2,
      flags={'server_learning_rate': '0.01', 'clipping': 'true',
             'task': 'synthetic', 'rounds_per_eval': '5'})
  _write_metrics(point.run_dir, [1, 2])
  assert sweep.is_finished(point)  # no hparams.json: nothing to contradict

  def record(**hparams):
    with open(os.path.join(point.run_dir, 'hparams.json'), 'w') as f:
      json.dump(hparams, f)

  # As the driver records them: typed, flags not in use left out.
  record(server_learning_rate=0.010000000000000002, clipping=True,
         task='synthetic', clients_per_round=10, seed=0)
  assert sweep.conflicting_flags(point) == []
  assert sweep.is_finished(point)
  record(server_learning_rate=0.001, clipping=False, task='synthetic',
         clients_per_round=10)
  assert sweep.conflicting_flags(point) == ['server_learning_rate',
                                            'clipping']
  assert not sweep.is_finished(point)
  record(server_learning_rate=0.01, clipping=True, task='emnist',
         clients_per_round=[10, 20])
  assert sweep.conflicting_flags(point) == ['task', 'clients_per_round']


def test_command_line(tmp_path, fake_driver, capsys):
  command, calls = fake_driver
  base = ['--total_rounds=2', f'--root_output_dir={tmp_path / "runs"}',
          f'--command={shlex.join(command)}']

  assert sweep.main([*base, '--axis=clients_per_round:4,5', '--dry_run',
                     '--', '--task=emnist']) == 0
  out = capsys.readouterr().out
  assert out.count('to run') == 2 and '--task=emnist' in out
  assert not calls()

  assert sweep.main([*base, '--preset=learning_rate', '--name_prefix=lr',
                     '--axis=seed:0', '--', '--clients_per_round=13']) == 1
  out = capsys.readouterr().out
  assert 'sweep: 25 points, 0 skipped, 0 succeeded, 25 failed' in out
  assert len(calls()) == 25
  assert all('--clients_per_round=13' in c for c in calls())
  assert _experiment_name(calls()[0]) == (
      'lr__client_learning_rate=0.001__server_learning_rate=0.001__seed=0')

  assert sweep.main([*base, '--preset=cohort', '--parallel=2',
                     '--', '--task=emnist']) == 0
  assert 'sweep: 7 points, 0 skipped, 7 succeeded, 0 failed' in (
      capsys.readouterr().out)
  assert sweep.main([*base, '--preset=cohort']) == 0  # all finished now
  assert 'sweep: 7 points, 7 skipped' in capsys.readouterr().out

  assert sweep.main([*base, '--preset=cohort', '--',
                     '--clients_per_round=3']) == 2
  assert 'both an axis and fixed' in capsys.readouterr().err
  with pytest.raises(SystemExit):
    sweep.main(['--preset=cohort'])  # --total_rounds is required


def test_run_sweep_reports_each_run_as_it_ends_with_its_wall_time(
    tmp_path, fake_driver):
  command, _ = fake_driver
  points = sweep.build_points(
      [sweep.Axis('seed', ('0', '1')), sweep.Axis('clients_per_round', ('5',))],
      str(tmp_path / 'runs'), total_rounds=2, command=command)
  seen = []
  results = sweep.run_sweep(points, parallel=2, print_fn=lambda _: None,
                            on_result=seen.append)
  assert sorted(r.point.experiment_name for r in seen) == sorted(
      p.experiment_name for p in points)
  assert all(r.elapsed_sec is not None and r.elapsed_sec >= 0 for r in seen)
  # Finished points are skipped on a rerun: no run, nothing reported.
  seen.clear()
  sweep.run_sweep(points, print_fn=lambda _: None, on_result=seen.append)
  assert seen == []
  assert [r.status for r in results] == ['succeeded', 'succeeded']
