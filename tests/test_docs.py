"""Every command in README.md and docs/ runs, or at least parses.

Driver commands run (cut to two rounds) and their shown `error:` lines are
the ones printed; `make` and `bazel` commands name existing targets; the
notebook example runs.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

# Imported here, not under capsys: submitit's log handlers bind the
# streams current when it is first imported.
from reproduce import __main__ as cli
from tests import run_directories

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = ['README.md', *sorted(
    os.path.relpath(p, _REPO) for p in glob.glob(os.path.join(_REPO, 'docs',
                                                              '*.md')))]


def _commands():
  """(doc, command line, the `error:` line shown after it or None)."""
  found = []
  for doc in _DOCS:
    with open(os.path.join(_REPO, doc)) as f:
      text = f.read()
    for match in re.finditer(
        r'(<!-- (?:recipe: run|cluster: one run) -->\n)?```[a-z]*\n(.*?)```',
        text, re.S):
      if match.group(1):
        # Runs once its recipe is applied (tests/test_extending.py), or as
        # an sbatch script on a real cluster (tests/reproduce/test_cluster.py).
        continue
      block = match.group(2)
      lines = [line.strip() for line in block.replace('\\\n', ' ').split('\n')]
      for i, line in enumerate(lines):
        line = re.sub(r'^\$ ', '', line)
        if re.match(r'(python |make |bazel )', line):
          shown = lines[i + 1] if i + 1 < len(lines) else ''
          found.append((doc, line.split('#')[0].strip(),
                        shown if shown.startswith('error:') else None))
  return found


_ALL = _commands()


def _driver_args(command):
  words = shlex.split(command)
  if words[:2] == ['python', 'run_experiment.py']:
    return words[2:]
  if words[:3] == ['bazel', 'run', '//:run_experiment']:
    return words[4:]
  return None


def test_the_docs_have_driver_commands():
  assert sum(_driver_args(c) is not None for _, c, _ in _ALL) >= 4


@pytest.mark.parametrize('doc, command, error', [
    c for c in _ALL if _driver_args(c[1]) is not None])
def test_driver_command_runs_or_fails_as_shown(doc, command, error, tmp_path):
  args = _driver_args(command)
  if any(a.startswith('--worker_addresses') for a in args):
    # Needs workers on other machines: it must at least pass the flag check,
    # then fail to reach them in one line.
    args = [a for a in args if not a.startswith('--task=')] + [
        '--task=synthetic']
  else:
    args = [a for a in args if not re.match(r'--(total_rounds|root_output_dir'
                                            r'|rounds_per_eval)=', a)]
    args += ['--total_rounds=2', '--rounds_per_eval=2']
  args += [f'--root_output_dir={tmp_path}']
  result = run_directories.run_driver(*args, check=False)
  if error is None and not any(a.startswith('--worker_addresses')
                               for a in args):
    assert result.returncode == 0, (doc, command, result.stderr[-2000:])
    return
  assert result.returncode == 2, (doc, command, result.stderr[-2000:])
  lines = result.stderr.strip().split('\n')
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  if error is not None and 'host2' not in error:
    assert lines[0].startswith(error.split('...')[0].strip()), (error, lines)


@pytest.mark.parametrize('doc, command, error', [
    c for c in _ALL if c[1].startswith(('make ', 'bazel '))])
def test_make_and_bazel_commands_name_existing_targets(doc, command, error):
  del error
  words = shlex.split(command)
  if words[0] == 'make':
    with open(os.path.join(_REPO, 'Makefile')) as f:
      assert re.search(rf'^{words[1]}:', f.read(), re.M), (doc, command)
    return
  for label in (w for w in words if w.startswith('//') and ':' in w):
    package, name = label[2:].split(':')
    if name == '...':
      continue
    if not os.path.exists(os.path.join(_REPO, package or '.', 'BUILD')):
      pytest.skip('BUILD files are not in the runfiles under `bazel test`;'
                  ' `make test` checks the labels')
    with open(os.path.join(_REPO, package, 'BUILD')) as f:
      build = f.read()
    assert (f'name = "{name}"' in build or
            (package == 'tests' and os.path.exists(
                os.path.join(_REPO, 'tests', name + '.py')))), (doc, label)


def test_notebook_example_runs():
  result = subprocess.run(
      [sys.executable, os.path.join(_REPO, 'docs', 'notebook.py')],
      capture_output=True, text=True, timeout=600, cwd=_REPO,
      stdin=subprocess.DEVNULL)
  assert result.returncode == 0, result.stderr[-3000:]
  for name in ('fedavg', 'fedlamb', 'adabest', 'scaffold', 'fedavgcm_gel'):
    assert re.search(rf'^{name} loss \d', result.stdout, re.M), result.stdout


def test_make_test_runs_the_suite_under_pytest_or_bazel_and_ci_under_bazel(
    tmp_path):
  """`make test` runs pytest over tests/; TEST_RUNNER=bazel every module as a
  Bazel target instead, which is what CI runs (so that each target is seen
  to pass and no module runs twice). A runner that does not exist, or flags
  meant for the other runner, is one error line before the install."""
  def make(*args):
    return subprocess.run(['make', '--no-print-directory', '-C', _REPO, *args],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)

  pytest_run = make('-n', 'test')
  assert pytest_run.returncode == 0, pytest_run.stderr
  assert re.search(r'^\S+ -m pytest .*', pytest_run.stdout, re.M)
  assert not re.search(r'^bazel test', pytest_run.stdout, re.M)
  bazel_run = make('-n', 'test', 'TEST_RUNNER=bazel')
  assert bazel_run.returncode == 0, bazel_run.stderr
  assert re.search(r'^bazel test .*//\.\.\.$', bazel_run.stdout, re.M)
  assert '-m pytest' not in bazel_run.stdout
  venv = str(tmp_path / 'venv')
  for settings, error in (
      (['TEST_RUNNER=nose'],
       "error: TEST_RUNNER must be pytest or bazel, got 'nose'"),
      (['TEST_RUNNER=bazel', 'PYTEST_FLAGS=-x'],
       'error: PYTEST_FLAGS does nothing with TEST_RUNNER=bazel'
       " (BAZEL_TEST_FLAGS is bazel's)"),
      (['BAZEL_TEST_FLAGS=--keep_going'],
       'error: BAZEL_TEST_FLAGS does nothing with TEST_RUNNER=pytest'
       " (PYTEST_FLAGS is pytest's)")):
    refused = make('test', f'VENV={venv}', *settings)
    assert refused.returncode == 2, refused
    assert refused.stderr.splitlines()[0] == error
    assert not os.path.exists(venv)  # refused before the install
  with open(os.path.join(_REPO, '.ci', 'run')) as f:
    ci = f.read()
  assert re.search(r'^make test TEST_RUNNER=bazel ', ci, re.M)
  assert 'tag_filters' not in ci and 'PYTEST_FLAGS' not in ci


def _reproduce_args(command):
  """The arguments of a `python -m reproduce` command (None for another
  command, or a pattern with placeholders such as PAPER)."""
  words = shlex.split(command)
  if words[:3] != ['python', '-m', 'reproduce'] or any(
      w.isupper() for w in words):
    return None
  return words[3:]


@pytest.mark.parametrize('doc, command, error', [
    c for c in _ALL if _reproduce_args(c[1]) is not None and
    _reproduce_args(c[1])[:1] != ['history']])
def test_reproduce_commands_parse_and_plan(doc, command, error, tmp_path,
                                           capsys):
  """Each `python -m reproduce` command the docs show passes its checks and
  builds its grids: run as `--dry_run` (what it would run or submit, with
  the sbatch script for `--launcher=slurm`), or as shown where it runs
  nothing (`--plan`, `--status`, `--list`). `history` rewrites committed
  reports; its parser is tested in tests/reproduce."""
  del error
  args = [a for a in _reproduce_args(command)
          if a not in ('--wait', '--report_only') and
          not a.startswith('--root_output_dir=')]
  if not set(args) & {'--plan', '--status', '--list', '--dry_run'}:
    args.append('--dry_run')
  if args[0] != 'freeze':
    args.append(f'--root_output_dir={tmp_path}')
  code = cli.main(args)
  captured = capsys.readouterr()
  assert code == 0, (doc, command, captured.err[-2000:])
  if '--launcher=slurm' in args:
    assert '#SBATCH --requeue' in captured.out, (doc, command)
