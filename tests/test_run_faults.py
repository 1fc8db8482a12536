"""Run directories that survive faults, as a hostile but fair user meets them.

Two runs into one directory, a corrupt latest checkpoint (stateless and
stateful), an output path that cannot be written, Ctrl-C and SIGTERM, the
leftovers of `kill -9`, TensorBoard after a resume, file modes. Each test
runs `run_experiment.py` as a subprocess.
"""

import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from tests import run_directories

_REPO = run_directories.REPO
_SMALL = ['--task=synthetic', '--clients_per_round=3', '--total_rounds=4',
          '--rounds_per_eval=2', '--rounds_per_checkpoint=2',
          '--max_eval_clients=20', '--seed=3']
_STATEFUL = ['--task=synthetic_partitioned', '--algorithm=adabest',
             '--num_clients=20', '--clients_per_round=3', '--total_rounds=4',
             '--rounds_per_eval=2', '--rounds_per_checkpoint=2', '--seed=3']


_command = run_directories.driver_command
_run = run_directories.run_driver
_metrics = run_directories.read_metrics


def _stderr_lines(result):
  return [line for line in result.stderr.strip().splitlines() if line]


@pytest.fixture(scope='module')
def reference_runs(tmp_path_factory):
  """Uninterrupted runs to compare with: `{name: run_dir}`."""
  root = tmp_path_factory.mktemp('reference')
  runs = {}
  for name, args in (('fedopt', _SMALL), ('adabest', _STATEFUL)):
    _run(*args, f'--root_output_dir={root}', f'--experiment_name={name}')
    runs[name] = str(root / name)
  return runs


def test_a_second_run_into_a_locked_directory_stops_and_touches_nothing(
    tmp_path):
  # Long enough that the second run starts while the first trains.
  args = ['--task=synthetic', '--clients_per_round=10', '--total_rounds=600',
          '--rounds_per_eval=600', '--rounds_per_checkpoint=50',
          '--max_eval_clients=20', f'--root_output_dir={tmp_path}',
          '--experiment_name=s']
  first = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=_REPO)
  try:
    for line in first.stdout:
      if line.startswith('round 2/'):
        break
    second = _run(*args, check=False)
    assert second.returncode == 75  # outputs.EXIT_LOCKED: a launcher's cue
    (line,) = _stderr_lines(second)
    assert line.startswith('error: ') and f'pid {first.pid}' in line
    # The first trains on: three more rounds, then it is stopped as a user
    # would stop it (not its 600 rounds: they would only cost time).
    for line in first.stdout:
      if line.startswith('round '):
        last = int(line.split()[1].split('/')[0])
        break
    for line in first.stdout:
      if line.startswith(f'round {last + 3}/'):
        first.send_signal(signal.SIGTERM)
        break
    _, stderr = first.communicate(timeout=120)
  finally:
    first.kill()
    first.wait()
  assert first.returncode == 143, stderr[-2000:]
  rounds = list(_metrics(tmp_path / 's')['round'])
  assert rounds == list(range(1, len(rounds) + 1))
  assert len(rounds) >= last + 2  # rounds after the second run stopped


@pytest.mark.parametrize('name', ['fedopt', 'adabest'])
def test_a_corrupt_latest_checkpoint_says_how_to_resume_and_that_works(
    reference_runs, tmp_path, name):
  copy = tmp_path / name
  shutil.copytree(reference_runs[name], copy)
  latest = copy / 'checkpoints' / 'program_state_4'
  for path in latest.rglob('*'):
    if path.is_file():
      path.write_bytes(b'not a checkpoint')
  args = [*(_SMALL if name == 'fedopt' else _STATEFUL),
          f'--root_output_dir={tmp_path}', f'--experiment_name={name}']
  result = _run(*args, check=False)
  assert result.returncode == 2
  (line,) = _stderr_lines(result)
  assert f'rm -r {latest}' in line and 'resume from round 2' in line
  shutil.rmtree(latest)
  result = _run(*args)
  assert 'resuming from the checkpoint of round 2' in result.stdout
  pd.testing.assert_frame_equal(_metrics(copy),
                                _metrics(reference_runs[name]))


