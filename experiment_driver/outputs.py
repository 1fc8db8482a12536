"""A run directory: hyperparameters, per-round metrics, TensorBoard, checkpoints.

Layout of `<root_output_dir>/<experiment_name>/` (its names:
`fl_common.run_layout`):

    run.lock         the pid of the run holding the directory's lock
    hparams.json     the flags of the run (rerunning with other flags is refused)
    manifest.json    the flags again, and each checkpoint's file digests and
                     metrics rows (`run_files`): verified on resume
    metrics.csv      one row per round (`release_managers.MetricsCsv`)
    tensorboard/     scalars per round (`release_managers.TensorBoardScalars`)
    checkpoints/     program state (`tff.program.FileProgramStateManager`)

Metrics are released through release managers (TFF's interface,
`tff.program.ReleaseManager`; TFF's own CSV and TensorBoard managers cost
more than a small-model round: `experiment_driver.release_managers`). On
a resume the CSV loses the rows past the resumed round, so a resumed run's
CSV equals an uninterrupted run's, and the TensorBoard events are rewritten
from the CSV up to the resumed round, so that they too hold each round once.

A run holds an exclusive advisory lock (`flock`) on `run.lock` for its life;
the kernel releases it when the process dies, even by `kill -9`, so a lock is
never stale. Writes go to temporary files renamed into place (TFF's
`<name>_tempNNNN`, ours `.tmp-*`); those an interrupted write left behind are
removed when the next run takes the lock. The last `checkpoints_to_keep`
checkpoints are kept (and the first), so that a corrupt latest one can be
deleted to resume from the one before.

A resume verifies before it writes anything: the latest checkpoint's files,
the metrics rows up to its round and (through `load_latest_checkpoint`'s
`client_states_problem`) the client states as of it, against what
`manifest.json` recorded when the checkpoint was saved. A damaged or missing
file stops the run in one line naming it and the command that resumes from
the newest checkpoint that does verify: a resumed run equals the
uninterrupted one or does not run.

Why one module: the lock, the writers and the checkpoints' save, verify and
load share one directory layout and one order (verify before anything is
written); `run_files` holds the manifest's format and digests.
"""

import asyncio
import csv
import fcntl
import json
import math
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any, Optional

import tensorflow_federated as tff

from experiment_driver import release_managers
from experiment_driver import run_files
from fl_engine import client_state_store
from fl_common import run_layout

LOCK_NAME = run_layout.LOCK_FILE
_ROUND = run_layout.ROUND_COLUMN
_TEMP_PREFIX = release_managers.TEMP_PREFIX
# TFF's release and program-state managers write `<name>_temp<4 digits>`.
_TFF_TEMP = re.compile(r'_temp\d{4}$')


class RunDirectoryError(ValueError):
  """The run directory cannot be used as asked."""


class RunLockedError(RunDirectoryError):
  """Another live run holds the run directory."""


# The driver's exit code when another live run holds its run directory
# (EX_TEMPFAIL): a launcher tells "someone else is running this" from a
# failure by it (`reproduce.cluster`'s jobs exit 0 then).
EXIT_LOCKED = 75


class CheckpointError(RuntimeError):
  """A saved checkpoint cannot be read, or a run file fails verification."""


def _remove_interrupted_writes(directory: str) -> None:
  """Removes the temporary files and directories of interrupted writes."""
  if not os.path.isdir(directory):
    return
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    if name.startswith(_TEMP_PREFIX) or _TFF_TEMP.search(name):
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        os.remove(path)


# A file name's limit on Linux and macOS (NAME_MAX), in bytes.
_NAME_MAX = 255


def check_experiment_name(name: str) -> None:
  """Refuses a run name that is not one printable path component, so that a
  run writes under its root directory only.

  Raises:
    RunDirectoryError: If `name` is empty, `.` or `..`, holds a `/`, a
      character that is not printable (newline, tab, control), or is longer
      than a file name can be.
  """
  problem = None
  if not name or name in ('.', '..'):
    problem = 'must name a directory'
  elif '/' in name or (os.sep != '/' and os.sep in name):
    problem = ('must be one directory name, without /: runs live directly'
               ' under --root_output_dir')
  elif not name.isprintable():
    problem = 'must hold printable characters only (no newline, tab, control)'
  elif len(name.encode('utf-8', 'surrogateescape')) > _NAME_MAX:
    problem = (f'is {len(name.encode("utf-8", "surrogateescape"))} bytes; a'
               f' directory name has at most {_NAME_MAX}')
  if problem:
    raise RunDirectoryError(f'--experiment_name={name!r} {problem}')


