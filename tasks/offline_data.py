"""Checks that TFF's cached dataset files exist before a loader can download.

TFF's loaders (`tff.simulation.datasets.<name>.load_data(cache_dir=...)`)
download on a cache miss, and they write before they can fail:
`download.get_compressed_file` creates `cache_dir` before fetching, and a
download cut short leaves a truncated `<name>.sqlite` that the next run takes
for the data. The task builders
therefore ask this module where the loader would look and run the loader
inside `require_cached_files`, which raises `MissingDataError` (one line:
which file, how to get it) when a file is absent, before the loader runs.

Paths mirror TFF 0.87 and Keras 2.14:
* `download.get_compressed_file(origin, cache_dir)` keeps `<cache_dir>/<f>`
  for an origin `.../<f>.lzma` (`cache_dir` defaults to `~/.tff`);
* `tf.keras.utils.get_file(fname, cache_dir=...)` keeps
  `<cache_dir>/datasets/<fname>` (`cache_dir` defaults to `~/.keras`, and to
  `/tmp/.keras` when `cache_dir` is not writable).
"""

import contextlib
import os
import urllib.error
from collections.abc import Iterator, Sequence
from typing import Optional

from tasks import errors

_TFF_DEFAULT_CACHE_DIR = os.path.join('~', '.tff')
_KERAS_DEFAULT_CACHE_DIR = os.path.join('~', '.keras')
_KERAS_UNWRITABLE_CACHE_DIR = os.path.join('/tmp', '.keras')
_KERAS_CACHE_SUBDIR = 'datasets'


def tff_cached_path(filename: str, data_dir: Optional[str]) -> str:
  """Where TFF's `get_compressed_file` keeps the decompressed `filename`."""
  return os.path.join(
      os.path.expanduser(data_dir or _TFF_DEFAULT_CACHE_DIR), filename
  )


def keras_cached_path(filename: str, data_dir: Optional[str]) -> str:
  """Where `tf.keras.utils.get_file(filename, cache_dir=data_dir)` keeps it."""
  base_dir = os.path.expanduser(data_dir or _KERAS_DEFAULT_CACHE_DIR)
  if not os.access(base_dir, os.W_OK):
    base_dir = _KERAS_UNWRITABLE_CACHE_DIR
  return os.path.join(base_dir, _KERAS_CACHE_SUBDIR, filename)


def _missing_data_message(
    dataset_name: str, problem: str, paths: Sequence[str], loader_calls: str
) -> str:
  return (
      f'{dataset_name} data {problem}: {", ".join(paths)}. On a networked'
      f' machine run {loader_calls}, copy DIR here and pass --data_dir=DIR'
      ' (data_dir=DIR); or use --use_synthetic_data.'
  )


def _is_download_error(error: BaseException) -> bool:
  # Keras' get_file re-raises a URLError as a bare `Exception` whose context
  # is the URLError.
  return isinstance(error, urllib.error.URLError) or isinstance(
      error.__context__, urllib.error.URLError
  )


@contextlib.contextmanager
def require_cached_files(
    dataset_name: str, paths: Sequence[str], loader_calls: str
) -> Iterator[None]:
  """Runs a TFF loader only if its cached files exist, and never downloads.

  On entry, raises `MissingDataError` naming every path in `paths` that is
  not a file, before the loader can write anything. Inside the block, a
  failed download (a loader still tries the network when a file is there but
  invalid, e.g. Keras re-downloads a file whose hash does not match) becomes
  a `MissingDataError` too.

  Args:
    dataset_name: The dataset's name, for the message (e.g. 'EMNIST').
    paths: The files the loader inside the block reads from its cache.
    loader_calls: The TFF call(s) that download the files, with the cache
      directory written as `DIR`, for the message.

  Yields:
    Nothing; the block runs the loader.

  Raises:
    MissingDataError: A file is missing or could not be downloaded.
  """
  missing_paths = [path for path in paths if not os.path.isfile(path)]
  if missing_paths:
    raise errors.MissingDataError(
        _missing_data_message(
            dataset_name, 'not found', missing_paths, loader_calls
        )
    )
  try:
    yield
  except Exception as error:  # pylint: disable=broad-exception-caught
    if not _is_download_error(error):
      raise
    raise errors.MissingDataError(
        _missing_data_message(
            dataset_name, 'could not be downloaded', paths, loader_calls
        )
    ) from error


def require_tff_cached_file(
    dataset_name: str,
    filename: str,
    data_dir: Optional[str],
    loader_call: str,
) -> contextlib.AbstractContextManager[None]:
  """`require_cached_files` for the one file a TFF `load_data` reads.

  Args:
    dataset_name: The dataset's name, for the message.
    filename: The decompressed file TFF caches (e.g. 'emnist_all.sqlite').
    data_dir: TFF's `cache_dir`; `None`: TFF's default, `~/.tff`.
    loader_call: The TFF call that downloads the file, with the cache
      directory written as `DIR`, for the message.
  """
  return require_cached_files(
      dataset_name, [tff_cached_path(filename, data_dir)], loader_call
  )
