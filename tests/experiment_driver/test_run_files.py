"""Run files verified on resume (`experiment_driver.run_files`, `outputs`,
`fl_engine.client_state_store`): in process, on small files; the driver's
own resumes are in `test_run_faults`."""

import asyncio
import collections
import importlib.metadata
import json
import os
import platform
import shutil

import numpy as np
import pytest
import tensorflow as tf

from fl_engine import client_state_store
from fl_common import run_layout
from experiment_driver import outputs
from experiment_driver import release_managers
from experiment_driver import run_files

_STRUCTURE = collections.OrderedDict(w=np.zeros(3, np.float32),
                                     step=np.int64(0))


def _state(round_num):
  return collections.OrderedDict(w=np.full(3, round_num, np.float32),
                                 step=np.int64(round_num))


def _run_dir(path, **hparams):
  run_dir = outputs.RunDirectory(str(path), 'run', {'seed': 0, **hparams},
                                 checkpoints_to_keep=2)
  run_dir.check_hparams()
  run_dir.lock()
  return run_dir


def _train(run_dir, rounds, start=0):
  """Releases a row per round and checkpoints every second one."""
  run_dir.start_writing(start)
  if start == 0:
    run_dir.save_checkpoint(_state(0), 0)
    run_dir.record_checkpoint(0)
  for r in range(start + 1, rounds + 1):
    run_dir.release_metrics({'loss': 1.0 / r, **({'acc': 0.5} if r > 2
                                                  else {})}, r)
    if r % 2 == 0:
      run_dir.save_checkpoint(_state(r), r)
      run_dir.record_checkpoint(r)
  run_dir.unlock()


def test_metrics_digest_survives_a_widened_header_and_sees_any_change(
    tmp_path):
  path = str(tmp_path / 'metrics.csv')
  csv = release_managers.MetricsCsv(path)
  asyncio.run(csv.release({'loss': 0.5}, 1))
  asyncio.run(csv.release({'loss': 0.25}, 2))
  before = run_files.metrics_digest(path, 2)
  asyncio.run(csv.release({'loss': 0.125, 'acc': 0.5}, 3))  # a new column
  assert run_files.metrics_digest(path, 2) == before
  assert run_files.metrics_digest(path, 3)[0] == 3
  with open(path) as f:
    text = f.read()
  with open(path, 'w') as f:
    f.write(text.replace('0.25', '0.26'))
  assert run_files.metrics_digest(path, 2)[1] != before[1]
  assert run_files.metrics_digest(path, 1) == run_files.metrics_digest(
      path, 1)


def test_a_resume_uses_the_latest_checkpoint_that_verifies(tmp_path):
  _train(_run_dir(tmp_path), 6)
  run_dir = _run_dir(tmp_path)
  state, round_num = run_dir.load_latest_checkpoint(_STRUCTURE)
  assert round_num == 6 and state['step'] == 6


@pytest.mark.parametrize('damage', ['flipped_variable', 'deleted_file',
                                    'added_file'])
def test_a_damaged_checkpoint_is_refused_with_the_command_that_recovers(
    tmp_path, damage):
  _train(_run_dir(tmp_path), 6)
  latest = tmp_path / 'run' / 'checkpoints' / 'program_state_6'
  data = latest / 'variables' / 'variables.data-00000-of-00001'
  if damage == 'flipped_variable':  # same size, one float changed
    raw = bytearray(data.read_bytes())
    raw[-4:] = np.float32(7.0).tobytes()
    data.write_bytes(bytes(raw))
  elif damage == 'deleted_file':
    data.unlink()
  else:
    (latest / 'extra').write_text('x')
  run_dir = _run_dir(tmp_path)
  with pytest.raises(outputs.CheckpointError) as e:
    run_dir.load_latest_checkpoint(_STRUCTURE)
  assert str(latest) in str(e.value)
  assert str(e.value).endswith(f'to resume from round 4, the newest checkpoint'
                               f' that verifies, run: rm -r {latest}; then'
                               ' rerun the same command')
  shutil.rmtree(latest)
  state, round_num = run_dir.load_latest_checkpoint(_STRUCTURE)
  assert round_num == 4 and state['step'] == 4


@pytest.mark.parametrize('damage', ['emptied', 'deleted', 'row_changed',
                                    'last_row_torn'])
def test_damaged_metrics_are_refused_and_never_rewritten(tmp_path, damage):
  _train(_run_dir(tmp_path), 6)
  csv_path = tmp_path / 'run' / 'metrics.csv'
  text = csv_path.read_text()
  if damage == 'emptied':
    csv_path.write_text('')
  elif damage == 'deleted':
    csv_path.unlink()
  elif damage == 'row_changed':
    csv_path.write_text(text.replace('0.25', '0.24'))  # round 4's loss
  else:
    csv_path.write_text(text[:-3])
  damaged = csv_path.read_text() if csv_path.exists() else None
  run_dir = _run_dir(tmp_path)
  with pytest.raises(outputs.CheckpointError) as e:
    run_dir.load_latest_checkpoint(_STRUCTURE)
  assert str(e.value).startswith(f'{csv_path} is ')
  # Kept: rounds 0, 4 and 6 (checkpoints_to_keep=2, and the first).
  expected = {'emptied': 0, 'deleted': 0, 'row_changed': 0,
              'last_row_torn': 4}[damage]
  assert f'to resume from round {expected},' in str(e.value)
  assert (csv_path.read_text() if csv_path.exists() else None) == damaged


