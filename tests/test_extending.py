"""docs/extending.md's recipes, applied to a copy of the package and run.

Each recipe's code blocks are inserted where the document says (after an
anchor line of the named file), in a copy of the repository, and its
command runs there: the recipe works as written and touches only the
files it names.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pandas as pd

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `<!-- recipe: FILE after: ANCHOR -->` inserts the block after the line
# ANCHOR of FILE; `<!-- recipe: FILE new -->` creates FILE.
_RECIPE = re.compile(
    r'<!-- recipe: (\S+) (?:after: (.*?)|(new)) -->\n```python\n(.*?)```',
    re.DOTALL)
_COMMAND = re.compile(r'<!-- recipe: run -->\n```sh\n(.*?)```', re.DOTALL)
# `<!-- recipe: tests -->` before the pytest commands the recipe names.
_TESTS = re.compile(r'<!-- recipe: tests -->\n```sh\n(.*?)```', re.DOTALL)
# The most files each recipe may touch (issue 93: optimizer 3 with a module
# of its own and its test, task 3, stateful family 6, paper 4 with its
# numbers); each test also checks which.
_MAX_FILES = {'A new optimizer': 3, 'A new task': 3,
              'A new stateful family': 6, 'A new paper': 4}


def _section(title):
  """The part of docs/extending.md under the heading starting `title`."""
  with open(os.path.join(_REPO, 'docs', 'extending.md')) as f:
    (section,) = [part for part in f.read().split('\n## ')
                  if part.startswith(title)]
  return section


def _copy_with_recipes(section, destination):
  """The repository copied to `destination`, with `section`'s insertions;
  the files they touched."""
  shutil.copytree(_REPO, destination, ignore=shutil.ignore_patterns(
      '.git', '.venv*', 'results', 'bazel-*', '__pycache__', '.ci'))
  touched = set()
  for path, anchor, new, block in _RECIPE.findall(section):
    target = os.path.join(destination, path)
    if new:
      assert not os.path.exists(target), path
      text = block
    else:
      with open(target) as f:
        text = f.read()
      assert text.count(anchor) == 1, (path, anchor)
      text = text.replace(anchor, anchor + '\n' + block.rstrip('\n'))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, 'w') as f:
      f.write(text)
    touched.add(path)
  return touched


def _applied(title, copy):
  """The section `title`, applied to a copy at `copy`; the files touched,
  at most the recipe's count."""
  section = _section(title)
  touched = _copy_with_recipes(section, copy)
  assert len(touched) <= _MAX_FILES[title], touched
  return section, touched


def _run_named_tests(section, copy):
  """Runs, in the copy, each pytest command the section names: all pass."""
  (block,) = _TESTS.findall(section)
  commands = [shlex.split(line) for line in
              block.replace('\\\n', ' ').strip().splitlines()]
  assert commands
  for argv in commands:
    assert argv[:3] == ['python', '-m', 'pytest'], argv
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
         *argv[3:]], cwd=copy, env={**os.environ, 'PYTHONPATH': str(copy)},
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (argv, result.stdout[-3000:])


def _run_recipe(section, tmp_path, name, *extra):
  """Runs the section's command in the copy (`tmp_path / 'package'`)."""
  (command,) = _COMMAND.findall(section)
  argv = shlex.split(command.replace('\\\n', ' '))
  assert argv[:2] == ['python', 'run_experiment.py']
  env = {**os.environ, 'PYTHONPATH': str(tmp_path / 'package')}
  return subprocess.run(
      [sys.executable, *argv[1:], *extra,
       f'--root_output_dir={tmp_path / "runs"}', f'--experiment_name={name}'],
      cwd=tmp_path / 'package', env=env, capture_output=True, text=True,
      timeout=600)


def _finished_run(section, tmp_path, name):
  """Runs the section's command; `(hparams, metrics)` of its two rounds."""
  run = _run_recipe(section, tmp_path, name)
  assert run.returncode == 0, run.stderr[-2000:]
  run_dir = tmp_path / 'runs' / name
  with open(run_dir / 'hparams.json') as f:
    hparams = json.load(f)
  metrics = pd.read_csv(run_dir / 'metrics.csv')
  assert list(metrics['round']) == [1, 2]
  return hparams, metrics