class RunDirectory:
  """Owns one run's outputs; writes nothing until `start_writing()`.

  Raises (constructor):
    RunDirectoryError: If `experiment_name` is not one printable path
      component (`check_experiment_name`).
  """

  def __init__(self, root_output_dir: str, experiment_name: str,
               hparams: Mapping[str, Any], checkpoints_to_keep: int = 3,
               numerics: Optional[Mapping[str, str]] = None):
    check_experiment_name(experiment_name)
    self.root = root_output_dir
    self.path = os.path.join(root_output_dir, experiment_name)
    self.checkpoints_to_keep = checkpoints_to_keep
    self.last_round = 0  # the last round whose metrics were released
    self.last_checkpoint_round: Optional[int] = None
    self._lock_fd: Optional[int] = None
    self._created: Optional[str] = None
    self.hparams = dict(hparams)
    # Where the rounds' numbers are made (runtime, device, oneDNN): a run
    # resumes only where it started (`check_hparams`).
    self.numerics = dict(numerics) if numerics is not None else None
    self.metrics_csv = os.path.join(self.path, run_layout.METRICS_FILE)
    self.tensorboard_dir = os.path.join(self.path, run_layout.TENSORBOARD_DIR)
    self.checkpoint_dir = os.path.join(self.path, run_layout.CHECKPOINT_DIR)
    self.hparams_json = os.path.join(self.path, run_layout.HPARAMS_FILE)
    self.client_states_dir = os.path.join(self.path,
                                          run_layout.CLIENT_STATES_DIR)
    self.manifest = run_files.Manifest(self.path)
    self._event_loop = None  # made on first use (see `_loop`)
    self._release_managers = []
    self._state_manager = None  # creates its directory: made on first use
    # (round, whether its client states were checked) that `verify_resume`
    # verified, or None.
    self._verified: Optional[tuple[Optional[int], bool]] = None

  @property
  def _loop(self) -> asyncio.AbstractEventLoop:
    """The event loop TFF's managers run on: the thread's current one, or a
    new one made current when `asyncio.run` elsewhere (a notebook, a test)
    left none or a closed one (TFF's managers use the current loop)."""
    if self._event_loop is None or self._event_loop.is_closed():
      try:
        loop = asyncio.get_event_loop()
      except RuntimeError:
        loop = None
      if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
      self._event_loop = loop
    return self._event_loop

  def _checkpoints(self) -> tff.program.FileProgramStateManager:
    if self._state_manager is None:
      # The first checkpoint (round 0) and the last `checkpoints_to_keep`.
      self._state_manager = tff.program.FileProgramStateManager(
          self.checkpoint_dir, keep_total=self.checkpoints_to_keep + 1,
          keep_first=True)
    return self._state_manager

  def lock(self) -> None:
    """Takes the directory's exclusive lock for the life of this process.

    Creates the directory if needed, then removes what interrupted writes
    left behind.

    Raises:
      RunLockedError: If another live run holds it (naming its pid); nothing
        is written then.
      RunDirectoryError: If the directory cannot be created or written.
    """
    self._refuse_symlinks()
    # The top-most directory this run creates (None: it creates none).
    missing = None
    path = os.path.abspath(self.path)
    while not os.path.exists(path):
      missing, path = path, os.path.dirname(path)
    self._created = missing
    try:
      os.makedirs(self.path, exist_ok=True)
      fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_RDWR | os.O_CREAT,
                   0o666)
    except OSError as e:
      self._remove_created()
      raise RunDirectoryError(
          f'cannot write the run directory {self.path}: {e.strerror}') from e
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      pid = os.read(fd, 32).decode(errors='replace').strip() or 'unknown'
      os.close(fd)
      raise RunLockedError(
          f'{self.path} is in use by another run (pid {pid}); wait for it to'
          ' end or pass another --experiment_name') from None
    try:
      os.ftruncate(fd, 0)
      os.write(fd, f'{os.getpid()}\n'.encode())
      if not os.access(self.path, os.W_OK):
        raise PermissionError(13, 'Permission denied')
    except OSError as e:
      os.close(fd)
      raise RunDirectoryError(
          f'cannot write the run directory {self.path}: {e.strerror}') from e
    self._lock_fd = fd
    for path, is_kind, kind in (
        (self.checkpoint_dir, os.path.isdir, 'a directory'),
        (self.tensorboard_dir, os.path.isdir, 'a directory'),
        (self.client_states_dir, os.path.isdir, 'a directory'),
        (self.metrics_csv, os.path.isfile, 'a file'),
        (self.hparams_json, os.path.isfile, 'a file'),
        (self.manifest.path, os.path.isfile, 'a file')):
      if os.path.exists(path) and not is_kind(path):
        self.unlock()
        raise RunDirectoryError(
            f'cannot write the run directory {self.path}: {path} is not'
            f' {kind}')
    _remove_interrupted_writes(self.path)
    _remove_interrupted_writes(self.checkpoint_dir)

  def _refuse_symlinks(self) -> None:
    """Refuses a run directory, or a file or directory of its layout, that
    is a symbolic link: writing through it would write outside the root
    (the root itself may be one: runs are confined to where it leads).

    Raises:
      RunDirectoryError: Naming the link and where it leads.
    """
    for path in (self.path, self.checkpoint_dir, self.tensorboard_dir,
                 self.client_states_dir, self.metrics_csv, self.hparams_json,
                 self.manifest.path, os.path.join(self.path, LOCK_NAME)):
      if os.path.islink(path):
        raise RunDirectoryError(
            f'{path} is a symbolic link (to {os.path.realpath(path)}): a run'
            f' writes only inside its directory under {self.root}; replace'
            ' the link with a directory or pass another --experiment_name')

  def unlock(self) -> None:
    """Releases the lock; a directory this run created and left empty goes."""
    if self._lock_fd is None:
      return
    for manager in self._release_managers:
      if isinstance(manager, release_managers.TensorBoardScalars):
        manager.close()
    self._release_managers = []
    _remove_interrupted_writes(self.path)
    _remove_interrupted_writes(self.checkpoint_dir)
    states = self.client_states_dir
    if self._created and os.path.isdir(states) and not os.listdir(states):
      os.rmdir(states)  # opened by a stateful run that stopped before use
    if self._created and os.listdir(self.path) == [LOCK_NAME]:
      # Nothing was written: leave the file system as it was.
      os.remove(os.path.join(self.path, LOCK_NAME))
      self._remove_created()
    os.close(self._lock_fd)
    self._lock_fd = None

  def _remove_created(self) -> None:
    """Removes the empty directories `lock` created, innermost first."""
    if not self._created:
      return
    path = os.path.abspath(self.path)
    while len(path) >= len(self._created):
      try:
        os.rmdir(path)
      except OSError:
        pass  # not created, or not empty: kept
      if path == self._created:
        break
      path = os.path.dirname(path)

  def check_hparams(self) -> None:
    """Refuses to resume a run that was started with other hyperparameters.

    The flags are those of `hparams.json`, and of `manifest.json` when
    `hparams.json` is gone; the two must agree.

    Raises:
      RunDirectoryError: If the flags differ, or either file is damaged.
    """
    try:
      recorded = self.manifest.read().hparams
    except run_files.RunFileError as e:
      raise RunDirectoryError(str(e)) from e
    try:
      saved = run_files.read_hparams(self.hparams_json)
    except run_files.RunFileError as e:
      if recorded is None:
        raise RunDirectoryError(str(e)) from e
      raise RunDirectoryError(
          f'{e}; {self.manifest.path} holds the run\'s flags: remove it (rm'
          f' {self.hparams_json}) and rerun to resume') from e
    if recorded is not None:
      if saved is not None and saved != recorded:
        raise RunDirectoryError(
            f'{self.hparams_json} differs from the flags {self.manifest.path}'
            ' recorded when the run started: it was edited or damaged; restore'
            ' it or pass another --experiment_name')
      saved = recorded
    recorded_numerics = self.manifest.numerics
    if (recorded_numerics is not None and self.numerics is not None and
        recorded_numerics != self.numerics):
      def describe(n):
        return ', '.join(f'{k} {n.get(k)}' for k in sorted(self.numerics))
      raise RunDirectoryError(
          f'{self.path} was computed with {describe(recorded_numerics)};'
          f' this run would go on with {describe(self.numerics)}, whose'
          ' rounds differ at float rounding (docs/runtime.md): resume with'
          ' the runtime, devices and oneDNN setting it started with, or pass'
          ' another --experiment_name')
    if saved is None:
      return
    hparams = self.hparams
    changed = sorted(k for k in set(saved) | set(hparams)
                     if saved.get(k) != hparams.get(k))
    if changed:
      details = ', '.join(
          f'{k}: {saved.get(k)!r} -> {hparams.get(k)!r}' for k in changed)
      raise RunDirectoryError(
          f'{self.path} holds a run with other flags ({details}); pass another'
          ' --experiment_name or the same flags to resume it')

  def start_writing(self, resumed_round: int = 0) -> None:
    """Creates the directory, writes the hyperparameters, opens the writers.

    On a resume (`resumed_round` > 0) the TensorBoard events are rewritten
    from `metrics.csv` up to `resumed_round`: the rounds the interrupted run
    wrote after its last checkpoint are computed again and must appear once.

    Called after the checkpoint was read, so a run that cannot resume leaves
    its directory untouched.
    """
    try:  # before anything is written
      run_files.metrics_digest(self.metrics_csv, resumed_round)
    except run_files.RunFileError as e:
      raise RunDirectoryError(
          f'{e}; move it away or pass another --experiment_name') from e
    os.makedirs(self.path, exist_ok=True)
    release_managers.write_atomically(self.hparams_json,
                      json.dumps(self.hparams, indent=2, sort_keys=True))
    self.manifest.hparams = json.loads(json.dumps(self.hparams))
    self.manifest.new_run_id()
    if self.numerics is not None:
      self.manifest.numerics = self.numerics
    self.manifest.start_code(resumed_round)
    self.manifest.write()
    try:
      csv_manager = release_managers.MetricsCsv(self.metrics_csv,
                                                resumed_round)
    except release_managers.CsvWithoutRoundError as e:
      raise RunDirectoryError(
          f'{self.metrics_csv} has no round column: it was not written by'
          ' this package; move it away or pass another --experiment_name'
          ) from e

    if resumed_round or os.path.isdir(self.tensorboard_dir):
      # Also a resume from round 0 (the first checkpoint).
      self._rewrite_tensorboard(resumed_round)
    self._release_managers = [
        csv_manager,
        release_managers.TensorBoardScalars(self.tensorboard_dir),
    ]

  def _rewrite_tensorboard(self, resumed_round: int) -> None:
    rows = []
    if os.path.exists(self.metrics_csv):
      with open(self.metrics_csv, newline='') as f:
        rows = [row for row in csv.DictReader(f)
                if row.get(_ROUND) and int(row[_ROUND]) <= resumed_round]
    shutil.rmtree(self.tensorboard_dir, ignore_errors=True)
    manager = release_managers.TensorBoardScalars(self.tensorboard_dir)
    for row in rows:
      values = {}
      for key, text in row.items():
        try:
          values[key] = float(text)
        except (TypeError, ValueError):
          continue
      values.pop(_ROUND, None)
      self._loop.run_until_complete(
          manager.release(values, key=int(row[_ROUND])))
    manager.close()

  def release_metrics(self, metrics: Mapping[str, float], round_num: int):
    """Writes one round's flat metrics to the CSV and TensorBoard."""
    self._loop.run_until_complete(asyncio.gather(*[
        manager.release(dict(metrics), key=round_num)
        for manager in self._release_managers
    ]))
    self.last_round = round_num

  def save_checkpoint(self, program_state: Any, round_num: int) -> None:
    """Saves the program state of `round_num`; `record_checkpoint` makes it
    one a resume may use."""
    self._loop.run_until_complete(
        self._checkpoints().save(program_state, round_num))

  @property
  def upgrade_command(self) -> str:
    """The command that converts this run from an earlier version."""
    return f'python -m experiment_driver.upgrade_run {self.path}'

  def run_id(self) -> str:
    """The run's identity (`manifest.json`'s `run_id`): the recorded one,
    else a new one, written with the manifest when the run starts.

    Raises:
      CheckpointError: If the manifest is damaged.
    """
    try:
      self.manifest.read()
    except run_files.RunFileError as e:
      raise CheckpointError(str(e)) from e
    return self.manifest.new_run_id()

  def record_checkpoint(self, round_num: int,
                        client_states: Optional[dict[str, Any]] = None
                        ) -> None:
    """Records the saved checkpoint of `round_num` in the manifest, with the
    metrics rows up to it and `client_states` (a stateful run's
    `ClientStateStore.summary_as_of(round_num)`): call once everything it
    depends on (the client states' commit) is saved."""
    self.manifest.record_checkpoint(
        round_num, self._checkpoint_path(round_num), self.metrics_csv,
        set(self._versions()), client_states)
    self.last_checkpoint_round = round_num

  def _checkpoint_path(self, version: int) -> str:
    return os.path.join(self.checkpoint_dir, f'program_state_{version}')

  def _versions(self) -> list[int]:
    return sorted(self._loop.run_until_complete(
        self._checkpoints().get_versions()) or [])

  def verify_resume(self) -> None:
    """Verifies, before the runtime starts and the process is built, what a
    resume would read: the latest checkpoint, its metrics rows and, where
    the run keeps client states, exactly the states that checkpoint
    recorded. A damaged run is then refused in a second, not after the
    model is built; `load_latest_checkpoint` does not verify again what
    passed here.

    Raises:
      CheckpointError: As `load_latest_checkpoint`.
    """
    store = None
    try:
      self.manifest.read()
    except run_files.RunFileError as e:
      raise CheckpointError(str(e)) from e
    if os.path.isdir(self.client_states_dir) or any(
        'client_states' in c for c in self.manifest.checkpoints.values()):
      store = client_state_store.ClientStateStore(
          self.client_states_dir, fresh_state=(), owner=self.run_id(),
          upgrade_command=self.upgrade_command, create=False)
    self._verified = (self._latest_verified(store), store is not None)

  def load_latest_checkpoint(
      self, structure: Any, client_states: Optional[Any] = None,
  ) -> tuple[Any, int]:
    """Returns `(program_state, round)` of the latest verified checkpoint, or
    `(None, 0)` if there is none.

    A checkpoint that was saved but not recorded (the run stopped in
    between) is removed: the previous one is the latest. The latest is
    verified (module docstring), with a stateful run's `client_states` (its
    `ClientStateStore`): exactly the states the checkpoint recorded.

    Raises:
      CheckpointError: If a file the latest checkpoint depends on is missing
        or damaged, naming it and the command that recovers; or if the
        checkpoint cannot be read.
    """
    latest = self._latest_verified(client_states)
    if latest is None:
      return None, 0
    try:
      state = self._loop.run_until_complete(
          self._checkpoints().load(latest, structure))
    except Exception as e:  # pylint: disable=broad-except
      path = self._checkpoint_path(latest)
      older = [v for v in self._versions() if v < latest]
      before = (f'resume from round {older[-1]}, the checkpoint before it'
                if older else 'start the run again')
      raise CheckpointError(
          f'checkpoint {path} cannot be read ({type(e).__name__}); delete'
          f' it (rm -r {path}) and rerun to {before}, or pass another'
          ' --experiment_name') from e
    # Checkpoints past the one resumed from are gone: forget them.
    self.manifest.checkpoints = {r: c for r, c in
                                 self.manifest.checkpoints.items()
                                 if r <= latest}
    self.last_checkpoint_round = latest
    return state, latest

  def _latest_verified(self, client_states: Optional[Any]) -> Optional[int]:
    """The round of the latest checkpoint, verified (`load_latest_checkpoint`),
    or None when there is none."""
    try:
      self.manifest.read()
    except run_files.RunFileError as e:
      raise CheckpointError(str(e)) from e
    if not os.path.isdir(self.checkpoint_dir):
      versions = []
    else:
      versions = self._versions()
    recorded = self.manifest.checkpoints
    if versions and not self.manifest.exists:
      raise CheckpointError(
          f'{self.manifest.path} is missing: the checkpoints in'
          f' {self.checkpoint_dir} cannot be verified (the file was deleted,'
          ' or the run is from an earlier version); pass another'
          ' --experiment_name to start again')
    newest_recorded = max((v for v in versions if v in recorded), default=-1)
    for version in versions:
      if version not in recorded:
        if version < newest_recorded:
          raise CheckpointError(
              f'{self._checkpoint_path(version)} is not recorded in'
              f' {self.manifest.path}: the run directory was altered; pass'
              ' another --experiment_name to start again')
        # Saved, then the run stopped before recording it: incomplete.
        shutil.rmtree(self._checkpoint_path(version))
    versions = [v for v in versions if v in recorded]
    if not versions:
      if recorded:
        raise CheckpointError(
            f'every checkpoint of {self.path} is gone (rounds'
            f' {sorted(recorded)} were saved); pass another --experiment_name'
            f' or remove the directory (rm -r {self.path}) to start again')
      return None
    verified_round, states_verified = self._verified or (None, False)

    def problem(version):
      found = None
      if version != verified_round:
        found = self.manifest.problem(
            version, self._checkpoint_path(version), self.metrics_csv)
      if found or client_states is None or (version == verified_round and
                                            states_verified):
        return found
      return client_states.problem_as_of(version) or (
          self.manifest.client_states_problem(
              version, self.client_states_dir,
              client_states.summary_as_of(version), self.upgrade_command))

    latest = versions[-1]
    # What no older checkpoint would mend (another run's store, a file it
    # does not record) is refused as it is.
    found = client_states.problem() if client_states is not None else None
    if found:
      raise CheckpointError(found)
    found = problem(latest)
    if found:
      older = next((v for v in reversed(versions[:-1]) if not problem(v)),
                   None)
      if older is None:
        raise CheckpointError(
            f'{found}; no checkpoint of this run verifies: pass another'
            f' --experiment_name or remove the directory (rm -r {self.path})'
            ' to start again')
      newer = ' '.join(self._checkpoint_path(v) for v in versions
                       if v > older)
      raise CheckpointError(
          f'{found}; to resume from round {older}, the newest checkpoint that'
          f' verifies, run: rm -r {newer}; then rerun the same command')
    return latest


