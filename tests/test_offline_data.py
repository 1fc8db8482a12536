"""tasks.offline_data: where TFF caches files, and no download ever starts."""

import os
import urllib.error

import pytest

from tasks import errors
from tasks import offline_data

_LOADER_CALL = 'tff.simulation.datasets.emnist.load_data(cache_dir=DIR)'


def test_tff_cached_path_is_the_file_in_data_dir_or_dot_tff(tmp_path):
  assert offline_data.tff_cached_path('a.sqlite', str(tmp_path)) == str(
      tmp_path / 'a.sqlite'
  )
  assert offline_data.tff_cached_path('a.sqlite', None) == os.path.join(
      os.path.expanduser('~'), '.tff', 'a.sqlite'
  )


def test_keras_cached_path_is_under_datasets(tmp_path):
  assert offline_data.keras_cached_path('w.tar.bz2', str(tmp_path)) == str(
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
  assert offline_data.keras_cached_path('w.tar.bz2', str(tmp_path)) == (
      '/tmp/.keras/datasets/w.tar.bz2'
  )


def test_missing_file_raises_one_line_naming_it_and_writes_nothing(tmp_path):
  missing = str(tmp_path / 'emnist_all.sqlite')
  ran = []
  with pytest.raises(errors.MissingDataError) as raised:
    with offline_data.require_cached_files('EMNIST', [missing], _LOADER_CALL):
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
    with offline_data.require_tff_cached_file(
        'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL
    ):
      pass
  assert offline_data.tff_cached_path(
      'emnist_all.sqlite', str(tmp_path)) in str(raised.value)
  (tmp_path / 'emnist_all.sqlite').write_text('')
  with offline_data.require_tff_cached_file(
      'EMNIST', 'emnist_all.sqlite', str(tmp_path), _LOADER_CALL
  ):
    result = 'loaded'
  assert result == 'loaded'


def test_only_missing_files_are_named(tmp_path):
  present = tmp_path / 'present.sqlite'
  present.write_text('')
  missing = str(tmp_path / 'missing.sqlite')
  with pytest.raises(errors.MissingDataError) as raised:
    with offline_data.require_cached_files(
        'X', [str(present), missing], _LOADER_CALL
    ):
      pass
  assert missing in str(raised.value)
  assert str(present) not in str(raised.value)


def test_block_runs_when_files_exist(tmp_path):
  present = tmp_path / 'present.sqlite'
  present.write_text('')
  with offline_data.require_cached_files('X', [str(present)], _LOADER_CALL):
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
    with offline_data.require_cached_files('X', [str(present)], _LOADER_CALL):
      failing_download()
  assert '\n' not in str(raised.value)
  assert str(present) in str(raised.value)


def test_other_errors_pass_through(tmp_path):
  present = tmp_path / 'present.sqlite'
  present.write_text('')
  with pytest.raises(KeyError):
    with offline_data.require_cached_files('X', [str(present)], _LOADER_CALL):
      raise KeyError('not a download problem')