def test_the_optimizer_recipe_runs_as_written(tmp_path):
  section, touched = _applied('A new optimizer', tmp_path / 'package')
  assert touched == {'fl_common/optimizers.py'}
  hparams, _ = _finished_run(section, tmp_path, 'rmsprop')
  assert hparams['server_optimizer'] == 'rmsprop'
  assert hparams['server_decay'] == 0.5
  assert 'server_momentum' not in hparams
  # A hyperparameter it does not take is refused, as for every optimizer.
  refused = _run_recipe(section, tmp_path, 'no', '--server_momentum=0.5')
  assert refused.returncode == 2
  assert ('--server_momentum is not a hyperparameter of'
          ' --server_optimizer=rmsprop') in refused.stderr
  assert not (tmp_path / 'runs' / 'no').exists()
  _run_named_tests(section, tmp_path / 'package')


def test_the_task_recipe_runs_as_written(tmp_path):
  section, touched = _applied('A new task', tmp_path / 'package')
  assert touched == {'tasks/wine.py', 'tasks/partitioned_task.py',
                     'tasks/__init__.py'}
  hparams, metrics = _finished_run(section, tmp_path, 'wine')
  assert hparams['task'] == 'wine' and hparams['wine_model'] == 'mlp'
  assert hparams['dirichlet_alpha'] == 0.3 and hparams['num_clients'] == 10
  assert metrics['test/accuracy'].notna().any()
  # Its flag is refused for another task, as every task's own flag is.
  refused = subprocess.run(
      [sys.executable, 'run_experiment.py', '--task=synthetic',
       '--wine_model=mlp', f'--root_output_dir={tmp_path / "runs"}',
       '--experiment_name=no'],
      cwd=tmp_path / 'package',
      env={**os.environ, 'PYTHONPATH': str(tmp_path / 'package')},
      capture_output=True, text=True, timeout=600)
  assert refused.returncode == 2
  assert '--wine_model is only used by --task=wine' in refused.stderr
  assert not (tmp_path / 'runs' / 'no').exists()
  _run_named_tests(section, tmp_path / 'package')


def test_the_stateful_family_recipe_runs_as_written(tmp_path):
  copy = tmp_path / 'package'
  section, touched = _applied('A new stateful family', copy)
  assert touched == {'ef_tff/__init__.py', 'ef_tff/BUILD',
                     'tests/ef_tff/test_ef_tff.py',
                     'experiment_driver/ef_setup.py',
                     'experiment_driver/families.py',
                     'experiment_driver/BUILD'}
  # Its NumPy test, the import rules (which find the new package), the
  # conformance suite and the flag rules (which find its builder and
  # algorithm).
  _run_named_tests(section, copy)
  hparams, metrics = _finished_run(section, tmp_path, 'ef')
  assert hparams['algorithm'] == 'error_feedback'
  assert hparams['client_learning_rate'] == 0.05
  assert hparams['server_learning_rate'] == 1.0
  assert metrics['client_states/mean_norm'].iloc[-1] > 0  # errors kept
  assert os.listdir(tmp_path / 'runs' / 'ef' / 'client_states')
  refused = _run_recipe(section, tmp_path, 'no', '--server_optimizer=adam')
  assert refused.returncode == 2
  assert ('--server_optimizer is not used by --algorithm=error_feedback'
          in refused.stderr)
  assert not (tmp_path / 'runs' / 'no').exists()


def test_the_paper_recipe_runs_as_written(tmp_path):
  copy = tmp_path / 'package'
  section, touched = _applied('A new paper', copy)
  assert touched == {'reproduce/fedprox_experiments.py',
                     'reproduce/__init__.py', 'reproduce/core.py'}
  (command,) = _COMMAND.findall(section)
  argv = shlex.split(command.replace('\\\n', ' '))
  assert argv[:3] == ['python', '-m', 'reproduce']
  run = subprocess.run(
      [sys.executable, *argv[1:], f'--root_output_dir={tmp_path / "runs"}'],
      cwd=copy, env={**os.environ, 'PYTHONPATH': str(copy)},
      capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-2000:]
  report = (tmp_path / 'runs' / 'reports' / 'exploratory' / 'smoke'
            / 'fedprox' / 'fig1' / 'README.md').read_text()
  assert report.startswith('# FedProx (Li et al. 2020): Figure 1')
  assert '**Verdict:** NOT TESTABLE AT THIS SCALE' in report
  # Both runs were read: each mu's final training loss is in the table.
  assert re.search(r'\| mu=0\.0 \| final training loss \| — \| \d', report)
  assert re.search(r'\| mu=1\.0 \| final training loss \| — \| \d', report)
  _run_named_tests(section, copy)
