"""`reproduce.run_archive`: an experiment's finished runs kept in one file,
restored on another machine as finished runs."""

import io
import json
import os
import subprocess
import tarfile
import types

import pytest

from fl_common import run_layout
from reproduce import __main__ as cli
from reproduce import core
from reproduce import protocol as protocols
from reproduce import run_archive
from reproduce import sweep


def _points(root, rounds=3):
  return sweep.build_points((sweep.Axis('seed', ('1', '2', '3')),),
                            str(root), rounds, name_prefix='grid')


def _write(point, rounds, manifest=True, revision=None):
  os.makedirs(point.run_dir)
  with open(os.path.join(point.run_dir, run_layout.HPARAMS_FILE), 'w') as f:
    json.dump(dict(point.values), f)
  with open(os.path.join(point.run_dir, run_layout.METRICS_FILE), 'w') as f:
    f.write('round,test/accuracy\n' + ''.join(
        f'{r},{0.1 * r + int(point.values["seed"])}\n'
        for r in range(1, rounds + 1)))
  if manifest:
    with open(os.path.join(point.run_dir, run_layout.MANIFEST_FILE),
              'w') as f:
      json.dump({'git': 'abc'} if revision is None else {
          run_layout.MANIFEST_CODE_KEY: [{'revision': revision,
                                          'from_round': 0}]}, f)
  # What the archive leaves out.
  os.makedirs(os.path.join(point.run_dir, 'checkpoints'))


def _files(run_dir):
  """File name -> bytes; a directory as None."""
  return {name: (None if os.path.isdir(os.path.join(run_dir, name)) else
                 open(os.path.join(run_dir, name), 'rb').read())
          for name in sorted(os.listdir(run_dir))}


def test_finished_runs_restore_elsewhere_as_the_same_finished_runs(tmp_path):
  points = _points(tmp_path / 'here')
  _write(points[0], 3)
  _write(points[1], 3, manifest=False)
  _write(points[2], 2)  # unfinished: not archived
  path = str(tmp_path / 'archive' / 'x.tar.xz')
  assert run_archive.save(points, path, {points[0].experiment_name: 12.5,
                                         'not_a_run': 1.0}) == 2
  elsewhere = _points(tmp_path / 'there')
  assert not any(map(sweep.is_finished, elsewhere))
  restored, timings = run_archive.restore(elsewhere, path)
  assert restored == [p.experiment_name for p in points[:2]]
  assert timings == {points[0].experiment_name: 12.5}
  assert [sweep.is_finished(p) for p in elsewhere] == [True, True, False]
  assert not os.path.exists(elsewhere[2].run_dir)
  for here, there in zip(points[:2], elsewhere[:2]):
    kept = {k: v for k, v in _files(here.run_dir).items()
            if k != 'checkpoints'}
    assert _files(there.run_dir) == kept
  # Nothing half-restored is left beside the runs.
  assert sorted(os.listdir(tmp_path / 'there')) == sorted(
      p.experiment_name for p in points[:2])


def test_an_archived_run_stays_and_the_same_runs_give_the_same_bytes(
    tmp_path):
  points = _points(tmp_path / 'runs')
  _write(points[0], 3)
  path = str(tmp_path / 'a.tar.xz')
  run_archive.save(points, path, {})
  first = open(path, 'rb').read()
  run_archive.save(points, path, {})
  assert open(path, 'rb').read() == first  # a commit of it changes nothing
  # The run leaves the disk, another finishes: the archive holds both.
  os.rename(points[0].run_dir, str(tmp_path / 'moved'))
  _write(points[1], 3)
  assert run_archive.save(points, path, {}) == 2
  assert not [f for f in os.listdir(tmp_path) if '.tmp' in f]


def test_a_killed_writer_s_temporary_file_is_removed_a_live_one_s_kept(
    tmp_path):
  points = _points(tmp_path / 'runs')
  _write(points[0], 3)
  path = str(tmp_path / 'a.tar.xz')
  child = subprocess.Popen(['sleep', '0'])
  child.wait()  # its pid is now free: a writer killed mid-write
  stale, live = f'{path}.tmp{child.pid}', f'{path}.tmp{os.getppid()}'
  for partial in (stale, live):
    with open(partial, 'wb') as f:
      f.write(b'half an archive')
  assert run_archive.save(points, path, {}) == 1
  assert not os.path.exists(stale)
  assert open(live, 'rb').read() == b'half an archive'


def test_restore_leaves_an_existing_run_directory_as_it_is(tmp_path):
  points = _points(tmp_path / 'runs')
  _write(points[0], 3)
  path = str(tmp_path / 'a.tar.xz')
  run_archive.save(points, path, {})
  other = _points(tmp_path / 'other')
  _write(other[0], 2)  # unfinished here: it resumes from its checkpoint
  before = _files(other[0].run_dir)
  assert run_archive.restore(other, path) == ([], {})
  assert _files(other[0].run_dir) == before


@pytest.mark.parametrize('member', ['../escape/metrics.csv',
                                    'grid__seed=1/checkpoints/ckpt',
                                    'another_grid__seed=1/metrics.csv'])
