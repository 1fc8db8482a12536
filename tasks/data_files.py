"""The TFF datasets' files: fetched on first use, atomically and checked.

TFF's loaders (`tff.simulation.datasets.<name>.load_data(cache_dir=...)`)
download on a cache miss, but a download cut short leaves a truncated
`<name>.sqlite` that the next run takes for the data. The task builders
therefore run the loader inside `require_cached_files`, which first makes
sure every file the loader reads is complete:

* a file that is there is checked (a SQLite database must be whole and hold
  TFF's tables; a truncated, empty or foreign file is one `MissingDataError`
  line saying to delete it);
* a missing file is downloaded (unless offline, see `configure`) from
  `<base URL>/<file>[.lzma]` to `<file>.part` beside its target, resumed with
  an HTTP range request when a `.part` is already there, with a progress bar
  (bytes, rate, ETA) on a terminal; then decompressed to a temporary name,
  checked (size, SQLite structure, or the sha256 TFF records), and renamed
  into place. Whatever moment a download is killed at, nothing a later run
  takes for data is left: at most a `.part` that the next run resumes.
* no network (or offline) gives one line naming the missing file and how to
  get it, and writes nothing.

The base URL is TFF's bucket; `FL_PAPERS_DATA_MIRROR` (or
`configure(base_url=...)`) replaces it, e.g. with a mirror behind a proxy or
the tests' loopback server; it also serves the TFDS datasets' source
archives by file name (`source_url`, `tasks.centralized_images`).
`FL_PAPERS_OFFLINE=1` (or `--offline`) never
uses the network. `python -m tasks.prepare_data` fetches a task's files
without training.

Why one module: downloading, resuming, checking and naming the cached files
are one protocol (a `.part` file, its digest or SQLite check, the rename);
the TFDS datasets' preparation, which uses it, is in `centralized_images`.

Paths mirror TFF 0.87 and Keras 2 (tf_keras 2.21):
* `download.get_compressed_file(origin, cache_dir)` keeps `<cache_dir>/<f>`
  for an origin `.../<f>.lzma` (`cache_dir` defaults to `~/.tff`);
* `tf.keras.utils.get_file(fname, cache_dir=...)` keeps
  `<cache_dir>/datasets/<fname>` (`cache_dir` defaults to `~/.keras`, and to
  `/tmp/.keras` when `cache_dir` is not writable).
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import lzma
import os
import sqlite3
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Optional

import tqdm

from tasks import errors

DEFAULT_BASE_URL = 'https://storage.googleapis.com/tff-datasets-public'
MIRROR_ENV = 'FL_PAPERS_DATA_MIRROR'
OFFLINE_ENV = 'FL_PAPERS_OFFLINE'
_CHUNK_BYTES = 1 << 20
_TIMEOUT_SECONDS = 60
_SQLITE_MAGIC = b'SQLite format 3\x00'
# TFF's `SqlClientData` reads these tables.
_TFF_TABLES = frozenset({'examples', 'client_metadata'})
# And these columns of `examples` (TFF's `sql_client_data` checks them too,
# raising its own `DatabaseFormatError`).
_TFF_EXAMPLES_COLUMNS = frozenset(
    {'split_name', 'client_id', 'serialized_example_proto'})


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  """A file a TFF loader caches, as it is published.

  Attributes:
    remote_name: Its name under the base URL.
    lzma: Whether it is published LZMA-compressed (TFF's `.sqlite.lzma`).
    sha256: The digest of the cached file, where TFF records one.
  """

  remote_name: str
  lzma: bool
  sha256: Optional[str] = None


# The files TFF 0.87's loaders cache, by cached file name.
REMOTE_FILES = {
    **{name: RemoteFile(name + '.lzma', lzma=True) for name in (
        'emnist_all.sqlite', 'shakespeare.sqlite', 'stackoverflow.sqlite',
        'cifar100.sqlite')},
    'stackoverflow.word_count.tar.bz2': RemoteFile(
        'stackoverflow.word_count.tar.bz2', lzma=False,
        sha256='1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c'
               '519c'),
}


@dataclasses.dataclass
class _Options:
  base_url: Optional[str] = None
  offline: Optional[bool] = None
  progress: bool = True


_options = _Options()


def configure(*, base_url: Optional[str] = None,
              offline: Optional[bool] = None, progress: bool = True) -> None:
  """Sets how missing files are fetched (the driver's `--offline`,
  `--noprogress`); `None` leaves the environment's setting."""
  _options.base_url = base_url
  _options.offline = offline
  _options.progress = progress


def mirror() -> Optional[str]:
  """The mirror's base URL (`configure`, then `$FL_PAPERS_DATA_MIRROR`)."""
  url = _options.base_url or os.environ.get(MIRROR_ENV)
  return url.rstrip('/') if url else None


def base_url() -> str:
  """Where TFF's files are fetched from: the mirror, or TFF's bucket."""
  return mirror() or DEFAULT_BASE_URL


def source_url(origin: str, filename: str) -> str:
  """Where a file published at `origin` is fetched from: `<mirror>/<filename>`
  when a mirror is set (one flat directory holds every dataset's files)."""
  url = mirror()
  return f'{url}/{filename}' if url else origin


def show_progress() -> bool:
  """Whether to draw progress bars: asked for, and stderr is a terminal."""
  return _options.progress and sys.stderr.isatty()


def is_offline() -> bool:
  if _options.offline is not None:
    return _options.offline
  return os.environ.get(OFFLINE_ENV, '') not in ('', '0', 'false')

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
      f'{dataset_name} data {problem}: {", ".join(paths)}. Rerun with network'
      f' (or a mirror in ${MIRROR_ENV}), or on a networked machine run'
      ' `python -m tasks.prepare_data --task=TASK --data_dir=DIR` (or'
      f' {loader_calls}), copy DIR here and pass --data_dir=DIR; or use'
      ' --use_synthetic_data.'
  )