def flatten_metrics(structure: Any, prefix: str = '') -> dict[str, float]:
  """Flattens nested TFF metrics to `{'a/b/c': float}` (scalars only)."""
  flat = {}
  if isinstance(structure, Mapping):
    items = structure.items()
  elif hasattr(structure, '_asdict'):
    items = structure._asdict().items()
  else:
    try:
      return {prefix: float(structure)}
    except (TypeError, ValueError):
      return {}
  for key, value in items:
    flat.update(flatten_metrics(value, f'{prefix}/{key}' if prefix else key))
  return flat


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f'{hours}h{minutes:02d}m{seconds:02d}s' if hours else (
      f'{minutes}m{seconds:02d}s')


def progress_line(round_num: int, total_rounds: int, round_seconds: float,
                  mean_round_seconds: float,
                  metrics: Mapping[str, float]) -> str:
  """One line per round: round, time, ETA and the key metrics."""
  eta = mean_round_seconds * (total_rounds - round_num)
  parts = [f'round {round_num}/{total_rounds}', f'{round_seconds:.2f}s',
           f'ETA {format_duration(eta)}']
  for key in ('train/loss', 'train/accuracy', 'validation/accuracy',
              'test/accuracy', 'update_norm', 'clipping_norm'):
    value = metrics.get(key)
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
      parts.append(f'{key} {value:.4g}')
  for key in ('num_nonfinite_updates', 'num_zero_updates'):
    if metrics.get(key, 0) > 0:  # diverged clients, discarded (diagnostics)
      parts.append(f'{key} {int(metrics[key])}')
  if metrics.get('examples_processed') == 0:
    parts.append('WARNING: no client update reached the model (every client'
                 ' diverged or sent nothing)')
  return ' | '.join(parts)
