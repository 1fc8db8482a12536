"""The run's manifest: what each checkpoint was saved with, to verify on resume.

A resumed run must equal the uninterrupted run or stop. Checkpoints, client
states, `hparams.json` and `metrics.csv` can each be damaged or deleted
between two runs of a command (a full disk, a copy gone wrong, a user's
edit), and TFF reads a checkpoint whose floats changed, or a CSV missing its
first rows, without a word. `<run>/manifest.json` (written atomically,
`write_atomically`) records:

    format       this file's version
    run_id       the run's identity, made when it starts (a random id): its
                 client-state store names it as its owner
    hparams      the run's flags, as `hparams.json` holds them
    numerics     where its rounds' numbers are made: runtime, device kind,
                 oneDNN setting (`experiment_driver.build.numerics`); a
                 resume elsewhere is refused
    checkpoints  per checkpoint round: the sha256 of each of its files and of
                 the metrics rows up to that round (`metrics_digest`), and
                 for stateful clients the count and digest of the client
                 states it resumes (`ClientStateStore.summary_as_of`)
    code         per start of the driver whose rounds the run kept: the
                 code's revision, the round it started from and the
                 environment it ran in (`fl_common.run_layout.code_revision`
                 and `.environment`; absent in runs made before they were
                 recorded)

The training loop records a checkpoint after it and its client states are
saved (`record_checkpoint`); a checkpoint directory the manifest does not
name was interrupted before it was recorded. On resume, `RunDirectory`
(`experiment_driver.outputs`) verifies the latest checkpoint, its metrics
rows and its client states before anything is written, and refuses a damaged
one in one line naming the file and the command that recovers.
"""

import csv
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any, Optional

from experiment_driver import release_managers
from fl_common import run_layout

MANIFEST_NAME = run_layout.MANIFEST_FILE
FORMAT = 1
# `Manifest.revisions` of a run made before runs recorded their code.
UNRECORDED = 'unrecorded'


class RunFileError(ValueError):
  """A run file is missing or damaged (named in the message)."""


