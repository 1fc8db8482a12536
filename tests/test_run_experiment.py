"""`run_experiment.py` as a user runs it: outputs, resume, bad input, cleanup."""

import os
import shutil
import signal
import subprocess
import time
import uuid

import numpy as np
import pandas as pd
import pytest

from tests import run_directories

_REPO = run_directories.REPO
_SMALL_RUN = ['--task=synthetic', '--clients_per_round=3', '--total_rounds=4',
              '--rounds_per_eval=2', '--rounds_per_checkpoint=2',
              '--max_eval_clients=20', '--seed=3']
_MARKER = f'FL_PAPERS_TEST_RUN={uuid.uuid4().hex}'
_ENV = {**os.environ, _MARKER.split('=')[0]: _MARKER.split('=')[1]}


_command = run_directories.driver_command
_metrics = run_directories.read_metrics


def _run(*args, check=True):
  return run_directories.run_driver(*args, check=check, env=_ENV)


def _workers_of_this_test_session():
  """Live worker_binary processes started by drivers this module ran.

  Every driver subprocess gets `_MARKER` in its environment, which its worker
  inherits; other workers on the machine are not ours to judge.
  """
  ours = []
  for pid in subprocess.run(['pgrep', '-f', 'worker_binary'],
                            capture_output=True, text=True).stdout.split():
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        if _MARKER.encode() in f.read():
          ours.append(pid)
    except (FileNotFoundError, PermissionError, ProcessLookupError):
      continue
  return ours


def _assert_no_surviving_workers():
  """A dying worker may take a moment to go."""
  for _ in range(50):
    if not _workers_of_this_test_session():
      return
    time.sleep(0.1)
  raise AssertionError(
      f'workers outlived their driver: {_workers_of_this_test_session()}')


def _error_line(result):
  lines = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1, result.stderr[-2000:]
  return lines[0]


@pytest.fixture(scope='module')
def full_run(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('runs'))
  result = _run(*_SMALL_RUN, f'--root_output_dir={root}',
                '--experiment_name=full')
  return os.path.join(root, 'full'), result


def test_run_writes_outputs_and_progress(full_run):
  run_dir, result = full_run
  metrics = _metrics(run_dir)
  assert list(metrics['round']) == [1, 2, 3, 4]
  for column in ('train/loss', 'train/accuracy', 'examples_processed',
                 'cumulative_examples_processed', 'clipping_norm',
                 'test/accuracy', 'validation/accuracy'):
    assert column in metrics, column
  assert metrics['examples_processed'].gt(0).all()
  assert metrics['cumulative_examples_processed'].iloc[-1] == pytest.approx(
      metrics['examples_processed'].sum())
  # Evaluation only on eval rounds (2 and 4).
  assert metrics['test/accuracy'].notna().tolist() == [False, True, False, True]
  assert os.listdir(os.path.join(run_dir, 'tensorboard'))
  assert os.path.exists(os.path.join(run_dir, 'hparams.json'))
  progress = [l for l in result.stdout.splitlines() if l.startswith('round ')]
  assert len(progress) == 4 and 'ETA' in progress[0]
  # Synthetic's model is faster without oneDNN (`fl_common.tf_environment`).
  [where] = [l for l in result.stdout.splitlines()
             if l.startswith('runtime: ')]
  assert where.startswith('runtime: this process')
  if 'TF_ENABLE_ONEDNN_OPTS' not in _ENV:
    assert where.endswith(', oneDNN off'), where


def test_killed_run_resumes_to_the_same_metrics(full_run, tmp_path):
  run_dir, _ = full_run
  args = [*_SMALL_RUN, f'--root_output_dir={tmp_path}',
          '--experiment_name=resumed']
  process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=_REPO,
                             env=_ENV)
  for line in process.stdout:
    if line.startswith('round 3/4'):  # checkpoint of round 2 is on disk
      process.send_signal(signal.SIGKILL)
      break
  process.wait()
  assert process.returncode == -signal.SIGKILL
  _assert_no_surviving_workers()

  result = _run(*args)
  assert 'resuming from the checkpoint of round 2' in result.stdout
  pd.testing.assert_frame_equal(_metrics(os.path.join(tmp_path, 'resumed')),
                                _metrics(run_dir))


def test_cohort_in_slices_gives_the_same_metrics(full_run, tmp_path):
  # 3 clients in slices of at most 2: two partial aggregates merged, summed in
  # another order (hence rtol, not equality).
  run_dir, _ = full_run
  _run(*_SMALL_RUN, '--max_clients_per_call=2', f'--root_output_dir={tmp_path}',
       '--experiment_name=sliced')
  pd.testing.assert_frame_equal(_metrics(os.path.join(tmp_path, 'sliced')),
                                _metrics(run_dir), check_exact=False,
                                rtol=1e-5)


def test_cohort_accuracy_scores_the_server_model_before_the_round(
    full_run, tmp_path):
  run_dir, _ = full_run
  _run(*_SMALL_RUN, '--cohort_accuracy', f'--root_output_dir={tmp_path}',
       '--experiment_name=cohort')
  metrics = _metrics(os.path.join(tmp_path, 'cohort'))
  cohort = [c for c in metrics if c.startswith('cohort/')]
  assert 'cohort/accuracy' in cohort and metrics['cohort/accuracy'].notna().all()
  # The model's trajectory is the run's without the flag.
  pd.testing.assert_frame_equal(metrics.drop(columns=cohort),
                                _metrics(run_dir))
  # Round 1 scores the initial model, Synthetic's zeros: every class ties,
  # so the prediction is class 0, on the round's cohort (the driver's
  # sampling) over their whole training data.
  import tasks  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  # The driver's --seed also draws the task's validation clients.
  train = tasks.create_task('synthetic', seed=3).datasets.train_data
  ids = tff.simulation.build_uniform_sampling_fn(
      train.client_ids, replace=False, random_seed=3)(1, 3)
  labels = np.concatenate([np.asarray(train.arrays['y'])[train.client_rows(i)]
                           for i in ids]).reshape(-1)
  assert metrics['cohort/num_examples'][0] == len(labels)
  assert metrics['cohort/accuracy'][0] == pytest.approx(np.mean(labels == 0))
  assert metrics['cohort/accuracy'][0] < metrics['train/accuracy'][0]


