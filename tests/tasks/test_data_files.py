"""tasks.data_files: where TFF caches files; downloads through a loopback
mirror (first use, resume after a cut or `kill -9`, corrupt files, no
network); `python -m tasks.prepare_data`; the driver on a first run.

The mirror is an HTTP server on 127.0.0.1 serving files generated here in the
loaders' own format (an LZMA-compressed SQLite database in TFF's schema).
Nothing reaches beyond loopback.
"""

import collections
import contextlib
import lzma
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error

import numpy as np
import pytest
import tensorflow as tf
from fl_common.tff_private import sql_client_data_utils

from tasks import data_files
from tasks import errors
from tests import loopback_mirror
from tests import run_directories

_LOADER_CALL = 'tff.simulation.datasets.emnist.load_data(cache_dir=DIR)'


def test_tff_cached_path_is_the_file_in_data_dir_or_dot_tff(tmp_path):
  assert data_files.tff_cached_path('a.sqlite', str(tmp_path)) == str(
      tmp_path / 'a.sqlite'
  )
  assert data_files.tff_cached_path('a.sqlite', None) == os.path.join(
      os.path.expanduser('~'), '.tff', 'a.sqlite'
  )


def test_keras_cached_path_is_under_datasets(tmp_path):
  assert data_files.keras_cached_path('w.tar.bz2', str(tmp_path)) == str(
      tmp_path / 'datasets' / 'w.tar.bz2'
  )


def test_keras_cached_path_falls_back_to_tmp_when_not_writable(
    tmp_path, monkeypatch
):
  real_access = os.access
  monkeypatch.setattr(
      os,
      'access',
      lambda path, mode: False
      if path == str(tmp_path)
      else real_access(path, mode),
  )
  assert data_files.keras_cached_path('w.tar.bz2', str(tmp_path)) == (
      '/tmp/.keras/datasets/w.tar.bz2'
  )


def test_missing_file_raises_one_line_naming_it_and_writes_nothing(tmp_path):
  missing = str(tmp_path / 'emnist_all.sqlite')
  ran = []
  with pytest.raises(errors.MissingDataError) as raised:
    with data_files.require_cached_files('EMNIST', [missing], _LOADER_CALL):
      ran.append(True)
  message = str(raised.value)
  assert '\n' not in message
  assert missing in message
  assert _LOADER_CALL in message
  assert '--data_dir=DIR' in message and '--use_synthetic_data' in message
  assert not ran
  assert not os.listdir(tmp_path)


def test_tff_cached_file_is_looked_for_where_tff_caches_it(tmp_path):
  with pytest.raises(errors.MissingDataError) as raised:
    with data_files.require_tff_cached_file(
        'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL
    ):
      pass
  assert data_files.tff_cached_path(
      'emnist_all.sqlite', str(tmp_path)) in str(raised.value)
  _write_tff_sqlite(tmp_path / 'emnist_all.sqlite')
  with data_files.require_tff_cached_file(
      'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL
  ):
    result = 'loaded'
  assert result == 'loaded'


def test_only_missing_files_are_named(tmp_path):
  present = tmp_path / 'present.bin'
  present.write_text('')
  missing = str(tmp_path / 'missing.bin')
  with pytest.raises(errors.MissingDataError) as raised:
    with data_files.require_cached_files(
        'X', [str(present), missing], _LOADER_CALL
    ):
      pass
  assert missing in str(raised.value)
  assert str(present) not in str(raised.value)


def test_block_runs_when_files_exist(tmp_path):
  present = tmp_path / 'present.bin'
  present.write_text('')
  with data_files.require_cached_files('X', [str(present)], _LOADER_CALL):
    result = 'loaded'
  assert result == 'loaded'


def _url_error_download_failure():
  raise urllib.error.URLError('no network')


def _keras_style_download_failure():
  """Fails like Keras' get_file: an Exception in the context of a URLError."""
  try:
    raise urllib.error.URLError('no network')
  except urllib.error.URLError as url_error:
    # pylint: disable-next=broad-exception-raised
    raise Exception(f'URL fetch failure: {url_error}')


@pytest.mark.parametrize(
    'failing_download',
    [_url_error_download_failure, _keras_style_download_failure],
    ids=['urlerror', 'keras_wrapped_urlerror'],
)
def test_download_failure_becomes_missing_data_error(
    tmp_path, failing_download
):
  present = tmp_path / 'present.tar.bz2'
  present.write_text('')
  with pytest.raises(errors.MissingDataError) as raised:
    with data_files.require_cached_files('X', [str(present)], _LOADER_CALL):
      failing_download()
  assert '\n' not in str(raised.value)
  assert str(present) in str(raised.value)