def test_a_checkpoint_saved_but_not_recorded_is_dropped(tmp_path):
  run_dir = _run_dir(tmp_path)
  _train(run_dir, 4)
  run_dir = _run_dir(tmp_path)
  run_dir.save_checkpoint(_state(6), 6)  # the run stopped before recording
  state, round_num = run_dir.load_latest_checkpoint(_STRUCTURE)
  assert round_num == 4 and state['step'] == 4
  assert not (tmp_path / 'run' / 'checkpoints' / 'program_state_6').exists()


def test_deleted_hparams_are_read_from_the_manifest(tmp_path):
  _train(_run_dir(tmp_path), 2)
  os.remove(tmp_path / 'run' / 'hparams.json')
  with pytest.raises(outputs.RunDirectoryError, match=r'seed: 0 -> 7'):
    outputs.RunDirectory(str(tmp_path), 'run', {'seed': 7}).check_hparams()
  outputs.RunDirectory(str(tmp_path), 'run', {'seed': 0}).check_hparams()


@pytest.mark.parametrize('text', ['garbage', '[1]'])
def test_damaged_hparams_name_the_file(tmp_path, text):
  _train(_run_dir(tmp_path), 2)
  path = tmp_path / 'run' / 'hparams.json'
  path.write_text(text)
  with pytest.raises(outputs.RunDirectoryError) as e:
    outputs.RunDirectory(str(tmp_path), 'run', {'seed': 0}).check_hparams()
  assert str(e.value).startswith(f'{path} is damaged')
  assert f'rm {path}' in str(e.value)


def test_checkpoints_without_a_manifest_are_refused(tmp_path):
  _train(_run_dir(tmp_path), 2)
  os.remove(tmp_path / 'run' / run_files.MANIFEST_NAME)
  run_dir = _run_dir(tmp_path)
  with pytest.raises(outputs.CheckpointError, match='manifest.json is missing'):
    run_dir.load_latest_checkpoint(_STRUCTURE)


def test_a_damaged_manifest_is_named(tmp_path):
  _train(_run_dir(tmp_path), 2)
  path = tmp_path / 'run' / run_files.MANIFEST_NAME
  path.write_text('{"format": 1}')
  with pytest.raises(outputs.RunDirectoryError) as e:
    _run_dir(tmp_path)
  assert str(e.value).startswith(f'{path} is damaged')


def test_the_manifest_records_the_code_of_each_kept_stretch_of_rounds(
    tmp_path, monkeypatch):
  revision = run_layout.code_revision()
  _train(_run_dir(tmp_path), 4)
  assert run_files.Manifest(str(tmp_path / 'run')).read().revisions() == [
      revision]
  # Resumed at round 4 by other code: both are named, in order.
  monkeypatch.setattr(run_layout, 'code_revision', lambda: 'git other')
  run_dir = _run_dir(tmp_path)
  assert run_dir.load_latest_checkpoint(_STRUCTURE)[1] == 4
  _train(run_dir, 6, start=4)
  assert run_files.Manifest(str(tmp_path / 'run')).read().revisions() == [
      revision, 'git other']
  manifest = run_files.Manifest(str(tmp_path / 'run')).read()
  assert [c['from_round'] for c in manifest.code] == [0, 4]
  # Each start records its environment too.
  environment = run_layout.environment()
  assert manifest.environments() == [environment]
  # A start whose rounds are recomputed is forgotten.
  manifest.start_code(2)
  assert manifest.code == [
      {'revision': revision, 'from_round': 0, 'environment': environment},
      {'revision': 'git other', 'from_round': 2,
       'environment': environment}]
  manifest.start_code(0)
  assert manifest.code == [{'revision': 'git other', 'from_round': 0,
                            'environment': environment}]


def test_the_environment_names_python_and_the_libraries_versions():
  environment = run_layout.environment()
  assert environment.startswith(f'Python {platform.python_version()}, ')
  for name, distribution in (('TFF', 'tensorflow-federated'),
                             ('NumPy', 'numpy')):
    assert f'{name} {importlib.metadata.version(distribution)}' in (
        environment)
  assert f'TensorFlow {tf.__version__}' in environment
  cpu = environment.split(', CPU ')[1]
  assert f'({platform.machine()}' in cpu
  if os.path.isfile('/proc/cpuinfo'):  # Linux: the model and widest ISA
    with open('/proc/cpuinfo') as f:
      cpuinfo = f.read()
    model = cpu.split(' (')[0]
    assert model != 'unknown' and f': {model}\n' in cpuinfo
    widest = cpu.rstrip(')').split(', ')[-1]
    assert f' {widest}' in cpuinfo and widest in run_layout._VECTOR_FLAGS