def test_relative_paths_are_from_where_bazel_run_was_typed(tmp_path):
  # `bazel run` starts the driver in its runfiles; BUILD_WORKING_DIRECTORY
  # names the user's directory.
  result = subprocess.run(
      _command('--task=synthetic', '--total_rounds=1', '--clients_per_round=2',
               '--max_eval_clients=2', '--root_output_dir=runs',
               '--experiment_name=typed_here'),
      capture_output=True, text=True, cwd=_REPO, timeout=600,
      stdin=subprocess.DEVNULL,
      env={**_ENV, 'BUILD_WORKING_DIRECTORY': str(tmp_path)})
  assert result.returncode == 0, result.stderr[-3000:]
  assert os.path.isfile(tmp_path / 'runs' / 'typed_here' / 'metrics.csv')
  assert not os.path.exists(os.path.join(_REPO, 'runs'))


def test_no_worker_survives_a_run(full_run):
  del full_run  # the run has exited; so must its worker
  _assert_no_surviving_workers()


@pytest.mark.parametrize('flag,message', [
    ('--task=nonexistent', 'flag --task=nonexistent: value should be one of'),
    ('--clients_per_round=100000', 'larger than the'),
    ('--algorithm=fedmagic', 'flag --algorithm=fedmagic: value should be'),
])
def test_bad_values_give_one_error_line(tmp_path, flag, message):
  result = _run(*_SMALL_RUN, flag, f'--root_output_dir={tmp_path}', check=False)
  assert result.returncode == 2
  assert message in _error_line(result)
  assert not os.listdir(tmp_path)  # nothing half-written


@pytest.mark.parametrize('flag', ['--server_optimizer=rmsprop',
                                  '--clients_per_round=0', '--total_rounds=-1'])
def test_bad_flags_are_rejected_before_anything_runs(tmp_path, flag):
  result = _run(*_SMALL_RUN, flag, f'--root_output_dir={tmp_path}', check=False)
  assert result.returncode != 0
  assert flag.split('=')[0] in result.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('name', ['../outside', 'two\nlines'])
def test_a_run_name_that_is_not_one_directory_is_refused(tmp_path, name):
  root = tmp_path / 'root' / 'runs'
  result = _run(*_SMALL_RUN, f'--root_output_dir={root}',
                f'--experiment_name={name}', check=False)
  assert result.returncode == 2
  assert _error_line(result).startswith('error: --experiment_name=')
  assert not os.listdir(tmp_path)  # not the root, nor anything beside it


def test_missing_data_names_the_file(tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  out = tmp_path / 'out'
  result = _run('--task=emnist', f'--data_dir={empty}', '--total_rounds=1',
                f'--root_output_dir={out}', check=False)
  assert result.returncode == 2
  line = _error_line(result)
  assert str(empty) in line and '--use_synthetic_data' in line
  assert not out.exists() and not os.listdir(empty)


def test_corrupt_checkpoint_is_reported_and_left_alone(full_run, tmp_path):
  run_dir, _ = full_run
  copy = tmp_path / 'full'
  shutil.copytree(run_dir, copy)
  checkpoint_dir = copy / 'checkpoints'
  latest = max(checkpoint_dir.iterdir(), key=lambda p: int(p.name.split('_')[-1]))
  for path in latest.rglob('*'):
    if path.is_file():
      path.write_bytes(b'not a checkpoint')
  def outputs():  # run.lock holds the pid of the run holding the directory
    return {p: p.read_bytes() for p in copy.rglob('*')
            if p.is_file() and p.name != 'run.lock'}

  before = outputs()
  result = _run(*_SMALL_RUN, f'--root_output_dir={tmp_path}',
                '--experiment_name=full', '--total_rounds=6', check=False)
  assert result.returncode == 2
  line = _error_line(result)
  assert 'is damaged' in line and f'rm -r {latest}' in line
  after = outputs()
  assert after == before


def test_other_flags_on_an_existing_run_are_refused(full_run, tmp_path):
  run_dir, _ = full_run
  shutil.copytree(run_dir, tmp_path / 'full')
  result = _run(*_SMALL_RUN, '--client_learning_rate=0.5',
                f'--root_output_dir={tmp_path}', '--experiment_name=full',
                check=False)
  assert result.returncode == 2
  assert 'client_learning_rate' in _error_line(result)


def test_canonical_stackoverflow_command(tmp_path):
  """The canonical command (`--task=stackoverflow --server_optimizer=lamb`)
  on synthetic data. Other server optimizers are the flag rules' and the
  optimizers' tests: this one is the whole word LSTM end to end."""
  result = _run('--task=stackoverflow', '--server_optimizer=lamb',
                '--use_synthetic_data', '--total_rounds=3',
                f'--root_output_dir={tmp_path}')
  (run_dir,) = tmp_path.iterdir()
  metrics = _metrics(run_dir)
  assert list(metrics['round']) == [1, 2, 3]
  assert metrics['train/loss'].notna().all()
  assert 'test/accuracy' in metrics
  assert 'final test/accuracy' in result.stdout
