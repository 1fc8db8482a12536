"""Driver runs forked from a prestarted Python (`experiment_driver.prestart`) are
the runs a fresh `python run_experiment.py` makes: the same metrics, output,
exit codes and oneDNN setting; a timeout kills the run; a command it cannot
serve runs as a plain subprocess; no server outlives its use."""

import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from experiment_driver import prestart
from tests import run_directories

_SMALL = ['--clients_per_round=3', '--total_rounds=2', '--rounds_per_eval=2',
          '--max_eval_clients=20', '--seed=4']


def _fresh(*args, cwd=run_directories.REPO):
  return subprocess.run(run_directories.driver_command(*args),
                        capture_output=True, text=True, cwd=cwd, timeout=600,
                        stdin=subprocess.DEVNULL)


def _prestarted(prestarter, tmp_path, *args, **kwargs):
  out, err = tmp_path / 'out', tmp_path / 'err'
  code = prestarter.run(run_directories.driver_command(*args), str(out),
                        str(err), **kwargs)
  return code, out.read_text(), err.read_text()


@pytest.fixture(scope='module')
def prestarter():
  with prestart.Prestarter() as shared:
    yield shared


def _servers(marker):
  """Pids of live processes whose environment holds `marker`."""
  pids = []
  for pid in os.listdir('/proc'):
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        if marker.encode() in f.read().split(b'\0'):
          pids.append(int(pid))
    except (OSError, ValueError):
      pass
  return pids


def test_a_prestarted_run_is_the_fresh_run(prestarter, tmp_path):
  task = 'synthetic'
  root = tmp_path / 'runs'
  args = [f'--task={task}', *_SMALL, f'--root_output_dir={root}']
  fresh = _fresh(*args, '--experiment_name=fresh')
  assert fresh.returncode == 0, fresh.stderr
  code, out, err = _prestarted(prestarter, tmp_path, *args,
                               '--experiment_name=forked',
                               cwd=run_directories.REPO)
  assert code == 0 and err == fresh.stderr == ''
  pd.testing.assert_frame_equal(run_directories.read_metrics(root / 'forked'),
                                run_directories.read_metrics(root / 'fresh'))
  # The same lines bar timings and the run's name: the runtime line says
  # which oneDNN setting TensorFlow was imported with (off for Synthetic).
  def lines(text):
    return [line.split(' | ')[0] for line in text.replace('forked', 'fresh')
            .splitlines() if not line.startswith('round ')]
  assert lines(out) == lines(fresh.stdout)
  runtime_line, = [l for l in out.splitlines() if l.startswith('runtime:')]
  assert runtime_line.endswith('oneDNN off')


def test_exit_codes_and_error_lines_are_the_fresh_runs(prestarter, tmp_path):
  bad = ['--task=synthetic', '--clients_per_round=0']
  fresh = _fresh(*bad)
  code, out, err = _prestarted(prestarter, tmp_path, *bad)
  # A relative output path is from the run's own working directory.
  relative = _prestarted(prestarter, tmp_path, '--task=synthetic', *_SMALL,
                         '--root_output_dir=rel', '--experiment_name=r',
                         cwd=str(tmp_path))
  assert (code, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)
  assert code == 2 and err.startswith('error: ') and err.count('\n') == 1
  assert relative[0] == 0, relative[2]
  assert (tmp_path / 'rel' / 'r' / 'metrics.csv').is_file()


def test_a_timeout_kills_the_run_and_close_ends_the_server(tmp_path):
  name = 'FL_PAPERS_PRESTART_TEST'
  marker = f'{name}={tmp_path}'
  args = ['--task=synthetic', '--clients_per_round=3', '--total_rounds=100000',
          '--rounds_per_eval=100000', '--rounds_per_checkpoint=100000',
          f'--root_output_dir={tmp_path}', '--experiment_name=t']
  with prestart.Prestarter() as prestarter:
    with pytest.raises(subprocess.TimeoutExpired):
      _prestarted(prestarter, tmp_path, *args,
                  env={**os.environ, name: str(tmp_path)}, timeout=5)
    assert len(_servers(marker)) == 1  # the server; the run was killed
  time.sleep(1)
  assert not _servers(marker)


def test_a_command_it_cannot_serve_runs_as_a_subprocess(tmp_path):
  script = tmp_path / 'tool.py'
  script.write_text('import os, sys\nprint(os.getcwd(), sys.argv[1:])\n'
                    'sys.exit(3)\n')
  with prestart.Prestarter() as prestarter:
    out_path, err_path = tmp_path / 'o', tmp_path / 'e'
    code = prestarter.run([sys.executable, str(script), 'a'], str(out_path),
                          str(err_path), cwd=str(tmp_path))
  assert code == 3
  assert out_path.read_text() == f"{tmp_path} ['a']\n"


