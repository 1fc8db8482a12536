"""Release managers for a run's per-round metrics: CSV and TensorBoard.

Both implement TFF's `tff.program.ReleaseManager` and write what TFF's
`CSVFileReleaseManager` and `TensorBoardReleaseManager` write, at a fraction
of their cost per round, which for a small model was as long as the round
itself (each class says where TFF's cost is). `experiment_driver.outputs`
owns the run directory they write in.
"""

import csv
import io
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
from tensorboard import summary as tb_summary
import tensorflow_federated as tff

from fl_common import run_layout

_ROUND = run_layout.ROUND_COLUMN

# Temporary files' prefix: `outputs` removes those an interrupted write left.
TEMP_PREFIX = '.tmp-'


class CsvWithoutRoundError(ValueError):
  """A metrics CSV that has rows but no `round` column."""


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def write_atomically(path: str, text: str) -> None:
  """Writes `path` via a temporary file and a rename, with the mode a plain
  `open` would give it (not `tempfile`'s 0600)."""
  directory = os.path.dirname(path)
  with tempfile.NamedTemporaryFile('w', dir=directory, delete=False,
                                   prefix=TEMP_PREFIX) as f:
    f.write(text)
  os.chmod(f.name, 0o666 & ~_umask())
  os.replace(f.name, path)


class TensorBoardScalars(tff.program.ReleaseManager):
  """A release manager writing a flat mapping of scalars to TensorBoard.

  `tff.program.TensorBoardReleaseManager` writes each value with an eager
  `tf.summary.scalar`: about 1 ms per scalar, 25-40 ms for a round's 30
  metrics, which was as long as a whole small-model round. This writes the
  same scalar summaries (the scalars plugin's tensor events, which
  TensorBoard and `tf.compat.v1.train.summary_iterator` read as before)
  through TensorBoard's own pure-Python writer, `tensorboard.summary.Writer`
  (about 0.15 ms per scalar), flushed after each release so that a killed
  run keeps every released round.
  """

  def __init__(self, summary_dir: str):
    os.makedirs(summary_dir, exist_ok=True)
    self._writer = tb_summary.Writer(summary_dir)

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    for name, scalar in value.items():
      array = np.asarray(scalar)
      if array.shape == () and array.dtype.kind in 'biuf':
        self._writer.add_scalar(name, array, step=key)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MetricsCsv(tff.program.ReleaseManager):
  """A release manager appending one row per round to a CSV keyed `round`.

  The format of `tff.program.CSVFileReleaseManager` (a header of the
  fieldnames, new ones added at the end, empty where a round has no value),
  without its cost: in `APPEND` mode TFF 0.87 reads and rewrites the whole
  file at every release (its check for rows past the released key passes
  for every key), 10-20 ms a round at a few hundred rounds and growing with
  the file. Here a row is one `write` to the file opened for appending; the
  file is rewritten (atomically) only when a round brings new fieldnames,
  and once on a resume, without the rows past the resumed round.

  Raises (constructor):
    CsvWithoutRoundError: If `path` exists with rows but no `round` column.
  """

  def __init__(self, path: str, resumed_round: int = 0):
    self._path = path
    self._fieldnames: list[str] = []
    if not os.path.exists(path):
      return
    with open(path, newline='') as f:
      reader = csv.DictReader(f)
      fieldnames = list(reader.fieldnames or [])
      if fieldnames and _ROUND not in fieldnames:
        raise CsvWithoutRoundError(f'{path} has no round column')
      rows = list(reader)
    # A row a killed run was writing has missing fields: it goes too.
    kept = [row for row in rows
            if None not in row.values() and row[_ROUND] and
            int(row[_ROUND]) <= resumed_round]
    if len(kept) != len(rows) or not fieldnames:
      self._rewrite(fieldnames, kept)
    self._fieldnames = fieldnames

  def _rewrite(self, fieldnames: list[str], rows: list[Mapping[str, Any]]):
    text = io.StringIO()
    if fieldnames:
      writer = csv.DictWriter(text, fieldnames=fieldnames)
      writer.writeheader()
      writer.writerows(rows)
    write_atomically(self._path, text.getvalue())

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    row = {_ROUND: int(key)}
    row.update((name, np.asarray(v).tolist()) for name, v in value.items())
    new = [name for name in row if name not in self._fieldnames]
    if new:
      rows = []
      if self._fieldnames:
        with open(self._path, newline='') as f:
          rows = list(csv.DictReader(f))
      self._fieldnames = self._fieldnames + new
      self._rewrite(self._fieldnames, rows + [row])
      return
    text = io.StringIO()
    csv.DictWriter(text, fieldnames=self._fieldnames).writerow(row)
    fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
    try:
      os.write(fd, text.getvalue().encode())  # one write: a whole row or none
    finally:
      os.close(fd)
