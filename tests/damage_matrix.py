"""The damage matrix: every run file x every way it is met damaged.

Not a test module: `tests/test_damage_<family>.py` run it for FedOpt,
AdaBest (stateful clients) and FedAvgCM+GeL.

A run directory is damaged one file at a time, in each of `DAMAGES`:
truncated, one byte flipped, deleted, replaced by another run's file (a run
of the same flags but another seed), by an older copy (the file as the run
left it one checkpoint earlier), or joined by an extra file beside it (a
copy under another name: for a client state, another client's name at the
same round). Then the same command resumes it. What is asserted is the
promise of the run directory, whatever the file: the resume is refused in
one `error:` line naming a file of the run and writes nothing, or it runs
and its `metrics.csv` equals that of the uninterrupted run.

Every file of a run directory must belong to one of `KINDS`: a run file
added to the layout without its cases fails `check_every_file_has_a_kind`.
"""

import os
import shutil
from typing import Optional

import pandas as pd
import pytest

from tests import run_directories

# Kinds of run files, keyed by a path relative to the run directory.
KINDS = ('hparams.json', 'manifest.json', 'metrics.csv', 'run.lock',
         'tensorboard/events', 'checkpoints/latest', 'checkpoints/older',
         'client_states/MANIFEST.json', 'client_states/state',
         'gel_summary.json')
STATEFUL_KINDS = ('client_states/MANIFEST.json', 'client_states/state')
GEL_KINDS = ('gel_summary.json',)
DAMAGES = ('truncate', 'flip', 'delete', 'another_run', 'older_copy',
           'extra_file')

# The checkpoint rounds: the damaged run stops at LAST, its older copy is
# the run as it was at OLDER; the resumed run goes on to RESUMED.
OLDER, LAST, RESUMED = 1, 2, 3


def kind_of(relative: str) -> Optional[str]:
  """The kind of the run file at `relative` (a path in the run directory)."""
  parts = relative.split(os.sep)
  if relative in ('hparams.json', 'manifest.json', 'metrics.csv',
                  'run.lock', 'gel_summary.json'):
    return relative
  if parts[0] == 'tensorboard':
    return 'tensorboard/events'
  if parts[0] == 'checkpoints' and len(parts) > 2:
    return ('checkpoints/latest' if parts[1] == f'program_state_{LAST}'
            else 'checkpoints/older')
  if parts[0] == 'client_states':
    return ('client_states/MANIFEST.json' if parts[1] == 'MANIFEST.json'
            else 'client_states/state')
  return None


def files_of(run_dir: str) -> list[str]:
  """The run directory's files, relative to it, sorted."""
  found = []
  for parent, _, names in os.walk(run_dir):
    for name in names:
      found.append(os.path.relpath(os.path.join(parent, name), run_dir))
  return sorted(found)


def check_every_file_has_a_kind(run_dir: str) -> None:
  unknown = [f for f in files_of(run_dir) if kind_of(f) is None]
  assert not unknown, (
      f'run files without damage cases: {unknown}; give them a kind in'
      ' tests/damage_matrix.py')


# Kinds a resume from a latest checkpoint that verifies never reads: the
# lock's pid, TensorBoard's events (rewritten from metrics.csv), the older
# checkpoints. Each damage is applied to all of them at once, one resume a
# damage instead of one a kind: the driver runs are most of the suite's time,
# and what the resume does not read cannot interact.
NEVER_READ = ('run.lock', 'tensorboard/events', 'checkpoints/older')


def kinds_of(stateful: bool = False, gel: bool = False) -> list[str]:
  """The kinds of a family's run directory: stateful clients' add the
  client-state store's files, GeL's its summary."""
  return [k for k in KINDS if (stateful or k not in STATEFUL_KINDS) and
          (gel or k not in GEL_KINDS)]


def cases(stateful: bool = False, gel: bool = False
          ) -> list[tuple[str, str]]:
  """The (kinds, damage) pairs: each kind a resume reads alone, the
  `NEVER_READ` kinds together (`+`-joined)."""
  kinds = [k for k in kinds_of(stateful, gel) if k not in NEVER_READ]
  kinds.append('+'.join(NEVER_READ))
  return [(kind, damage) for kind in kinds for damage in DAMAGES]