@pytest.mark.parametrize('command, env, key', [
    (['--task=synthetic'], {}, 'off'),
    (['--task', 'synthetic'], {}, 'off'),
    (['--task=emnist'], {}, 'default'),
    ([], {}, 'default'),
    (['--task=synthetic'], {'TF_ENABLE_ONEDNN_OPTS': '1'}, 'default'),
    (['--task=synthetic', '--verbosity=1'], {}, None),
    (['--task=synthetic'], {'FL_PAPERS_VERBOSE': '1'}, None),
])
def test_which_server_a_command_runs_in(command, env, key):
  assert prestart.onednn_key(run_directories.driver_command(*command),
                             env) == key
  assert prestart.onednn_key(['python3', prestart.DRIVER, *command], env) is None
  assert prestart.onednn_key([sys.executable, 'other.py', *command],
                             env) is None


def test_idle_servers_past_the_limit_end_and_close_ends_the_rest(tmp_path):
  markers = [f'FL_PAPERS_PRESTART_TEST={tmp_path}/{i}' for i in range(2)]
  with prestart.Prestarter(max_idle=1) as prestarter:
    for marker in markers:
      name, value = marker.split('=', 1)
      code, _, _ = _prestarted(prestarter, tmp_path, '--task=synthetic',
                               '--clients_per_round=0',
                               env={**os.environ, name: value})
      assert code == 2
    time.sleep(1)
    # The server of the latest environment is kept; the older ones ended.
    assert [bool(_servers(m)) for m in markers] == [False, True]
  time.sleep(1)
  assert not any(_servers(m) for m in markers)


def test_a_per_call_variable_starts_no_server_and_the_run_reads_the_callers(
    tmp_path, monkeypatch):
  # `BUILD_WORKING_DIRECTORY` (where `bazel run` was typed; the driver
  # resolves relative paths from it) stands for a variable nothing reads at
  # import: both calls go to one server, and each run reads its caller's.
  monkeypatch.setattr(prestart, 'PER_CALL_ENVIRONMENT',
                      (*prestart.PER_CALL_ENVIRONMENT,
                       'BUILD_WORKING_DIRECTORY'))
  marker = f'FL_PAPERS_PRESTART_TEST={tmp_path}'
  name, value = marker.split('=', 1)
  errors = []
  with prestart.Prestarter() as prestarter:
    # Refused at once, each in its own words: in a/, `out` is a file; in
    # b/, the run's metrics.csv is a directory.
    (tmp_path / 'a').mkdir()
    (tmp_path / 'a' / 'out').write_text('')
    (tmp_path / 'b' / 'out' / 'r' / 'metrics.csv').mkdir(parents=True)
    for where in ('a', 'b'):
      code, _, err = _prestarted(
          prestarter, tmp_path, '--task=synthetic', *_SMALL,
          '--root_output_dir=out', '--experiment_name=r',
          env={**os.environ, name: value, 'PYTEST_CURRENT_TEST': where,
               'BUILD_WORKING_DIRECTORY': str(tmp_path / where)})
      assert code == 2, err
      errors.append(err)
      assert len(_servers(marker)) == 1
  assert 'Not a directory' in errors[0] and 'metrics.csv' not in errors[0]
  assert 'metrics.csv' in errors[1], errors[1]


def test_the_server_imports_the_drivers_modules_and_forks_with_one_thread():
  assert {'experiment_driver.build', 'experiment_driver.training_loop',
          'tasks', 'tensorflow'} <= set(prestart.driver_imports())
  # What the server does before it serves, in a Python of its own (ending
  # the thread of this process's runtime would stop the suite's).
  script = ('import threading, tensorflow_federated as tff\n'
            'before = threading.active_count()\n'
            'from fl_common import default_context\n'
            'default_context.end_import_thread()\n'
            'print(before, threading.active_count())\n'
            'tff.tensorflow.computation(lambda: 1)()\n')
  result = subprocess.run([sys.executable, '-c', script], capture_output=True,
                          text=True, cwd=run_directories.REPO, check=False)
  assert result.stdout.split() == ['2', '1']
  # And the default context refuses to run, as in a driver run.
  assert result.returncode == 1 and 'RuntimeError' in result.stderr