def test_an_output_path_that_is_a_file_is_one_error_line(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  started = time.monotonic()
  result = _run(*_SMALL, f'--root_output_dir={blocker}', check=False)
  assert result.returncode == 2
  (line,) = _stderr_lines(result)
  assert line.startswith('error: cannot write the run directory')
  assert time.monotonic() - started < 60  # before the runtime starts


@pytest.mark.parametrize('blocked', ['checkpoints', 'metrics.csv'])
def test_a_path_of_the_wrong_kind_is_one_error_line(tmp_path, blocked):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  if blocked == 'checkpoints':
    (run_dir / blocked).write_text('a file where a directory should be')
  else:
    (run_dir / blocked).mkdir()
  result = _run(*_SMALL, f'--root_output_dir={tmp_path}',
                '--experiment_name=run', check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  (line,) = _stderr_lines(result)
  assert line.startswith('error: cannot write the run')
  assert not glob.glob(str(run_dir / '*_temp*'))
  assert not glob.glob(str(run_dir / '.tmp-*'))


def test_a_full_disk_is_one_error_line_and_freeing_space_resumes_exactly(
    reference_runs, tmp_path):
  disk = tmp_path / 'disk'
  disk.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m', 'tmpfs',
                     str(disk)], capture_output=True).returncode != 0:
    pytest.skip('cannot mount a tmpfs here (needs root outside a sandbox)')
  process = None
  try:
    args = [*_SMALL, f'--root_output_dir={disk}', '--experiment_name=full']
    process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=_REPO)
    filler = disk / 'filler'
    for line in process.stdout:
      if line.startswith('round 2/4'):  # the checkpoint of round 2 is next
        process.send_signal(signal.SIGSTOP)
        _fill(filler)
        process.send_signal(signal.SIGCONT)
        break
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr[-3000:]
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        'error: cannot write the run'), stderr[-3000:]
    run_dir = disk / 'full'
    assert not glob.glob(str(run_dir / '**' / '*_temp*'), recursive=True)
    assert list(_metrics(run_dir)['round'])[:2] == [1, 2]  # intact
    filler.unlink()
    _run(*args)
    pd.testing.assert_frame_equal(_metrics(run_dir),
                                  _metrics(reference_runs['fedopt']))
  finally:
    if process is not None and process.poll() is None:
      process.send_signal(signal.SIGCONT)  # never leave it stopped
      process.kill()
      process.wait()
    subprocess.run(['umount', '-l', str(disk)], check=False)


def _fill(path) -> None:
  """Fills the file system of `path` with a file of zeros. Unbuffered: a
  buffered file's close would retry the write that found the disk full
  (and raise ENOSPC) where the loop no longer catches it."""
  try:
    with open(path, 'wb', buffering=0) as f:
      while True:
        f.write(b'\0' * (1 << 16))
  except OSError:
    pass  # full (or full already at open)


@pytest.mark.parametrize('sig, code, word', [
    (signal.SIGINT, 130, 'interrupted'), (signal.SIGTERM, 143, 'terminated'),
    (signal.SIGHUP, 129, 'hung up (SIGHUP)')])
def test_interrupt_is_one_line_and_the_rerun_resumes(reference_runs, tmp_path,
                                                    sig, code, word):
  args = [*_SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=i']
  process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=_REPO)
  for line in process.stdout:
    if line.startswith('round 3/4'):
      process.send_signal(sig)
      break
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == code, stderr[-2000:]
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith(f'{word} at round')
  assert 'rerun the same command to resume' in lines[0]
  # What the signal left: the rounds before it, each as the uninterrupted
  # run wrote it. The three signals share one handler, so one of them
  # (Ctrl-C's) is resumed to the end as well.
  left = _metrics(tmp_path / 'i')
  reference = _metrics(reference_runs['fedopt'])
  assert 2 <= len(left) < len(reference)
  pd.testing.assert_frame_equal(left, reference.iloc[:len(left)])
  if sig == signal.SIGINT:
    _run(*args)
    pd.testing.assert_frame_equal(_metrics(tmp_path / 'i'), reference)


def _tensorboard_steps(run_dir, tag):
  steps = []
  for path in glob.glob(os.path.join(run_dir, 'tensorboard', '**', '*tfevents*'),
                        recursive=True):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag == tag:
          steps.append(event.step)
  return sorted(steps)


