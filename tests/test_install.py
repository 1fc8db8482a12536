"""The supported stack as installed: third-party fixes, Keras 2, a quiet start.

`requirements/fix_dependencies.py` is tested on copies of the files it
edits (applied once, idempotent, refusing a file it does not recognize) and
on the installed packages (applied, and what it fixes works);
`fl_common.tf_environment` on a stand-in `tensorflow` package that writes to
stderr on import, and on the real one in a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import run_directories

_REPO = run_directories.REPO
_FIXER = os.path.join(_REPO, 'requirements', 'fix_dependencies.py')
sys.path.insert(0, os.path.join(_REPO, 'requirements'))
import fix_dependencies  # pylint: disable=g-import-not-at-top,wrong-import-position


def _original_tree(root, fixes=fix_dependencies.FIXES):
  """Files holding each fix's original text, as a fresh install has them."""
  for fix in fixes:
    path = os.path.join(root, fix.package, fix.path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = open(path).read() if os.path.exists(path) else '# before\n'
    with open(path, 'w') as f:
      f.write(text + fix.old + '# after\n')


def _fixer(*args, root):
  return subprocess.run(
      [sys.executable, _FIXER, *args], capture_output=True, text=True,
      env={**os.environ, 'FL_PAPERS_FIX_ROOT': str(root)})


def test_apply_replaces_each_original_once_and_then_does_nothing(tmp_path):
  _original_tree(tmp_path)
  assert _fixer('check', root=tmp_path).returncode == 1
  first = _fixer('apply', root=tmp_path)
  assert first.returncode == 0, first.stderr
  assert first.stdout.count('fixed ') == len(fix_dependencies.FIXES)
  for fix in fix_dependencies.FIXES:
    text = open(os.path.join(tmp_path, fix.package, fix.path)).read()
    assert fix.new in text and fix.old not in text
    assert text.startswith('# before\n') and text.endswith('# after\n')
  second = _fixer('apply', root=tmp_path)
  assert (second.returncode, second.stdout) == (0, '')
  assert _fixer('check', root=tmp_path).returncode == 0


def test_a_file_of_another_version_is_refused_untouched(tmp_path):
  _original_tree(tmp_path)
  fix = fix_dependencies.FIXES[-1]
  path = tmp_path / fix.package / fix.path
  path.write_text('base_seed = something_else()\n')
  result = _fixer('apply', root=tmp_path)
  assert result.returncode == 1
  assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1
  assert 'neither the original nor the fixed text' in result.stderr
  assert path.read_text() == 'base_seed = something_else()\n'


def test_every_fix_is_applied_in_the_installed_packages():
  result = subprocess.run([sys.executable, _FIXER, 'check'],
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr


def test_tensorflow_privacy_imports_without_tensorflow_estimator():
  import importlib.util  # pylint: disable=g-import-not-at-top
  import tensorflow_privacy  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec('tensorflow_estimator') is None:
    assert not hasattr(tensorflow_privacy, 'v1')
  # What TFF uses of it.
  assert tensorflow_privacy.QuantileEstimatorQuery is not None


def test_tff_emnist_model_draws_its_seed_on_this_python():
  # `random.randint(1, 1e9)` raised TypeError on Python >= 3.12.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  task = tff.simulation.baselines.emnist.create_character_recognition_task(
      tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=4),
      model_id='cnn_dropout', only_digits=False, use_synthetic_data=True)
  model = task.model_fn()
  assert model.trainable_variables


_NOISY_TENSORFLOW = '''
import os
os.write(2, b"C++ start-up noise\\n")
ONEDNN_AT_IMPORT = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
{tail}
'''


def _python_with_stand_in_tensorflow(tmp_path, *, fails=False, env=(),
                                     args=()):
  """Imports the package's environment module over a stand-in TensorFlow."""
  package = tmp_path / 'tensorflow'
  package.mkdir(exist_ok=True)
  (package / '__init__.py').write_text(_NOISY_TENSORFLOW.format(
      tail='raise ImportError("broken TensorFlow")' if fails else ''))
  environment = {k: v for k, v in os.environ.items()
                 if k not in ('TF_CPP_MIN_LOG_LEVEL', 'FL_PAPERS_VERBOSE',
                              'TF_USE_LEGACY_KERAS', 'TF_ENABLE_ONEDNN_OPTS')}
  environment.update(env)
  environment['PYTHONPATH'] = os.pathsep.join([str(tmp_path), _REPO])
  code = textwrap.dedent('''
      import os, sys
      from fl_common import tf_environment
      print(os.environ['TF_USE_LEGACY_KERAS'],
            os.environ.get('TF_CPP_MIN_LOG_LEVEL'), 'tensorflow' in sys.modules)
      import tensorflow
      print(tensorflow.ONEDNN_AT_IMPORT, tf_environment.onednn_setting())
  ''')
  return subprocess.run([sys.executable, '-c', code, *args],
                        capture_output=True, text=True, env=environment,
                        cwd=tmp_path)