def test_a_member_that_is_not_a_kept_file_of_the_grid_is_refused(
    tmp_path, member):
  path = str(tmp_path / 'a.tar.xz')
  with tarfile.open(path, 'w:xz') as tar:
    info = tarfile.TarInfo(member)
    info.size = 2
    tar.addfile(info, io.BytesIO(b'{}'))
  points = _points(tmp_path / 'runs')
  with pytest.raises(ValueError, match='not a kept file of a run'):
    run_archive.restore(points, path)
  assert not os.path.exists(tmp_path / 'runs')
  assert not os.path.exists(tmp_path / 'escape')


@pytest.mark.parametrize('extra, word', [
    (['--dry_run'], '--dry_run'),
    (['--plan'], '--plan'),
    (['--launcher=slurm'], '--launcher=slurm'),
    (['--scale=paper_smoke'], 'paper_smoke'),
])
def test_runs_archive_is_refused_where_it_would_do_nothing(
    tmp_path, capsys, extra, word):
  code = cli.main(['gel', 'fig2', f'--runs_archive={tmp_path / "a"}',
                   f'--root_output_dir={tmp_path / "runs"}', *extra])
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and line.startswith('error: --runs_archive does nothing')
  assert word in line
  assert os.listdir(tmp_path) == []


def test_a_damaged_archive_is_refused_and_nothing_is_restored(tmp_path):
  points = _points(tmp_path / 'runs')
  for point in points:
    _write(point, 3)
  path = str(tmp_path / 'a.tar.xz')
  run_archive.save(points, path, {})
  data = open(path, 'rb').read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2])  # cut off mid-stream
  elsewhere = _points(tmp_path / 'elsewhere')
  with pytest.raises(ValueError, match='is damaged'):
    run_archive.restore(elsewhere, path)
  assert not os.path.exists(tmp_path / 'elsewhere')


def test_an_empty_runs_archive_is_refused(tmp_path, capsys):
  code = cli.main(['gel', 'fig2', '--runs_archive=',
                   f'--root_output_dir={tmp_path / "runs"}'])
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and line == ('error: --runs_archive needs a directory,'
                                ' got an empty value')
  assert os.listdir(tmp_path) == []


def _this_code_is_aaaaaaa(monkeypatch):
  monkeypatch.setattr(core, 'is_this_run_code',
                      lambda revision: revision == 'git aaaaaaa')


def test_a_rerun_restores_only_runs_of_this_run_code_and_replaces_the_rest(
    tmp_path, monkeypatch):
  _this_code_is_aaaaaaa(monkeypatch)
  points = _points(tmp_path / 'old')
  _write(points[0], 3, revision='git aaaaaaa')
  _write(points[1], 3, revision='git bbbbbbb')
  _write(points[2], 3)  # its manifest records no code
  path = str(tmp_path / 'a.tar.xz')
  assert run_archive.save(points, path, {}) == 3
  here = _points(tmp_path / 'here')
  assert run_archive.restore(here, path, other_code=False)[0] == [
      here[0].experiment_name]
  assert [sweep.is_finished(p) for p in here] == [True, False, False]
  # Rerun at this code: the new runs replace the old ones in the archive.
  _write(here[1], 3, revision='git aaaaaaa')
  _write(here[2], 3, revision='git aaaaaaa')
  assert run_archive.save(here, path, {}) == 3
  again = _points(tmp_path / 'again')
  assert len(run_archive.restore(again, path, other_code=False)[0]) == 3
  # Without the choice every archived run is restored, as before.
  assert len(run_archive.restore(_points(tmp_path / 'all'), path)[0]) == 3


def test_a_rerun_refuses_a_root_with_finished_runs_of_other_code(
    tmp_path, monkeypatch):
  _this_code_is_aaaaaaa(monkeypatch)
  points = _points(tmp_path / 'runs')
  monkeypatch.setattr(core, 'build_points', lambda *args, **kwargs: points)
  experiment = types.SimpleNamespace(paper='gel', name='fig2')
  phase = core.Phase(protocols.EXPLORATORY, None)

  def restore_read():
    return run_archive.restore_read(
        str(tmp_path / 'archive'), experiment, 'local', str(tmp_path / 'runs'),
        None, phase, print_fn=lambda line: None, rerun_other_code=True)

  _write(points[0], 3, revision='git aaaaaaa')
  _write(points[1], 2, revision='git bbbbbbb')  # unfinished: it resumes
  assert [p for p, _ in restore_read()] == [points]
  _write(points[2], 3, revision='git bbbbbbb')
  with pytest.raises(ValueError, match='holds 1 finished runs of other run'
                     f' code \\(e.g. {points[2].experiment_name}\\)'):
    restore_read()


@pytest.mark.parametrize('extra', [[], ['--report_only']])
def test_rerun_other_code_is_refused_where_it_would_do_nothing(
    tmp_path, capsys, extra):
  archive = [f'--runs_archive={tmp_path / "a"}'] if extra else []
  code = cli.main(['gel', 'fig2', '--rerun_other_code', *archive, *extra,
                   f'--root_output_dir={tmp_path / "runs"}'])
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and line.startswith(
      'error: --rerun_other_code does nothing')
  assert os.listdir(tmp_path) == []
