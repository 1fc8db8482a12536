"""Temporary directories that a killed process does not leave behind.

A process killed with SIGKILL (a sweep's timeout, the OOM killer, a test of
faults) runs no `atexit` handler, so its temporary directories stay: the
examples a fused process holds (`fl_engine.resident`) and a stateful
runner's client states (`fl_engine.stateful_runner`), hundreds of MB each. Each
directory made here holds a lock file that its process keeps locked
(`fcntl.flock`) while it lives; the kernel drops the lock when the process
ends, however it ends. Making a directory first removes its siblings of the
same prefix whose lock no process holds.

A lock, not a process id: processes in other PID namespaces (Bazel's
sandboxed tests) share the temporary directory, and their ids mean nothing
here (removing by id deleted live processes' files). A directory without a
lock file (one being made, or made by other code) is never removed.
"""

import fcntl
import glob
import os
import shutil
import tempfile
from typing import Optional

LOCK_NAME = '.owner.lock'


def _try_lock(path: str) -> Optional[int]:
  """A descriptor of `path` locked exclusively, or None if another process
  holds its lock (or it cannot be opened)."""
  try:
    fd = os.open(path, os.O_RDWR)
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    return None
  return fd


def remove_abandoned(prefix: str, parent: Optional[str] = None) -> list[str]:
  """Removes the directories `<parent>/<prefix>*` whose lock file no process
  holds; returns their paths."""
  parent = parent or tempfile.gettempdir()
  removed = []
  for directory in glob.glob(os.path.join(glob.escape(parent),
                                          glob.escape(prefix) + '*')):
    fd = _try_lock(os.path.join(directory, LOCK_NAME))
    if fd is None:
      continue
    try:  # Held while removing, so its maker (if any) waits (`make`).
      shutil.rmtree(directory, ignore_errors=True)
      removed.append(directory)
    finally:
      os.close(fd)
  return removed


class OwnedDirectory:
  """A new temporary directory that this process holds while it lives (the
  module docstring); `remove()` removes it.

  Args:
    prefix: The directory's name starts with it; siblings of the same prefix
      that no process holds are removed first.
    parent: Where it is made (default: the system's temporary directory).
  """

  def __init__(self, prefix: str, parent: Optional[str] = None):
    remove_abandoned(prefix, parent)
    while True:
      path = tempfile.mkdtemp(prefix=prefix, dir=parent)
      lock_path = os.path.join(path, LOCK_NAME)
      fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
      # Blocks only while another process's `remove_abandoned` found the
      # file unlocked between its creation and this line and removes it.
      fcntl.flock(fd, fcntl.LOCK_EX)
      try:
        same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)  # Removed under us: make another.
    self.path = path
    self._fd = fd

  def remove(self) -> None:
    """Removes the directory (idempotent)."""
    if self._fd is None:
      return
    shutil.rmtree(self.path, ignore_errors=True)
    os.close(self._fd)
    self._fd = None


def use_owned_temp_dir(prefix: str = 'fl_papers_tmp_') -> OwnedDirectory:
  """Makes this process' temporary files (TensorFlow's autograph sources,
  `tempfile`'s defaults) go to an `OwnedDirectory`, removed at exit and, after
  a `kill -9`, by the next process that calls this.

  Sets `tempfile.tempdir`: call it before TensorFlow converts functions.
  """
  import atexit  # pylint: disable=g-import-not-at-top
  directory = OwnedDirectory(prefix)
  tempfile.tempdir = directory.path
  atexit.register(directory.remove)
  return directory