def test_tensorflow_start_up_lines_are_kept_off_stderr(tmp_path):
  result = _python_with_stand_in_tensorflow(tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['1', '3', 'True', 'None', 'default']
  assert result.stderr == ''


@pytest.mark.parametrize('args, env, want', [
    (('--task=synthetic',), {}, ['0', 'off']),
    (('--task', 'synthetic', '--total_rounds=2'), {}, ['0', 'off']),
    (('--task=synthetic', '--task=emnist'), {}, ['None', 'default']),
    (('--task=emnist',), {}, ['None', 'default']),
    (('--', '--task=synthetic'), {}, ['None', 'default']),
    ((), {}, ['None', 'default']),
    (('--task=synthetic',), {'TF_ENABLE_ONEDNN_OPTS': '1'}, ['1', 'on']),
])
def test_onednn_is_off_before_tensorflow_for_the_tasks_it_slows(
    tmp_path, args, env, want):
  result = _python_with_stand_in_tensorflow(tmp_path, env=env, args=args)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split()[3:] == want


@pytest.mark.parametrize('env, args', [
    ({'FL_PAPERS_VERBOSE': '1'}, ()),
    ({'TF_CPP_MIN_LOG_LEVEL': '0'}, ()),
    ({}, ('--verbosity=0',)),
])
def test_asking_for_output_keeps_the_start_up_lines(tmp_path, env, args):
  result = _python_with_stand_in_tensorflow(tmp_path, env=env, args=args)
  assert result.returncode == 0, result.stderr
  assert 'C++ start-up noise' in result.stderr


def test_a_failing_import_shows_what_tensorflow_wrote(tmp_path):
  result = _python_with_stand_in_tensorflow(tmp_path, fails=True)
  assert result.returncode == 1
  assert 'C++ start-up noise' in result.stderr
  assert 'ImportError: broken TensorFlow' in result.stderr


def _fresh_python(code, **env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ('TF_CPP_MIN_LOG_LEVEL', 'TF_USE_LEGACY_KERAS')}
  environment.update(env)
  return subprocess.run([sys.executable, '-c', code], capture_output=True,
                        text=True, env=environment, cwd=_REPO)


def test_the_package_gets_keras_2_and_a_silent_start():
  result = _fresh_python(
      'import tasks, tensorflow as tf; print(tf.keras.Sequential.__module__)')
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith('tf_keras.'), result.stdout
  assert result.stderr == ''


def test_tensorflow_imported_first_with_keras_3_is_named():
  result = _fresh_python('import tensorflow, tasks')
  assert result.returncode == 1
  assert 'LegacyKerasError' in result.stderr
  assert 'TF_USE_LEGACY_KERAS=1' in result.stderr


@pytest.mark.parametrize('command', [
    ['run_experiment.py', '--algorithm=adabest', '--server_optimizer=adam'],
    ['run_experiment.py', '--helpshort'],
    ['-m', 'tasks.prepare_data', '--help'],
    ['-m', 'reproduce', '--list'],
])
def test_commands_print_nothing_but_their_own_output(command):
  environment = {k: v for k, v in os.environ.items()
                 if k != 'TF_CPP_MIN_LOG_LEVEL'}
  result = subprocess.run([sys.executable, *command], capture_output=True,
                          text=True, env=environment, cwd=_REPO)
  if command[1] == '--algorithm=adabest':
    assert result.returncode == 2 and result.stdout == ''
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith('error: --server_optimizer is not used')
  else:  # absl's --helpshort exits 1 (its choice), the others 0
    assert result.returncode == (command[1] == '--helpshort'), result.stderr
    assert result.stdout and result.stderr == ''


def test_the_worker_runs_graphs_with_attributes_it_predates():
  # The driver's TensorFlow (2.21) builds the graphs; TFF's worker_binary
  # runs them on its own TensorFlow 2.14, which does not know the `grad_a` /
  # `grad_b` attributes newer TensorFlow puts on a gradient's MatMul: it must
  # ignore them and compute the same (each family's builder, run on the
  # worker in the rest of the suite, relies on it).
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.tensorflow.computation(tf.TensorSpec([3, 2], tf.float32),
                              tf.TensorSpec([2, 1], tf.float32))
  def gradient(x, w):
    with tf.GradientTape() as tape:
      tape.watch(w)
      loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
    return tape.gradient(loss, w)

  graph = tf.compat.v1.GraphDef()
  tff.framework.ConcreteComputation.get_proto(
      gradient).tensorflow.graph_def.Unpack(graph)
  matmul_attributes = {attribute for node in graph.node
                       if node.op == 'MatMul' for attribute in node.attr}
  assert {'grad_a', 'grad_b'} <= matmul_attributes
  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  w = np.array([[0.5], [-2.0]], np.float32)
  np.testing.assert_allclose(gradient(x, w), 2 * x.T @ (x @ w), rtol=1e-6)


_INSTALL = os.path.join(_REPO, 'requirements', 'install.sh')


def _fake_python(tmp_path, version):
  path = tmp_path / f'python{version}'
  path.write_text(f'#!/bin/sh\necho {version}\n')
  path.chmod(0o755)
  return str(path)


@pytest.mark.parametrize('python, expected', [
    ('fake-3.10', 'is Python 3.10; this package needs Python 3.11, 3.12 or'),
    ('/nonexistent/python3.12', 'is not a runnable Python'),
])
def test_install_refuses_an_unsupported_python_before_any_work(
    tmp_path, python, expected):
  if python.startswith('fake-'):
    python = _fake_python(tmp_path, python[len('fake-'):])
  venv = tmp_path / 'venv'
  result = subprocess.run(['sh', _INSTALL, str(venv)], capture_output=True,
                          text=True, env={**os.environ, 'PYTHON': python})
  assert result.returncode == 2
  assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1
  assert expected in result.stderr
  assert not venv.exists()


def test_install_refuses_a_gpu_setting_it_does_not_know(tmp_path):
  result = subprocess.run(['sh', _INSTALL, str(tmp_path / 'venv')],
                          capture_output=True, text=True,
                          env={**os.environ, 'GPU': 'yes'})
  assert result.returncode == 2
  assert result.stderr == 'error: GPU=yes: use GPU=1 or GPU=0\n'