def test_revisions_in_order_without_repeats(tmp_path):
  manifest = run_files.Manifest(str(tmp_path))
  assert manifest.read().revisions() == [run_files.UNRECORDED]  # no file
  # A manifest written before runs recorded their code.
  (tmp_path / run_files.MANIFEST_NAME).write_text(json.dumps(
      {'format': run_files.FORMAT, 'hparams': {}, 'checkpoints': {}}))
  assert manifest.read().revisions() == [run_files.UNRECORDED]
  (tmp_path / run_files.MANIFEST_NAME).write_text(json.dumps(
      {'format': run_files.FORMAT, 'hparams': {}, 'checkpoints': {},
       'code': [{'revision': 'git a', 'from_round': 0},
                {'revision': 'git b', 'from_round': 10, 'environment': 'e1'},
                {'revision': 'git a', 'from_round': 20, 'environment': 'e2'},
                {'revision': 'git c', 'from_round': 30, 'environment': 'e1'}
                ]}))
  assert manifest.read().revisions() == ['git a', 'git b', 'git c']
  assert manifest.read().environments() == ['e1', 'e2']


def test_a_malformed_code_record_is_named(tmp_path):
  _train(_run_dir(tmp_path), 2)
  path = tmp_path / 'run' / run_files.MANIFEST_NAME
  manifest = json.loads(path.read_text())
  for malformed in ({'revision': 3},
                    {'revision': 'git a', 'from_round': 0, 'environment': 1}):
    manifest['code'] = [malformed]
    path.write_text(json.dumps(manifest))
    with pytest.raises(outputs.RunDirectoryError) as e:
      _run_dir(tmp_path)
    assert str(e.value).startswith(f'{path} is damaged')


# --- Client states ---

_FRESH = collections.OrderedDict(h=np.zeros(4, np.float32))


def _client_state(value):
  return collections.OrderedDict(h=np.full(4, value, np.float32))


def _store_with_commits(path):
  store = client_state_store.ClientStateStore(str(path), _FRESH,
                                              keep_commits=3)
  for r in (1, 2, 3, 4):
    store.save(['a', 'b'] if r % 2 else ['a'], [_client_state(r)] * (
        2 if r % 2 else 1), r)
    if r % 2 == 0:
      store.commit(r)
  return store


def test_a_flipped_client_state_is_refused_when_read_and_on_resume(tmp_path):
  _store_with_commits(tmp_path)
  path = tmp_path / 'client-a@00000004.state'
  raw = bytearray(path.read_bytes())
  raw[:4] = np.float32(9.0).tobytes()  # same size: only a checksum sees it
  path.write_bytes(bytes(raw))
  reopened = client_state_store.ClientStateStore(str(tmp_path), _FRESH,
                                                 keep_commits=3)
  assert reopened.problem_as_of(4) == (
      f'{path} is damaged (its sha256 differs from the one recorded when it'
      ' was written)')
  assert reopened.problem_as_of(2) is None  # client a's version 2 is intact
  with pytest.raises(client_state_store.ClientStateError, match='damaged'):
    reopened.load(['a'])
  np.testing.assert_array_equal(reopened.load(['b'])[0]['h'],
                                _client_state(3)['h'])


def test_missing_client_states_are_named(tmp_path):
  _store_with_commits(tmp_path)
  os.remove(tmp_path / 'client-b@00000003.state')
  store = client_state_store.ClientStateStore(str(tmp_path), _FRESH,
                                              keep_commits=3)
  assert store.problem_as_of(4) == (
      f'{tmp_path / "client-b@00000003.state"} is missing')
  assert store.problem_as_of(2) is None
  shutil.rmtree(tmp_path)
  store = client_state_store.ClientStateStore(str(tmp_path), _FRESH)
  assert 'MANIFEST.json is missing' in store.problem_as_of(4)
  assert store.problem_as_of(0) is None


@pytest.mark.parametrize('name', ['', '.', '..', '../x', 'a/b', '/abs',
                                  'two\nlines', 'tab\there', 'x' * 256])
def test_a_run_name_must_be_one_printable_directory_name(tmp_path, name):
  with pytest.raises(outputs.RunDirectoryError,
                     match=r'^--experiment_name='):
    outputs.RunDirectory(str(tmp_path / 'root'), name, {})
  assert not os.listdir(tmp_path)


def test_a_run_that_cannot_lock_leaves_no_directory_it_created(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  run_dir = outputs.RunDirectory(str(tmp_path / 'new' / 'deeper'), 'run', {})
  run_dir.lock()
  run_dir.unlock()  # wrote nothing: the directories it made are gone
  assert sorted(os.listdir(tmp_path)) == ['file']
  run_dir = outputs.RunDirectory(str(blocker / 'under_a_file'), 'run', {})
  with pytest.raises(outputs.RunDirectoryError, match='cannot write'):
    run_dir.lock()
  assert sorted(os.listdir(tmp_path)) == ['file']