def test_other_errors_pass_through(tmp_path):
  present = tmp_path / 'present.bin'
  present.write_text('')
  with pytest.raises(KeyError):
    with data_files.require_cached_files('X', [str(present)], _LOADER_CALL):
      raise KeyError('not a download problem')


# --- Files in the loaders' own format ---


def _write_tff_sqlite(path, num_train_clients=6, num_test_clients=2):
  """An EMNIST-62 database in TFF's schema: splits all_train and all_test."""
  rng = np.random.default_rng(0)
  ids = ([f'train_{i}' for i in range(num_train_clients)] +
         [f'test_{i}' for i in range(num_test_clients)])

  def dataset_fn(client_id):
    n = 4 + sum(map(ord, client_id)) % 5
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        label=rng.integers(0, 62, n).astype(np.int64),
        pixels=rng.random((n, 28, 28)).astype(np.float32)))

  sql_client_data_utils.save_to_sql_client_data(
      ids, dataset_fn, str(path), allow_overwrite=True,
      split_names_by_client_id={
          i: 'all_train' if i.startswith('train') else 'all_test'
          for i in ids})


@pytest.fixture
def mirror(tmp_path, monkeypatch):
  """`(base URL, served directory, handler class)`, downloads enabled."""
  served = tmp_path / 'served'
  served.mkdir()
  database = tmp_path / 'emnist_all.sqlite'
  _write_tff_sqlite(database)
  (served / 'emnist_all.sqlite.lzma').write_bytes(
      lzma.compress(database.read_bytes()))
  with loopback_mirror.serve(served) as (url, handler):
    monkeypatch.setenv(data_files.MIRROR_ENV, url)
    monkeypatch.setenv(data_files.OFFLINE_ENV, '0')
    yield url, served, handler, database.read_bytes()


def _require(data_dir):
  path = data_files.tff_cached_path('emnist_all.sqlite', str(data_dir))
  with data_files.require_cached_files('EMNIST', [path], _LOADER_CALL):
    pass
  return path


def test_first_use_downloads_then_the_cache_is_used(mirror, tmp_path):
  _, _, handler, original = mirror
  path = _require(tmp_path / 'data')
  with open(path, 'rb') as f:
    assert f.read() == original
  assert len(handler.requests) == 1
  _require(tmp_path / 'data')
  assert len(handler.requests) == 1  # no network the second time
  assert sorted(os.listdir(tmp_path / 'data')) == ['emnist_all.sqlite']


def test_a_cut_download_leaves_nothing_usable_and_the_rerun_resumes(
    mirror, tmp_path):
  _, _, handler, original = mirror
  handler.cut_after = 1000
  with pytest.raises(errors.MissingDataError) as raised:
    _require(tmp_path / 'data')
  assert 'cut short at 1000 of' in str(raised.value)
  assert '\n' not in str(raised.value)
  assert os.listdir(tmp_path / 'data') == ['emnist_all.sqlite.lzma.part']
  handler.cut_after = None
  path = _require(tmp_path / 'data')
  assert handler.requests[-1][1] == 'bytes=1000-'  # resumed, not restarted
  with open(path, 'rb') as f:
    assert f.read() == original
  assert os.listdir(tmp_path / 'data') == ['emnist_all.sqlite']


def test_kill_9_during_a_download_then_the_rerun_succeeds(mirror, tmp_path):
  url, _, handler, original = mirror
  handler.delay = 0.2  # a slow mirror (seconds a 4 KiB): killed midway
  data_dir = tmp_path / 'data'
  script = (
      'from tasks import data_files\n'
      f'p = data_files.tff_cached_path("emnist_all.sqlite", {str(data_dir)!r})\n'
      'with data_files.require_cached_files("EMNIST", [p], "call"):\n'
      '  pass\n')
  child = subprocess.Popen([sys.executable, '-c', script],
                           cwd=run_directories.REPO,
                           env={**os.environ, data_files.MIRROR_ENV: url,
                                data_files.OFFLINE_ENV: '0'})
  part = data_dir / 'emnist_all.sqlite.lzma.part'
  deadline = time.monotonic() + 120
  while not (part.exists() and part.stat().st_size > 0):
    assert time.monotonic() < deadline and child.poll() is None
    time.sleep(0.01)
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert not (data_dir / 'emnist_all.sqlite').exists()
  handler.delay = 0.0
  path = _require(data_dir)
  assert handler.requests[-1][1].startswith('bytes=')  # resumed the .part
  with open(path, 'rb') as f:
    assert f.read() == original