class Matrix:
  """A family's runs: the run to damage, its older copy, another seed's
  run, and the uninterrupted run the resumes must equal."""

  def __init__(self, root: str, args: list[str]):
    # Evaluated every round: a run evaluates at its last round too, so the
    # runs stopped at OLDER and LAST would otherwise hold rows the
    # uninterrupted run has not.
    self.args = [*args, '--rounds_per_checkpoint=1', '--rounds_per_eval=1']
    self.root = root
    run = run_directories.run_driver
    common = [*self.args, f'--root_output_dir={root}']
    run(*common, f'--total_rounds={OLDER}', '--experiment_name=base')
    shutil.copytree(os.path.join(root, 'base'), os.path.join(root, 'older'))
    run(*common, f'--total_rounds={LAST}', '--experiment_name=base')
    run(*[a for a in common if not a.startswith('--seed=')], '--seed=11',
        f'--total_rounds={LAST}', '--experiment_name=other')
    run(*common, f'--total_rounds={RESUMED}', '--experiment_name=reference')
    self.base = os.path.join(root, 'base')
    self.reference = run_directories.read_metrics(
        os.path.join(root, 'reference'))

  def target(self, kind: str) -> str:
    """The file of `kind` the matrix damages (relative): the first."""
    return next(f for f in files_of(self.base) if kind_of(f) == kind)

  def _source(self, which: str, relative: str) -> str:
    """The same file in the run `which` ('older' or 'other'), or, where it
    has none of that name, its first file of the same kind."""
    directory = os.path.join(self.root, which)
    path = os.path.join(directory, relative)
    if os.path.exists(path):
      return path
    parts = relative.split(os.sep)
    if parts[0] == 'checkpoints':  # the older checkpoint's same file
      path = os.path.join(directory, 'checkpoints', f'program_state_{OLDER}',
                          *parts[2:])
      if os.path.exists(path):
        return path
    kind = kind_of(relative)
    return os.path.join(directory, next(
        f for f in files_of(directory) if kind_of(f) == kind))

  def damage(self, run_dir: str, kind: str, damage: str) -> str:
    """Damages the file of `kind` in `run_dir`; returns its path."""
    relative = self.target(kind)
    path = os.path.join(run_dir, relative)
    if damage == 'truncate':
      with open(path, 'rb') as f:
        data = f.read()
      with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    elif damage == 'flip':
      with open(path, 'rb') as f:
        data = bytearray(f.read())
      if data:
        data[len(data) // 2] ^= 0x01
      else:
        data = bytearray(b'\x01')
      with open(path, 'wb') as f:
        f.write(bytes(data))
    elif damage == 'delete':
      os.remove(path)
    elif damage in ('another_run', 'older_copy'):
      shutil.copyfile(
          self._source('other' if damage == 'another_run' else 'older',
                       relative), path)
    elif damage == 'extra_file':
      directory, name = os.path.split(path)
      if kind == 'client_states/state':
        # Another client's name at the same round, one that did not train
        # then.
        prefix, version = name.rsplit('@', 1)
        taken = {n.rsplit('@', 1)[0] for n in os.listdir(directory)
                 if n.endswith('@' + version)}
        other = next(f'client-{k}' for k in range(10_000)
                     if f'client-{k}' not in taken)
        extra = f'{other}@{version}'
        del prefix
      else:
        extra = 'copy-' + name
      shutil.copyfile(path, os.path.join(directory, extra))
    else:
      raise ValueError(damage)
    return path

  def check(self, tmp_path: str, kinds: str, damage: str) -> str:
    """Damages a copy of the run (the file of each of the `+`-joined
    `kinds`) and resumes it: refused in one line that names a run file and
    writes nothing, or exactly the uninterrupted run. Returns 'refused',
    'exact', or 'unchanged' where the damage left every byte as it was (an
    older copy of a file that did not change: nothing to resume)."""
    run_dir = os.path.join(tmp_path, 'base')
    shutil.copytree(self.base, run_dir)
    kind = kinds
    damaged = [self.damage(run_dir, k, damage) for k in kinds.split('+')]
    if all(os.path.exists(p) and _read(p) == _read(
        os.path.join(self.base, os.path.relpath(p, run_dir)))
           for p in damaged) and damage != 'extra_file':
      return 'unchanged'
    before = {f: _read(os.path.join(run_dir, f)) for f in files_of(run_dir)
              if f != 'run.lock'}
    result = run_directories.run_driver(
        *self.args, f'--root_output_dir={tmp_path}', '--experiment_name=base',
        f'--total_rounds={RESUMED}', check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    case = f'{kind} x {damage} ({damaged})'
    if result.returncode != 0:
      assert result.returncode == 2, f'{case}: {result.stderr[-3000:]}'
      assert len(lines) == 1 and lines[0].startswith('error: '), (
          f'{case}: {result.stderr[-3000:]}')
      assert run_dir in lines[0], f'{case}: {lines[0]}'
      after = {f: _read(os.path.join(run_dir, f)) for f in files_of(run_dir)
               if f != 'run.lock'}
      assert after == before, f'{case}: the refused resume wrote files'
      return 'refused'
    assert not [line for line in lines
                if line.startswith('error:') or 'Traceback' in line], (
                    f'{case}: {result.stderr[-3000:]}')
    pd.testing.assert_frame_equal(
        run_directories.read_metrics(run_dir), self.reference,
        obj=f'{case}: metrics.csv')
    return 'exact'


def _read(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def module_tests(args: list[str], stateful: bool = False, gel: bool = False):
  """A test module's fixture and tests for the family run by `args`:

      matrix, test_every_run_file_has_its_cases, test_a_damaged_... = (
          damage_matrix.module_tests([...], stateful=True))
  """

  @pytest.fixture(scope='module')
  def matrix(tmp_path_factory):
    return Matrix(str(tmp_path_factory.mktemp('runs')), args)

  # pylint: disable=redefined-outer-name
  def test_every_run_file_has_its_cases(matrix):
    check_every_file_has_a_kind(matrix.base)
    kinds = {kind_of(f) for f in files_of(matrix.base)}
    assert kinds == set(kinds_of(stateful, gel))
    assert kinds == {k for kind, _ in cases(stateful, gel)
                     for k in kind.split('+')}

  @pytest.mark.parametrize('kind,damage', cases(stateful, gel))
  def test_a_damaged_run_file_is_refused_or_resumes_exactly(
      matrix, tmp_path, kind, damage):
    matrix.check(str(tmp_path), kind, damage)

  return (matrix, test_every_run_file_has_its_cases,
          test_a_damaged_run_file_is_refused_or_resumes_exactly)