def file_digest(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def directory_digests(directory: str) -> dict[str, str]:
  """`{path relative to directory: sha256}` of every file under it."""
  digests = {}
  for parent, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(parent, name)
      digests[os.path.relpath(path, directory)] = file_digest(path)
  return digests


def metrics_digest(path: str, up_to_round: int) -> tuple[int, str]:
  """`(rows, sha256)` of the metrics CSV's rows of rounds <= `up_to_round`.

  The digest is over each row's non-empty `(column, text)` pairs, in file
  order: it survives the header widening a later round brings (rows then
  gain empty columns) and a torn row past the round, and changes with any
  value, row or round of the rounds it covers. A missing file has no rows.

  Raises:
    RunFileError: If the file cannot be read as CSV or a round is not an
      integer.
  """
  digest = hashlib.sha256()
  rows = 0
  if not os.path.exists(path):
    return 0, digest.hexdigest()
  try:
    with open(path, newline='', encoding='utf-8') as f:
      for row in csv.DictReader(f):
        text = row.get('round')
        if text is None or None in row or None in row.values():
          continue  # a torn row: checked against the digest by omission
        if int(text) > up_to_round:
          continue
        rows += 1
        digest.update(json.dumps(
            [(k, v) for k, v in row.items() if v != '']).encode())
        digest.update(b'\n')
  except (UnicodeDecodeError, csv.Error, ValueError) as e:
    raise RunFileError(f'{path} is damaged ({e})') from e
  return rows, digest.hexdigest()


class Manifest:
  """`manifest.json` of one run directory (module docstring)."""

  def __init__(self, run_path: str):
    self.path = os.path.join(run_path, MANIFEST_NAME)
    self._run_path = run_path
    self.hparams: Optional[dict[str, Any]] = None
    # Made when the run starts; None in a manifest of an earlier version.
    self.run_id: Optional[str] = None
    self.numerics: Optional[dict[str, str]] = None
    self.checkpoints: dict[int, dict[str, Any]] = {}
    self.code: list[dict[str, Any]] = []

  @property
  def exists(self) -> bool:
    return os.path.exists(self.path)

  def read(self) -> 'Manifest':
    """Reads the file if there is one.

    Raises:
      RunFileError: If it cannot be read or is not a manifest.
    """
    if not self.exists:
      return self
    try:
      with open(self.path, encoding='utf-8') as f:
        data = json.load(f)
      if not isinstance(data, dict) or data.get('format') != FORMAT:
        raise ValueError('not a manifest of this package')
      hparams = data['hparams']
      checkpoints = {int(r): c for r, c in data['checkpoints'].items()}
      code = data.get(run_layout.MANIFEST_CODE_KEY, [])
      run_id = data.get('run_id')
      if run_id is not None and not isinstance(run_id, str):
        raise ValueError('its run_id is not a string')
      numerics = data.get('numerics')
      if numerics is not None and not isinstance(numerics, dict):
        raise ValueError('its numerics record is not an object')
      if not isinstance(hparams, dict) or not all(
          isinstance(c, dict) and isinstance(c.get('files'), dict) and
          isinstance(c.get('metrics_sha256'), str)
          for c in checkpoints.values()):
        raise ValueError('not a manifest of this package')
      if not isinstance(code, list) or not all(
          isinstance(c, dict) and isinstance(c.get('revision'), str) and
          isinstance(c.get('from_round'), int) and
          isinstance(c.get('environment', ''), str) for c in code):
        raise ValueError(f'its {run_layout.MANIFEST_CODE_KEY!r} record is'
                         ' malformed')
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise RunFileError(
          f'{self.path} is damaged ({type(e).__name__}): the run\'s'
          ' checkpoints cannot be verified; pass another --experiment_name'
          ' to start again') from e
    self.hparams, self.checkpoints, self.code = hparams, checkpoints, code
    if run_id is not None:  # else keep one `new_run_id` gave this run
      self.run_id = run_id
    self.numerics = numerics
    return self

  def new_run_id(self) -> str:
    """Gives a run that has none (a new one) its identity."""
    if self.run_id is None:
      self.run_id = uuid.uuid4().hex
    return self.run_id

  def write(self) -> None:
    release_managers.write_atomically(self.path, json.dumps({
        'format': FORMAT,
        'run_id': self.run_id,
        'numerics': self.numerics,
        'hparams': self.hparams,
        'checkpoints': {str(r): c for r, c in sorted(self.checkpoints.items())},
        run_layout.MANIFEST_CODE_KEY: self.code,
    }, indent=1, sort_keys=True))

  def revisions(self) -> list[str]:
    """The revisions that made the kept rounds, in order and without
    repeats; `[UNRECORDED]` for a run without a manifest or one written
    before runs recorded their code."""
    return self._recorded('revision')

  def environments(self) -> list[str]:
    """The environments (`run_layout.environment`) that made the kept
    rounds, in order and without repeats; `[UNRECORDED]` for a run whose
    manifest records none (made before runs recorded them)."""
    return self._recorded('environment')

  def _recorded(self, key: str) -> list[str]:
    """The code records' distinct values of `key`, in order, or
    `[UNRECORDED]`."""
    return list(dict.fromkeys(c[key] for c in self.code if key in c)) or [
        UNRECORDED]

  def start_code(self, from_round: int) -> None:
    """Records that this code (`run_layout.code_revision`), in this
    environment (`run_layout.environment`), makes the rounds after
    `from_round`, forgetting starts whose rounds are recomputed."""
    self.code = [c for c in self.code if c['from_round'] < from_round]
    self.code.append({'revision': run_layout.code_revision(),
                      'from_round': from_round,
                      'environment': run_layout.environment()})

  def record_checkpoint(self, round_num: int, checkpoint_dir: str,
                        metrics_csv: str, present: set[int],
                        client_states: Optional[dict[str, Any]] = None
                        ) -> None:
    """Records checkpoint `round_num` (its files under `checkpoint_dir`),
    the metrics rows up to it and the summary of its client states (a
    stateful run's); forgets checkpoints not in `present` (those TFF's
    manager deleted)."""
    rows, digest = metrics_digest(metrics_csv, round_num)
    self.checkpoints = {r: c for r, c in self.checkpoints.items()
                        if r in present}
    self.checkpoints[round_num] = {
        'files': directory_digests(checkpoint_dir),
        'metrics_rows': rows,
        'metrics_sha256': digest,
    }
    if client_states is not None:
      self.checkpoints[round_num]['client_states'] = dict(client_states)
    self.write()

  def client_states_problem(self, round_num: int, client_states_dir: str,
                            summary: dict[str, Any],
                            upgrade_command: str) -> Optional[str]:
    """What is wrong with the client states a stateful run's checkpoint
    `round_num` would resume (`summary`, as their store records them), or
    None when they are the ones the checkpoint was saved with."""
    recorded = self.checkpoints[round_num].get('client_states')
    if recorded is None:
      return (f'{self.path} does not bind checkpoint {round_num} to its'
              ' client states (written by an earlier version of this'
              f' package); convert the run once with: {upgrade_command}')
    if recorded != summary:
      return (f'{client_states_dir} holds other client states than those'
              f' checkpoint {round_num} was saved with ({summary["count"]}'
              f' states, {recorded.get("count")} recorded): it was replaced'
              ' or altered; restore this run\'s client_states/ or pass'
              ' another --experiment_name')
    return None

  def problem(self, round_num: int, checkpoint_dir: str,
              metrics_csv: str) -> Optional[str]:
    """What is wrong with checkpoint `round_num` or the metrics rows up to
    it, or None when both match what was recorded."""
    recorded = self.checkpoints[round_num]
    on_disk = set()
    for parent, _, names in os.walk(checkpoint_dir):
      on_disk.update(os.path.relpath(os.path.join(parent, n), checkpoint_dir)
                     for n in names)
    for name, digest in sorted(recorded['files'].items()):
      path = os.path.join(checkpoint_dir, name)
      if name not in on_disk:
        return f'{path} is missing'
      if file_digest(path) != digest:
        return (f'{path} is damaged (its sha256 differs from the one recorded'
                ' when it was saved)')
    extra = sorted(on_disk - set(recorded['files']))
    if extra:
      return (f'{os.path.join(checkpoint_dir, extra[0])} was not part of the'
              ' checkpoint when it was saved')
    try:
      rows, digest = metrics_digest(metrics_csv, round_num)
    except RunFileError as e:
      return str(e)
    if digest != recorded['metrics_sha256']:
      if not os.path.exists(metrics_csv):
        return f'{metrics_csv} is missing'
      return (f'{metrics_csv} is damaged: its rows up to round {round_num}'
              f' ({rows} found, {recorded.get("metrics_rows")} recorded)'
              ' differ from those the checkpoint of that round saw')
    return None


def read_hparams(path: str) -> Optional[dict[str, Any]]:
  """`hparams.json`'s flags, or None when there is no such file.

  Raises:
    RunFileError: If it cannot be read or does not hold a JSON object.
  """
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
    if not isinstance(saved, Mapping):
      raise ValueError(f'a JSON {type(saved).__name__}, not an object')
  except (OSError, ValueError) as e:
    raise RunFileError(f'{path} is damaged ({e})') from e
  return dict(saved)
