"""fl_common.run_layout: the run directory's names and readers, in one place."""

import ast
import json
import os
import subprocess

import pandas as pd
import pytest

from fl_common import run_layout
import tests

_REPO = tests.REPO
_NAMES = {run_layout.HPARAMS_FILE, run_layout.MANIFEST_FILE,
          run_layout.METRICS_FILE}


def test_read_metrics_sorts_rounds_and_names_a_missing_file(tmp_path):
  pd.DataFrame({'round': [2, 1], 'loss': [0.5, 0.9]}).to_csv(
      tmp_path / 'metrics.csv', index=False)
  metrics = run_layout.read_metrics(str(tmp_path))
  assert metrics['round'].tolist() == [1, 2]
  assert metrics['loss'].tolist() == [0.9, 0.5]
  with pytest.raises(ValueError, match='elsewhere/metrics.csv does not exist'):
    run_layout.read_metrics(str(tmp_path / 'elsewhere'))


@pytest.mark.parametrize('text, problem', [
    ('', 'is empty'), ('loss\n0.5\n', "has no 'round' column")])
def test_read_metrics_refuses_a_file_it_cannot_read_by_round(
    tmp_path, text, problem):
  (tmp_path / 'metrics.csv').write_text(text)
  with pytest.raises(ValueError, match=problem):
    run_layout.read_metrics(str(tmp_path))


def test_read_hparams_reads_an_object_and_refuses_anything_else(tmp_path):
  (tmp_path / 'hparams.json').write_text(json.dumps({'task': 'synthetic'}))
  assert run_layout.read_hparams(str(tmp_path)) == {'task': 'synthetic'}
  (tmp_path / 'hparams.json').write_text('[1]')
  with pytest.raises(ValueError, match='must hold a JSON object, got list'):
    run_layout.read_hparams(str(tmp_path))


def test_no_other_module_spells_the_run_files_names():
  spelled = []
  for package in ('experiment_driver', 'fl_common', 'large_cohort',
                  'adabest_tff', 'gel_tff', 'reproduce', 'bench', 'tasks'):
    for name in sorted(os.listdir(os.path.join(_REPO, package))):
      path = os.path.join(_REPO, package, name)
      if not name.endswith('.py') or path.endswith('run_layout.py'):
        continue
      with open(path) as f:
        tree = ast.parse(f.read())
      docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                    if isinstance(node, (ast.Module, ast.FunctionDef,
                                         ast.ClassDef)) and node.body
                    and isinstance(node.body[0], ast.Expr)}
      spelled += [(os.path.relpath(path, _REPO), node.value)
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in _NAMES
                  and id(node) not in docstrings]
  assert not spelled


def _git(repo, *args):
  return subprocess.run(['git', '-C', str(repo), *args], check=True,
                        capture_output=True, text=True).stdout.strip()


def _commit(repo, *paths):
  """Commits `paths` in `repo`; returns the commit's hash."""
  _git(repo, 'add', *paths)
  _git(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q',
       '-m', 'commit')
  return _git(repo, 'rev-parse', 'HEAD')


def test_code_revision_names_the_commit_and_a_modified_checkout(tmp_path):
  repo = tmp_path / 'repo'
  repo.mkdir()
  _git(repo, 'init', '-q')
  (repo / 'module.py').write_text('x = 1\n')
  commit = _commit(repo, 'module.py')
  run_layout.code_revision.cache_clear()
  assert run_layout.code_revision(str(repo)) == f'git {commit[:12]}'
  (repo / 'untracked.py').write_text('')  # not part of the code's revision
  run_layout.code_revision.cache_clear()
  assert run_layout.code_revision(str(repo)) == f'git {commit[:12]}'
  # A report rewritten under results/ is an output, not code.
  (repo / 'results').mkdir()
  (repo / 'results' / 'README.md').write_text('one\n')
  commit = _commit(repo, 'results/README.md')
  (repo / 'results' / 'README.md').write_text('two\n')
  run_layout.code_revision.cache_clear()
  assert run_layout.code_revision(str(repo)) == f'git {commit[:12]}'
  (repo / 'module.py').write_text('x = 2\n')
  run_layout.code_revision.cache_clear()
  assert run_layout.code_revision(str(repo)) == f'git {commit[:12]}+modified'
  # A directory inside someone else's repository is not a checkout of the
  # package: the installed distribution's version (or unknown) names it.
  (repo / 'inner').mkdir()
  run_layout.code_revision.cache_clear()
  inner = run_layout.code_revision(str(repo / 'inner'))
  run_layout.code_revision.cache_clear()
  assert not inner.startswith('git ')
  assert inner == 'unknown' or inner.startswith(run_layout.DISTRIBUTION + ' ')