def _is_download_error(error: BaseException) -> bool:
  # Keras' get_file re-raises a URLError as a bare `Exception` whose context
  # is the URLError.
  return isinstance(error, urllib.error.URLError) or isinstance(
      error.__context__, urllib.error.URLError
  )


class CorruptDataError(errors.MissingDataError):
  """A cached data file is there but not whole (or not the data)."""


def check_file(path: str, name: Optional[str] = None) -> None:
  """Raises `CorruptDataError` unless the cached file at `path` is whole.

  `name`: the cached file's name, when `path` is a temporary one.

  A SQLite database must start with SQLite's header, be as long as the
  header says (a cut download is shorter) and hold TFF's tables; a file with
  a recorded digest must match it. Other files are not checked.
  """
  name = name or os.path.basename(path)
  problem = None
  remote = REMOTE_FILES.get(name)
  if name.endswith('.sqlite'):
    problem = _sqlite_problem(path)
  elif remote is not None and remote.sha256 is not None:
    if _sha256(path) != remote.sha256:
      problem = 'its sha256 is not the published one'
  if problem:
    raise CorruptDataError(
        f'{path} is not a complete copy of the data ({problem}); delete it'
        ' and rerun to download it again')


def _sqlite_problem(path: str) -> Optional[str]:
  with open(path, 'rb') as f:
    header = f.read(100)
  if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
    return 'not a SQLite database'
  page_size = int.from_bytes(header[16:18], 'big')
  page_size = 65536 if page_size == 1 else page_size
  page_count = int.from_bytes(header[28:32], 'big')
  # The header's page count is valid when its version matches the change
  # counter (SQLite >= 3.7.0 writes both).
  if (page_count and header[24:28] == header[92:96] and
      os.path.getsize(path) < page_size * page_count):
    return (f'truncated: {os.path.getsize(path)} of'
            f' {page_size * page_count} bytes')
  try:
    with contextlib.closing(sqlite3.connect(
        f'file:{path}?mode=ro', uri=True)) as connection:
      tables = {row[0] for row in connection.execute(
          "SELECT name FROM sqlite_master WHERE type='table'")}
      columns = {row[1] for row in connection.execute(
          'PRAGMA table_info(examples)')}
  except sqlite3.DatabaseError as e:
    return f'unreadable: {e}'
  missing = _TFF_TABLES - tables
  if missing:
    return f'no table {", ".join(sorted(missing))}'
  missing = _TFF_EXAMPLES_COLUMNS - columns
  if missing:
    return f'no column {", ".join(sorted(missing))} in table examples'
  return None


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(_CHUNK_BYTES), b''):
      digest.update(chunk)
  return digest.hexdigest()


class DownloadError(Exception):
  """A download failed; the message says how."""


def published_file_problem(path: str, size: int, sha256: str) -> Optional[str]:
  """Why the file at `path` is not the one published with `size` and
  `sha256` (None if it is)."""
  actual = os.path.getsize(path)
  if actual != size:
    return f'{actual} bytes, not the published {size}'
  if _sha256(path) != sha256:
    return 'its sha256 is not the published one'
  return None


