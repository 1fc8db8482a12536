"""Temporary directories held by their process (`fl_engine.scratch`)."""

import os
import signal
import subprocess
import sys
import textwrap

from fl_engine import scratch
import tests

_PREFIX = 'scratch_test_'


def _owner_process(parent: str) -> tuple[subprocess.Popen, str]:
  """A Python process that makes an `OwnedDirectory` in `parent`, prints
  its path and sleeps."""
  code = textwrap.dedent(f"""
      import sys, time
      from fl_engine import scratch
      owned = scratch.OwnedDirectory({_PREFIX!r}, {parent!r})
      print(owned.path, flush=True)
      time.sleep(600)
  """)
  process = subprocess.Popen(
      [sys.executable, '-c', code], stdout=subprocess.PIPE, text=True,
      cwd=tests.REPO)
  return process, process.stdout.readline().strip()


def test_a_killed_processs_directory_is_removed_a_live_ones_kept(tmp_path):
  parent = str(tmp_path)
  live, live_path = _owner_process(parent)
  killed, killed_path = _owner_process(parent)
  try:
    assert os.path.isdir(live_path) and os.path.isdir(killed_path)
    assert scratch.remove_abandoned(_PREFIX, parent) == []
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert os.path.isdir(killed_path)  # No exit handler ran.
    # Making a directory removes the killed process's, not the live one's.
    mine = scratch.OwnedDirectory(_PREFIX, parent)
    assert not os.path.exists(killed_path)
    assert os.path.isdir(live_path) and os.path.isdir(mine.path)
  finally:
    for process in (live, killed):
      process.kill()
      process.wait()
      process.stdout.close()
  mine.remove()
  assert not os.path.exists(mine.path)
  mine.remove()  # Idempotent.


def test_this_processs_directories_and_unlocked_others_are_kept(tmp_path):
  parent = str(tmp_path)
  first = scratch.OwnedDirectory(_PREFIX, parent)
  second = scratch.OwnedDirectory(_PREFIX, parent)
  # No lock file: being made, or not made by this module.
  foreign = tmp_path / f'{_PREFIX}foreign'
  foreign.mkdir()
  other_prefix = tmp_path / 'other_abandoned'
  other_prefix.mkdir()
  (other_prefix / scratch.LOCK_NAME).touch()
  assert scratch.remove_abandoned(_PREFIX, parent) == []
  assert os.path.isdir(first.path) and os.path.isdir(second.path)
  assert foreign.is_dir()
  first.remove()
  second.remove()
  # A lock file nobody holds under the prefix: abandoned.
  abandoned = tmp_path / f'{_PREFIX}abandoned'
  abandoned.mkdir()
  (abandoned / scratch.LOCK_NAME).touch()
  assert scratch.remove_abandoned(_PREFIX, parent) == [str(abandoned)]
  assert foreign.is_dir() and other_prefix.is_dir()