@pytest.mark.parametrize('damage', ['empty', 'garbage', 'truncated'])
def test_a_corrupt_cached_file_is_one_line_and_never_loaded(tmp_path, damage):
  path = tmp_path / 'emnist_all.sqlite'
  _write_tff_sqlite(path)
  whole = path.read_bytes()
  path.write_bytes({'empty': b'', 'garbage': b'x' * 5000,
                    'truncated': whole[:len(whole) // 2]}[damage])
  ran = []
  with pytest.raises(data_files.CorruptDataError) as raised:
    with data_files.require_tff_cached_file(
        'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL):
      ran.append(True)
  assert not ran
  message = str(raised.value)
  assert '\n' not in message and str(path) in message and 'delete it' in message


def test_tffs_tables_with_other_columns_are_one_line(tmp_path):
  path = tmp_path / 'emnist_all.sqlite'
  with contextlib.closing(sqlite3.connect(str(path))) as connection:
    connection.execute('CREATE TABLE examples (client_id TEXT, x BLOB)')
    connection.execute('CREATE TABLE client_metadata (client_id TEXT)')
    connection.commit()
  with pytest.raises(data_files.CorruptDataError) as raised:
    with data_files.require_tff_cached_file(
        'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL):
      pass
  assert str(raised.value).startswith(
      f'{path} is not a complete copy of the data (no column'
      ' serialized_example_proto, split_name in table examples)')


def test_a_mirror_serving_garbage_leaves_nothing(mirror, tmp_path):
  _, served, _, _ = mirror
  (served / 'emnist_all.sqlite.lzma').write_bytes(lzma.compress(b'not sql'))
  with pytest.raises(data_files.CorruptDataError, match='is not the data'):
    _require(tmp_path / 'data')
  assert not os.listdir(tmp_path / 'data')


def test_no_network_is_todays_one_line_error_and_writes_nothing(
    tmp_path, monkeypatch):
  # A loopback port nobody listens on.
  monkeypatch.setenv(data_files.MIRROR_ENV, 'http://127.0.0.1:9')
  monkeypatch.setenv(data_files.OFFLINE_ENV, '0')
  with pytest.raises(errors.MissingDataError) as raised:
    _require(tmp_path / 'data')
  message = str(raised.value)
  assert 'could not be downloaded' in message and '\n' not in message
  assert 'prepare_data' in message
  assert not (tmp_path / 'data').exists()


def test_prepare_data_fetches_and_prints_where(mirror, tmp_path):
  url, _, _, original = mirror
  result = subprocess.run(
      [sys.executable, '-m', 'tasks.prepare_data', '--task=emnist',
       f'--data_dir={tmp_path / "d"}'], capture_output=True, text=True,
      cwd=run_directories.REPO, timeout=300,
      env={**os.environ, data_files.MIRROR_ENV: url,
           data_files.OFFLINE_ENV: '0'})
  assert result.returncode == 0, result.stderr[-2000:]
  assert str(tmp_path / 'd' / 'emnist_all.sqlite') in result.stdout
  assert (tmp_path / 'd' / 'emnist_all.sqlite').read_bytes() == original
  offline = subprocess.run(
      [sys.executable, '-m', 'tasks.prepare_data', '--task=shakespeare',
       f'--data_dir={tmp_path / "e"}'], capture_output=True, text=True,
      cwd=run_directories.REPO, timeout=300,
      env={**os.environ, data_files.OFFLINE_ENV: '1'})
  assert offline.returncode == 2
  assert offline.stderr.startswith('error: Shakespeare data not found')
  assert len(offline.stderr.strip().splitlines()) == 1


def test_the_driver_downloads_on_first_use_and_trains(mirror, tmp_path):
  url, _, handler, _ = mirror
  env = {**os.environ, data_files.MIRROR_ENV: url, data_files.OFFLINE_ENV: '0'}
  args = ['--task=emnist', f'--data_dir={tmp_path / "data"}',
          '--total_rounds=1', '--clients_per_round=2', '--rounds_per_eval=1',
          '--validation_fraction=0.4', f'--root_output_dir={tmp_path / "runs"}',
          '--experiment_name=e']
  run_directories.run_driver(*args, env=env)
  assert len(handler.requests) == 1
  metrics = run_directories.read_metrics(str(tmp_path / 'runs' / 'e'))
  assert list(metrics['round']) == [1]
  run_directories.run_driver(*args, '--total_rounds=2', '--offline', env=env)
  assert len(handler.requests) == 1