def test_after_kill_9_temp_files_go_and_tensorboard_holds_each_round_once(
    reference_runs, tmp_path):
  args = [*_SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=k']
  process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=_REPO)
  for line in process.stdout:
    if line.startswith('round 3/4'):  # round 3 is in TensorBoard, not saved
      process.send_signal(signal.SIGKILL)
      break
  process.wait()
  run_dir = tmp_path / 'k'
  # What a kill during writes leaves behind.
  (run_dir / 'checkpoints' / 'program_state_4_temp1234').mkdir()
  (run_dir / 'metrics.csv_temp5678').write_text('half a row')
  (run_dir / '.tmp-abcd').write_text('{')
  _run(*args)
  assert not glob.glob(str(run_dir / '**' / '*_temp*'), recursive=True)
  assert not glob.glob(str(run_dir / '.tmp-*'))
  assert _tensorboard_steps(run_dir, 'train/loss') == [1, 2, 3, 4]
  pd.testing.assert_frame_equal(_metrics(run_dir),
                                _metrics(reference_runs['fedopt']))


def test_outputs_have_one_file_mode(reference_runs):
  run_dir = reference_runs['fedopt']
  modes = {name: stat.S_IMODE(os.stat(os.path.join(run_dir, name)).st_mode)
           for name in ('hparams.json', 'metrics.csv')}
  assert modes['hparams.json'] == modes['metrics.csv'], modes


def test_stateful_runs_log_the_cohorts_mean_client_state_norm(reference_runs):
  norms = _metrics(reference_runs['adabest'])['client_states/mean_norm']
  assert len(norms) == 4 and np.isfinite(norms).all() and (norms > 0).all()


def _damage(run_dir, damage):
  if damage == 'flipped_client_state':  # same size: only a checksum sees it
    path = sorted((run_dir / 'client_states').glob('*@00000004.state'))[0]
    raw = bytearray(path.read_bytes())
    raw[100:104] = b'\x00\x00\x80\x3f'
    path.write_bytes(bytes(raw))
  elif damage == 'deleted_client_states':
    shutil.rmtree(run_dir / 'client_states')
  elif damage == 'torn_last_row':  # of a finished run: round 4 is the last
    text = (run_dir / 'metrics.csv').read_text()
    (run_dir / 'metrics.csv').write_text(text[:-20])
  elif damage == 'emptied_metrics':
    shutil.rmtree(run_dir / 'checkpoints' / 'program_state_4')
    (run_dir / 'metrics.csv').write_text('')


@pytest.mark.parametrize('name,damage', [
    ('adabest', 'flipped_client_state'), ('adabest', 'deleted_client_states'),
    ('fedopt', 'torn_last_row'), ('fedopt', 'emptied_metrics')])