def fetch_published_file(url: str, path: str, *, size: int,
                         sha256: str) -> None:
  """Downloads `url` to `path` through `<path>.part` (resumed after an
  interruption), checks its size and sha256, then renames it into place.

  Raises:
    DownloadError: The server could not be reached or the transfer broke
      (the `.part` file is kept for the next run to resume).
    CorruptDataError: The downloaded file is not the published one (the
      `.part` file is deleted).
  """
  part = path + '.part'
  # Runs started side by side (a sweep's two lanes) share the data
  # directory: one downloads while the other waits, then finds the file.
  with _exclusive(path):
    if os.path.isfile(path) and not published_file_problem(path, size,
                                                           sha256):
      return
    _download(url, part)
    problem = published_file_problem(part, size, sha256)
    if problem:
      os.remove(part)
      raise CorruptDataError(
          f'the download of {url} is not the published file ({problem});'
          ' rerun to download it again, or check the mirror')
    os.replace(part, path)


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
  """Holds an exclusive lock on `path`'s directory (other processes' and
  threads' downloads into it wait; no lock file is left behind)."""
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  fd = os.open(directory, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the lock


def fetch(path: str) -> None:
  """Downloads the file cached at `path` (see the module docstring).

  Raises:
    DownloadError: The server could not be reached or the transfer broke
      (the `.part` file is kept for the next run to resume).
    CorruptDataError: The downloaded file is not whole.
  """
  name = os.path.basename(path)
  remote = REMOTE_FILES[name]
  url = f'{base_url()}/{remote.remote_name}'
  directory = os.path.dirname(path)
  part = path + ('.lzma' if remote.lzma else '') + '.part'
  _download(url, part)
  fd, temporary = tempfile.mkstemp(dir=directory, prefix=f'.{name}.tmp-')
  try:
    with os.fdopen(fd, 'wb') as out, open(part, 'rb') as source:
      if remote.lzma:
        decompressor = lzma.LZMADecompressor()
        try:
          for chunk in iter(lambda: source.read(_CHUNK_BYTES), b''):
            out.write(decompressor.decompress(chunk))
        except lzma.LZMAError as e:
          os.remove(part)
          raise CorruptDataError(
              f'{url} did not hold LZMA data ({e}); rerun to download it'
              ' again, or check the mirror') from e
        if not decompressor.eof:
          os.remove(part)
          raise CorruptDataError(
              f'{url} ended before its LZMA stream did; rerun to download'
              ' it again, or check the mirror')
      else:
        for chunk in iter(lambda: source.read(_CHUNK_BYTES), b''):
          out.write(chunk)
    try:
      check_file(temporary, name)
    except CorruptDataError as e:
      os.remove(part)
      raise CorruptDataError(
          f'the download of {url} is not the data: {e}') from e
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    os.remove(part)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def _download(url: str, part: str) -> None:
  """Downloads `url` to `part`, resuming what a `.part` already holds."""
  have = os.path.getsize(part) if os.path.exists(part) else 0
  request = urllib.request.Request(url)
  if have:
    request.add_header('Range', f'bytes={have}-')
  try:
    with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS) as response:
      if have and response.status != 206:
        have = 0  # the server ignored the range: start over
      length = response.headers.get('Content-Length')
      total = have + int(length) if length is not None else None
      # Only now, with the server answering, is anything written.
      os.makedirs(os.path.dirname(part) or '.', exist_ok=True)
      with open(part, 'ab' if have else 'wb') as out, tqdm.tqdm(
          total=total, initial=have, unit='B', unit_scale=True,
          unit_divisor=1024, desc=f'downloading {os.path.basename(url)}',
          file=sys.stderr, leave=False,
          disable=not show_progress()) as bar:
        # read1: what has arrived, so the progress bar and the .part move.
        for chunk in iter(lambda: response.read1(_CHUNK_BYTES), b''):
          out.write(chunk)
          bar.update(len(chunk))
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:  # the part already holds the whole file
      return
    raise DownloadError(f'{url}: HTTP {e.code} {e.reason}') from e
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    reason = getattr(e, 'reason', None) or e
    raise DownloadError(f'{url}: {reason}') from e
  if total is not None and os.path.getsize(part) < total:
    raise DownloadError(
        f'{url}: cut short at {os.path.getsize(part)} of {total} bytes')


@contextlib.contextmanager
def require_cached_files(
    dataset_name: str, paths: Sequence[str], loader_calls: str
) -> Iterator[None]:
  """Runs a TFF loader once every file it reads is there and whole.

  On entry, checks each file in `paths` that exists (`check_file`) and
  downloads each one that does not (`fetch`), unless offline; then the block
  runs the loader, which finds them in its cache. A failed download inside
  the block (Keras re-downloads a file whose hash does not match) becomes a
  `MissingDataError` too.

  Args:
    dataset_name: The dataset's name, for the message (e.g. 'EMNIST').
    paths: The files the loader inside the block reads from its cache.
    loader_calls: The TFF call(s) that download the files, with the cache
      directory written as `DIR`, for the message.

  Yields:
    Nothing; the block runs the loader.

  Raises:
    MissingDataError: A file is missing and cannot be downloaded, or is not
      whole (`CorruptDataError`).
  """
  for path in paths:
    if os.path.isfile(path):
      check_file(path)
  missing_paths = [path for path in paths if not os.path.isfile(path)]
  if missing_paths and (is_offline() or any(
      os.path.basename(p) not in REMOTE_FILES for p in missing_paths)):
    raise errors.MissingDataError(
        _missing_data_message(
            dataset_name, 'not found', missing_paths, loader_calls
        )
    )
  for path in missing_paths:
    try:
      fetch(path)
    except DownloadError as e:
      raise errors.MissingDataError(
          _missing_data_message(
              dataset_name, f'could not be downloaded ({e})', [path],
              loader_calls)) from e
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
