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
_RECIPE = re.compile(
    r'<!-- recipe: (\S+) after: (.*?) -->\n```python\n(.*?)```', re.DOTALL)
_COMMAND = re.compile(r'<!-- recipe: run -->\n```sh\n(.*?)```', re.DOTALL)


def _copy_with_recipes(document, destination):
  """The repository copied to `destination`, with `document`'s insertions;
  the files they touched."""
  shutil.copytree(_REPO, destination, ignore=shutil.ignore_patterns(
      '.git', '.venv*', 'results', 'bazel-*', '__pycache__', '.ci'))
  touched = set()
  for path, anchor, block in _RECIPE.findall(document):
    target = os.path.join(destination, path)
    with open(target) as f:
      text = f.read()
    assert text.count(anchor) == 1, (path, anchor)
    text = text.replace(anchor, anchor + '\n' + block.rstrip('\n'))
    with open(target, 'w') as f:
      f.write(text)
    touched.add(path)
  return touched


def test_the_optimizer_recipe_runs_as_written(tmp_path):
  with open(os.path.join(_REPO, 'docs', 'extending.md')) as f:
    document = f.read()
  copy = tmp_path / 'package'
  touched = _copy_with_recipes(document, copy)
  assert touched == {'large_cohort/optimizers.py'}
  (command,) = _COMMAND.findall(document)
  argv = shlex.split(command.replace('\\\n', ' '))
  assert argv[:2] == ['python', 'run_experiment.py']
  env = {**os.environ, 'PYTHONPATH': str(copy)}
  run = subprocess.run(
      [sys.executable, *argv[1:], f'--root_output_dir={tmp_path / "runs"}',
       '--experiment_name=rmsprop'],
      cwd=copy, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  run_dir = tmp_path / 'runs' / 'rmsprop'
  with open(run_dir / 'hparams.json') as f:
    hparams = json.load(f)
  assert hparams['server_optimizer'] == 'rmsprop'
  assert hparams['server_decay'] == 0.5
  assert 'server_momentum' not in hparams
  metrics = pd.read_csv(run_dir / 'metrics.csv')
  assert list(metrics['round']) == [1, 2]
  # A hyperparameter it does not take is refused, as for every optimizer.
  refused = subprocess.run(
      [sys.executable, *argv[1:], '--server_momentum=0.5',
       f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=no'],
      cwd=copy, env=env, capture_output=True, text=True, timeout=600)
  assert refused.returncode == 2
  assert ('--server_momentum is not a hyperparameter of'
          ' --server_optimizer=rmsprop') in refused.stderr
  assert not (tmp_path / 'runs' / 'no').exists()