def test_a_damaged_run_file_stops_the_resume_and_its_command_recovers_exactly(
    reference_runs, tmp_path, name, damage):
  run_dir = tmp_path / name
  shutil.copytree(reference_runs[name], run_dir)
  _damage(run_dir, damage)
  before = {p: p.read_bytes() for p in run_dir.rglob('*') if p.is_file()
            and p.name != 'run.lock'}
  args = [*(_SMALL if name == 'fedopt' else _STATEFUL),
          f'--root_output_dir={tmp_path}', f'--experiment_name={name}']
  result = _run(*args, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  (line,) = _stderr_lines(result)
  assert line.startswith('error: ') and str(run_dir) in line
  # Nothing was written: the CSV and TensorBoard keep every row they had.
  assert {p: p.read_bytes() for p in before if p.exists()} == before
  command = line.split('run: rm -r ')[1].split('; then')[0]
  for path in command.split():
    shutil.rmtree(path)
  result = _run(*args)
  pd.testing.assert_frame_equal(_metrics(run_dir),
                                _metrics(reference_runs[name]))
  assert _tensorboard_steps(run_dir, 'train/loss') == [1, 2, 3, 4]


def test_deleted_hparams_still_refuse_other_flags(reference_runs, tmp_path):
  run_dir = tmp_path / 'fedopt'
  shutil.copytree(reference_runs['fedopt'], run_dir)
  os.remove(run_dir / 'hparams.json')
  args = [*_SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=fedopt']
  result = _run(*[a for a in args if a != '--seed=3'], '--seed=7',
                check=False)
  assert result.returncode == 2
  (line,) = _stderr_lines(result)
  assert 'seed: 3 -> 7' in line
  result = _run(*args, '--total_rounds=4')
  assert 'is complete' in result.stdout


@pytest.mark.parametrize('sig, code', [(signal.SIGINT, 130),
                                       (signal.SIGTERM, 143)])
def test_a_signal_during_the_imports_is_one_line(tmp_path, sig, code):
  process = subprocess.Popen(
      _command(*_SMALL, f'--root_output_dir={tmp_path}'),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=_REPO)
  time.sleep(1.5)  # TensorFlow is being imported
  process.send_signal(sig)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == code
  assert _stderr_lines(subprocess.CompletedProcess([], code, '', stderr)) == [
      f'{"interrupted" if sig == signal.SIGINT else "terminated"} while'
      ' starting, before the run; nothing was written']
  assert not os.listdir(tmp_path)


def test_tensorflow_temp_files_of_a_killed_run_go_with_the_next_run(tmp_path):
  temp = tmp_path / 'tmp'
  temp.mkdir()
  env = {**os.environ, 'TMPDIR': str(temp)}
  args = ['--task=synthetic', '--clients_per_round=3', '--total_rounds=3000',
          '--rounds_per_eval=3000', '--max_eval_clients=20',
          f'--root_output_dir={tmp_path}', '--experiment_name=t']
  process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=_REPO,
                             env=env)
  for line in process.stdout:
    if line.startswith('round 2/'):
      process.send_signal(signal.SIGKILL)
      break
  process.wait()
  (owned,) = os.listdir(temp)  # autograph's sources, all in one directory
  assert owned.startswith('fl_papers_tmp_')
  assert glob.glob(str(temp / owned / '__autograph_generated_file*'))
  _run(*args[:-1], '--total_rounds=3', '--experiment_name=t2', env=env)
  assert not os.listdir(temp)


def _as_an_earlier_version_wrote_it(run_dir):
  """Strips what earlier versions did not record: the run's identity and
  numerics, each checkpoint's client-state summary, the store's owner and
  checksums; and stores one state as `.npz`, as the first versions did."""
  manifest = json.loads((run_dir / 'manifest.json').read_text())
  manifest.pop('run_id')
  manifest.pop('numerics')
  for record in manifest['checkpoints'].values():
    record.pop('client_states', None)
  (run_dir / 'manifest.json').write_text(json.dumps(manifest))
  states = run_dir / 'client_states'
  store = json.loads((states / 'MANIFEST.json').read_text())
  store.pop('owner')
  store.pop('files')
  (states / 'MANIFEST.json').write_text(json.dumps(store))
  first = sorted(states.glob('client-*.state'))[0]
  # The leaves' bytes as one leaf: converted, the same bytes again.
  np.savez(str(first)[:-len('.state')] + '.npz',
           leaf_0=np.frombuffer(first.read_bytes(), np.uint8))
  first.unlink()


def test_a_run_of_an_earlier_version_is_refused_until_converted_once(
    reference_runs, tmp_path):
  args = [*_STATEFUL, f'--root_output_dir={tmp_path}',
          '--experiment_name=old']
  _run(*[a for a in args if not a.startswith('--total_rounds')],
       '--total_rounds=2')
  run_dir = tmp_path / 'old'
  _as_an_earlier_version_wrote_it(run_dir)
  result = _run(*args, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  (line,) = _stderr_lines(result)
  assert 'earlier version' in line
  assert f'python -m experiment_driver.upgrade_run {run_dir}' in line
  converted = subprocess.run(
      [sys.executable, '-m', 'experiment_driver.upgrade_run', str(run_dir)],
      capture_output=True, text=True, cwd=_REPO, timeout=300)
  assert converted.returncode == 0, converted.stderr[-2000:]
  assert 'converted client-' in converted.stdout
  assert 'gave the run its identity' in converted.stdout
  assert 'bound checkpoint 2 to its' in converted.stdout
  again = subprocess.run(
      [sys.executable, '-m', 'experiment_driver.upgrade_run', str(run_dir)],
      capture_output=True, text=True, cwd=_REPO, timeout=300)
  assert again.stdout.strip() == f'{run_dir}: nothing to convert'
  _run(*args)
  pd.testing.assert_frame_equal(_metrics(run_dir),
                                _metrics(reference_runs['adabest']))
