"""On-disk store of per-client states, versioned by round for exact resumes.

Stateful algorithms (AdaBest, FedDyn, SCAFFOLD) keep a model-sized vector per
client; 1,000 clients of a CIFAR model do not fit in memory, and only the
round's cohort is needed at a time. `ClientStateStore` keeps each client's
state on disk and in memory holds only the last cohort's states (plus, per
client, the list of round numbers it has versions for).

Layout: one file per (client, round) version, named
`client-<quoted client id>@<round, 8 digits>.state`, holding the flattened
state leaves' bytes one after the other (their shapes and dtypes are
`fresh_state`'s, so a file of another size is refused): a tenth of the time
of an `.npz` to read, a round reading and writing every client of its
cohort. (Stores written as `.npz` by earlier versions are converted once by
`upgrade`.) Each file is written to a temporary name in the same directory and
`os.replace`d, so it is either absent or complete. `MANIFEST.json` records
the retained committed rounds and the sha256 of every file they use (also
replaced atomically): a state file that is missing, or whose bytes differ
from the digest recorded when it was written, is refused when read and is
named by `problem_as_of`, which a resume calls before any round runs. Same-
size damage (a flipped float) would otherwise be read as a valid state.

What a resume reads is exactly what the manifest records, never what the
directory happens to hold: versions come from the manifest (and this
process's own writes), not from listing the directory. A state file the
manifest does not list, at a round it covers (a file copied in under another
client's name, another run's file), is refused by `problem_as_of`, never
adopted; an unlisted file at a round after the last commit is what a crash
left behind and is deleted by `restore`. The manifest names its `owner` (the
run's identity, `ClientStateStore(owner=...)`): another run's store, moved in
whole, is refused. `summary_as_of(r)` (count and digest of the states as of
round r) lets a run's own manifest bind a checkpoint to its client states.

A store written by an earlier version of the package (`.npz` files, a
manifest without checksums or without an owner) is refused until it is
converted once, explicitly: `upgrade` (or `python -m
fl_engine.client_state_store DIRECTORY OWNER`), which says what it did and
records it in the manifest's `upgraded` log.

Why one module: the file format, the versions, the commits and their
checksums are one on-disk contract, each part relied on by the others. Files reach the disk
(`fsync`) when a commit keeps them, not as each round writes them: a round
writes every client of its cohort (800 fsyncs would take longer than the
round), and only committed states must survive a power loss; those of later
rounds are deleted on resume anyway.

Exact resume: the training loop checkpoints its server state at round r and
then calls `commit(r)`; after a crash it resumes from the last checkpoint r and
calls `restore(r)`. The state of a client as of round r is its newest version
at a round <= r. Both calls delete the versions newer than r (written by
rounds that ran after the checkpoint before the crash, or by a crash right
after the checkpoint and before `commit`) and the versions that none of the
last `keep_commits` committed rounds uses: a resume may go back to any of
those (e.g. when the latest checkpoint turned out corrupt and was deleted).
A crash during either call leaves the store valid: it only ever deletes files
that the states as of the retained rounds do not use.
"""

import hashlib
import json
import os
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

MANIFEST_NAME = 'MANIFEST.json'
_PREFIX = 'client-'
_SUFFIX = '.state'
_LEGACY_SUFFIX = '.npz'
_TEMP_PREFIX = '.tmp-'
_VERSION_SEPARATOR = '@'  # urllib.parse.quote(..., safe='') escapes it.


class ClientStateError(ValueError):
  """A client state file is missing or damaged (named in the message)."""


def _atomic_write(path: str, write_fn, sync: bool = True) -> None:
  """Writes `path` via a temporary file in its directory and `os.replace`,
  `fsync`ed first if `sync`."""
  directory = os.path.dirname(path)
  fd, temp_path = tempfile.mkstemp(dir=directory, prefix=_TEMP_PREFIX)
  try:
    with os.fdopen(fd, 'wb') as f:
      write_fn(f)
      f.flush()
      if sync:
        os.fsync(f.fileno())
    os.replace(temp_path, path)
  except BaseException:
    if os.path.exists(temp_path):
      os.remove(temp_path)
    raise


class ClientStateStore:
  """Per-client states on disk, keyed by client id and versioned by round.

  Example, around a training loop::

    store = ClientStateStore(os.path.join(run_dir, 'client_states'),
                             fresh_state=process.initial_client_state(),
                             owner=run_id)
    problem = store.problem_as_of(resumed_round)  # None, or refuse
    store.restore(resumed_round)       # on resume from a checkpoint
    for round_num in ...:
      states = store.load(client_ids)  # fresh states for new clients
      ...
      store.save(client_ids, new_states, round_num)
      if checkpointed: store.commit(round_num)
  """

  def __init__(self, directory: str, fresh_state: Any, keep_commits: int = 1,
               owner: Optional[str] = None,
               upgrade_command: Optional[str] = None, create: bool = True):
    """Opens (creating if needed) the store in `directory`.

    Opening never changes a file: a store whose files or manifest do not
    verify is described by `problem_as_of`, and reading a state it does not
    record raises `ClientStateError`.

    Args:
      directory: Where the state files live.
      fresh_state: The (nested) state of a client that has never taken part;
        every saved state must have its structure, shapes and dtypes.
      keep_commits: How many of the last committed rounds `restore` can go
        back to (as many as the checkpoints kept beside it).
      owner: Whose states these are (a run's identity); recorded in the
        manifest at each commit, and a manifest of another owner is refused.
      upgrade_command: The command a refusal of an earlier version's store
        names (default: `upgrade`'s command line).
      create: Whether to create `directory` if it is missing (not when the
        store is opened only to verify it: `problem_as_of`).

    Raises:
      ValueError: If `keep_commits` is not positive.
    """
    if keep_commits < 1:
      raise ValueError(f'keep_commits must be >= 1, got {keep_commits}.')
    self._keep_commits = keep_commits
    self._directory = directory
    if create:
      os.makedirs(directory, exist_ok=True)
    self._fresh_leaves = [np.asarray(x) for x in tf.nest.flatten(fresh_state)]
    self._fresh_state = fresh_state
    self._versions: dict[str, list[int]] = {}
    self._cache: dict[str, Any] = {}
    self._unsynced: set[str] = set()  # written since the last commit
    self._state_bytes = sum(leaf.nbytes for leaf in self._fresh_leaves)
    # The manifest as last read, and the (mtime, size, inode) it was read at.
    self._manifest_key: Optional[tuple[int, int, int]] = None
    self._manifest_cache: dict[str, Any] = {}
    # File name -> sha256 of its bytes: the committed files' (manifest) and
    # those written since.
    self._owner = owner
    self._upgrade_command = upgrade_command or (
        f'python -m fl_engine.client_state_store {directory} {owner}')
    # File name -> sha256 of its bytes: the committed files' (manifest) and
    # those written since. A damaged manifest records nothing here (and
    # `problem_as_of` says why).
    try:
      manifest = self._manifest()
    except ClientStateError:
      manifest = {}
    self._digests: dict[str, str] = dict(manifest.get('files', {}))
    for name in self._digests:
      client_id, round_num = self._parse_file_name(name)
      self._versions.setdefault(client_id, []).append(round_num)
    for versions in self._versions.values():
      versions.sort()

  @property
  def directory(self) -> str:
    return self._directory

  @property
  def cached_client_ids(self) -> list[str]:
    """The clients whose states are held in memory: the last cohort."""
    return list(self._cache)

  @property
  def committed_round(self) -> int:
    """The round of the last `commit`/`restore` (0 before any)."""
    return max(self.committed_rounds, default=0)

  @property
  def committed_rounds(self) -> list[int]:
    """The retained committed rounds, oldest first: `restore` targets."""
    manifest = self._manifest()
    if not manifest:
      return []
    return [int(r) for r in manifest.get(
        'committed_rounds', [manifest['committed_round']])]

  def _manifest(self) -> dict[str, Any]:
    """The manifest's contents ({} when there is none).

    Raises:
      ClientStateError: If it cannot be read or is not this store's.
    """
    path = os.path.join(self._directory, MANIFEST_NAME)
    try:
      stat = os.stat(path)
    except FileNotFoundError:
      return {}
    key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    if self._manifest_key != key:
      self._manifest_key, self._manifest_cache = key, _read_manifest(path)
    return self._manifest_cache

  def problem_as_of(self, round_num: int) -> Optional[str]:
    """What is wrong with the states as of committed round `round_num`,
    or None when they are exactly what the manifest recorded.

    Refused: a damaged or missing manifest (unless `round_num` is 0 and the
    store is empty), one of another owner or of an earlier version of the
    package (`upgrade`), a round it does not keep, a recorded file missing
    or with other bytes, and any file in the directory that the manifest
    does not list at a round it covers (an extra version, a file of another
    client or of another run). Reads every file the states use (a resume
    calls it once).
    """
    path = os.path.join(self._directory, MANIFEST_NAME)
    found = self.problem()
    if found or round_num == 0:
      return found
    manifest = self._manifest()
    if not manifest:
      return (f'{path} is missing: the client states as of round'
              f' {round_num} cannot be verified')
    if round_num not in self.committed_rounds:
      return (f'{path} does not record the client states as of round'
              f' {round_num} (it keeps rounds {self.committed_rounds})')
    files = manifest['files']
    for name in sorted(self._names_as_of(round_num, files)):
      file_path = os.path.join(self._directory, name)
      if not os.path.exists(file_path):
        return f'{file_path} is missing'
      with open(file_path, 'rb') as f:
        if hashlib.sha256(f.read()).hexdigest() != files[name]:
          return (f'{file_path} is damaged (its sha256 differs from the one'
                  ' recorded when it was written)')
    return None

  def problem(self) -> Optional[str]:
    """What is wrong with the store whatever round it resumes, or None: a
    damaged manifest, one of another owner or of an earlier version of the
    package (`upgrade`), a file it does not list at a round it covers."""
    path = os.path.join(self._directory, MANIFEST_NAME)
    try:
      manifest = self._manifest()
    except ClientStateError as e:
      return str(e)
    upgrade = f'convert it once with: {self._upgrade_command}'
    names = (os.listdir(self._directory) if os.path.isdir(self._directory)
             else [])
    if any(name.startswith(_PREFIX) and name.endswith(_LEGACY_SUFFIX)
           for name in names):
      return (f'{self._directory} holds .npz client states, written by an'
              f' earlier version of this package; {upgrade}')
    if not manifest:
      foreign = self._unlisted(-1)
      if foreign:
        return (f'{os.path.join(self._directory, foreign[0])} is not one of'
                f' the client states this run recorded ({path} is missing):'
                ' remove it to resume')
      return None
    files = manifest.get('files')
    if files is None or 'owner' not in manifest:
      return (f'{path} records no {"checksums" if files is None else "owner"}'
              f' (written by an earlier version of this package); {upgrade}')
    if manifest['owner'] != self._owner:
      return (f'{path} belongs to another run ({manifest["owner"]}, this is'
              f' {self._owner}): its client states are not this run\'s;'
              ' restore this run\'s client_states/ or pass another'
              ' --experiment_name')
    foreign = self._unlisted(max(self.committed_rounds, default=0))
    if foreign:
      return (f'{os.path.join(self._directory, foreign[0])} is not one of the'
              f' client states {path} recorded (another client\'s or another'
              ' run\'s file, or a copy): remove it to resume')
    return None

  def _unlisted(self, up_to_round: int) -> list[str]:
    """The directory's files that the manifest does not list, bar those a
    crash after the last commit left (state files of later rounds) and
    temporary files."""
    foreign = []
    if not os.path.isdir(self._directory):
      return foreign
    for name in sorted(os.listdir(self._directory)):
      if (name == MANIFEST_NAME or name.startswith(_TEMP_PREFIX) or
          name in self._digests):
        continue
      try:
        _, version = self._parse_file_name(name)
      except ValueError:
        foreign.append(name)
        continue
      if version <= up_to_round:
        foreign.append(name)
    return foreign

  @classmethod
  def _names_as_of(cls, round_num: int, files) -> list[str]:
    """The file names, of `files`, that the states as of `round_num` use."""
    newest: dict[str, tuple[int, str]] = {}
    for name in files:
      client_id, version = cls._parse_file_name(name)
      if version <= round_num and version >= newest.get(client_id,
                                                        (-1, ''))[0]:
        newest[client_id] = (version, name)
    return [name for _, name in newest.values()]

  def summary_as_of(self, round_num: int) -> dict[str, Any]:
    """`{'count', 'sha256'}` of the states as of `round_num` as this store
    records them: a run's manifest keeps it with the checkpoint of that
    round, so that the checkpoint resumes exactly those states."""
    return summary_of(round_num, self._digests)

  def load(self, client_ids: Sequence[str]) -> list[Any]:
    """Returns the clients' latest states (fresh ones for unknown clients).

    The returned states become the in-memory cache, replacing the previous
    cohort's.
    """
    states = [
        self._cache[i] if i in self._cache else self._read(i)
        for i in client_ids
    ]
    self._cache = dict(zip(client_ids, states))
    return states

  def save(self, client_ids: Sequence[str], states: Sequence[Any],
           round_num: int) -> None:
    """Writes the clients' states as their version of `round_num`.

    The saved states become the in-memory cache, replacing the previous
    cohort's.

    Raises:
      ValueError: If lengths differ, `round_num` is not positive or not newer
        than the committed round, or a state does not match `fresh_state`.
    """
    if len(client_ids) != len(states):
      raise ValueError(f'Got {len(client_ids)} client ids and {len(states)} '
                       'states; expected one state per client.')
    if round_num < 1 or round_num <= self.committed_round:
      raise ValueError(
          f'round_num={round_num} must be positive and newer than the '
          f'committed round {self.committed_round}.')
    for client_id, state in zip(client_ids, states):
      leaves = [np.ascontiguousarray(leaf)
                for leaf in self._checked_leaves(client_id, state)]
      name = self._file_name(client_id, round_num)
      path = os.path.join(self._directory, name)
      _atomic_write(path, lambda f, leaves=leaves: self._write(f, leaves),
                    sync=False)
      digest = hashlib.sha256()
      for leaf in leaves:
        digest.update(leaf.data)
      self._digests[name] = digest.hexdigest()
      self._unsynced.add(path)
      versions = self._versions.setdefault(client_id, [])
      if round_num not in versions:
        versions.append(round_num)
        versions.sort()
    self._cache = dict(zip(client_ids, states))

  def commit(self, round_num: int) -> None:
    """Makes the states as of `round_num` durable; call after a checkpoint.

    Deletes versions newer than `round_num` and versions that none of the
    last `keep_commits` committed rounds (this one included) uses, then
    records those rounds in the manifest.

    Raises:
      ValueError: If `round_num` is older than the committed round or
        negative.
    """
    committed = self.committed_round
    if round_num < committed or round_num < 0:
      raise ValueError(
          f'round_num={round_num} is older than the committed round '
          f'{committed}: commit only keeps or moves forward (restore goes'
          ' back).')
    self._retain([r for r in self.committed_rounds if r < round_num]
                 + [round_num], sync=True)

  def restore(self, round_num: int) -> None:
    """Rewinds to the states as of committed round `round_num` (or 0, the
    start); call on resume, after `problem_as_of(round_num)` found nothing.

    Discards whatever rounds after `round_num` wrote before a crash, and the
    commits after it. States of a round that was never committed are not
    restored: what they are was never recorded (the driver records a
    checkpoint only after committing its states, and drops a checkpoint
    saved but not recorded).

    Raises:
      ValueError: If `round_num` is not one of the retained commits nor 0.
    """
    retained = self.committed_rounds
    if round_num not in retained and round_num != 0:
      raise ValueError(
          f'the client states as of round {round_num} are not recorded: the'
          f' store keeps those of rounds {retained} (keep_commits='
          f'{self._keep_commits}).')
    self._retain([r for r in retained if r < round_num] + [round_num])

  def _retain(self, rounds: list[int], sync: bool = False) -> None:
    """Keeps the versions the states as of `rounds` use (the last is now
    the current round), deletes the others and temporary files; with
    `sync`, the kept files not yet on disk are `fsync`ed before the
    manifest names their round."""
    rounds = rounds[-self._keep_commits:]
    for client_id in list(self._versions):
      versions = self._versions[client_id]
      kept = sorted({max((v for v in versions if v <= r), default=None)
                     for r in rounds} - {None})
      for version in versions:
        if version not in kept:
          name = self._file_name(client_id, version)
          os.remove(os.path.join(self._directory, name))
          self._digests.pop(name, None)
      if kept:
        self._versions[client_id] = kept
      else:
        del self._versions[client_id]
    for name in os.listdir(self._directory):
      if name.startswith(_TEMP_PREFIX):  # left by a crash during a write
        os.remove(os.path.join(self._directory, name))
      elif name not in self._digests and name.endswith(_SUFFIX):
        # Written by a round after the last commit before a crash (a
        # foreign file at a committed round was refused by `problem_as_of`).
        try:
          _, version = self._parse_file_name(name)
        except ValueError:
          continue
        if version > rounds[-1]:
          os.remove(os.path.join(self._directory, name))
    if sync:
      for path in self._unsynced:
        if os.path.exists(path):
          fd = os.open(path, os.O_RDONLY)
          try:
            os.fsync(fd)
          finally:
            os.close(fd)
      fd = os.open(self._directory, os.O_RDONLY)  # the renames
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    self._unsynced = set()
    self._cache = {}
    files = {}
    for client_id, versions in self._versions.items():
      for version in versions:
        name = self._file_name(client_id, version)
        files[name] = self._digests[name]
    try:
      upgraded = self._manifest().get('upgraded', [])
    except ClientStateError:
      upgraded = []
    self._write_manifest({'committed_round': rounds[-1],
                          'committed_rounds': rounds, 'owner': self._owner,
                          'files': files, 'upgraded': upgraded})

  def _write_manifest(self, manifest: dict[str, Any]) -> None:
    if not manifest.get('upgraded'):
      manifest.pop('upgraded', None)
    _atomic_write(os.path.join(self._directory, MANIFEST_NAME),
                  lambda f: f.write(json.dumps(manifest).encode()))

  def _read(self, client_id: str) -> Any:
    versions = self._versions.get(client_id)
    if not versions:
      return self._fresh_state
    name = self._file_name(client_id, versions[-1])
    path = os.path.join(self._directory, name)
    try:
      with open(path, 'rb') as f:
        data = bytearray(f.read())
    except FileNotFoundError:
      raise ClientStateError(f'{path} is missing') from None
    if len(data) != self._state_bytes:
      raise ClientStateError(
          f'{path} holds {len(data)} bytes, a client state {self._state_bytes}:'
          ' the file is not one of this store\'s states.')
    digest = self._digests.get(name)
    if digest is None or hashlib.sha256(data).hexdigest() != digest:
      raise ClientStateError(
          f'{path} is damaged (its sha256 differs from the one recorded when'
          ' it was written)')
    leaves, offset = [], 0
    for fresh in self._fresh_leaves:
      leaves.append(np.frombuffer(data, fresh.dtype, fresh.size,
                                  offset).reshape(fresh.shape))
      offset += fresh.nbytes
    return tf.nest.pack_sequence_as(self._fresh_state, leaves)

  @staticmethod
  def _write(f, leaves: list[np.ndarray]) -> None:
    for leaf in leaves:
      f.write(np.ascontiguousarray(leaf).tobytes())

  def _checked_leaves(self, client_id: str, state: Any) -> list[np.ndarray]:
    leaves = [np.asarray(x) for x in tf.nest.flatten(state)]
    if len(leaves) != len(self._fresh_leaves) or any(
        a.shape != b.shape or a.dtype != b.dtype
        for a, b in zip(leaves, self._fresh_leaves)):
      raise ValueError(
          f'The state of client {client_id!r} has leaves '
          f'{[(a.shape, a.dtype) for a in leaves]}, expected '
          f'{[(b.shape, b.dtype) for b in self._fresh_leaves]}.')
    return leaves

  @staticmethod
  def _file_name(client_id: str, round_num: int) -> str:
    quoted = urllib.parse.quote(client_id, safe='')
    return f'{_PREFIX}{quoted}{_VERSION_SEPARATOR}{round_num:08d}{_SUFFIX}'

  @staticmethod
  def _parse_file_name(name: str) -> tuple[str, int]:
    quoted, round_text = name[len(_PREFIX):-len(_SUFFIX)].rsplit(
        _VERSION_SEPARATOR, 1)
    return urllib.parse.unquote(quoted), int(round_text)


def summary_of(round_num: int, digests: dict[str, str]) -> dict[str, Any]:
  """`{'count', 'sha256'}` of the states as of `round_num` among the files
  `digests` records (`{file name: sha256}`)."""
  names = sorted(ClientStateStore._names_as_of(round_num, digests))
  digest = hashlib.sha256(json.dumps(
      [(n, digests[n]) for n in names]).encode())
  return {'count': len(names), 'sha256': digest.hexdigest()}


def recorded_digests(directory: str) -> dict[str, str]:
  """`{file name: sha256}` of the files the store's manifest records.

  Raises:
    ClientStateError: If the manifest is damaged.
  """
  return dict(_read_manifest(os.path.join(directory, MANIFEST_NAME)).get(
      'files') or {})


def _read_manifest(path: str) -> dict[str, Any]:
  """The store manifest at `path` ({} when there is none).

  Raises:
    ClientStateError: If it cannot be read or is not a store's manifest.
  """
  try:
    with open(path, 'rb') as f:
      manifest = json.loads(f.read().decode())
    if not isinstance(manifest, dict) or not (
        'committed_round' in manifest or 'committed_rounds' in manifest):
      raise ValueError('not a manifest')
    [int(r) for r in manifest.get('committed_rounds',
                                  [manifest.get('committed_round')])]
    files = manifest.get('files', {})
    if not isinstance(files, dict) or not all(
        isinstance(v, str) for v in files.values()):
      raise ValueError('not a manifest')
  except FileNotFoundError:
    return {}
  except (OSError, ValueError, TypeError) as e:
    raise ClientStateError(
        f'{path} is damaged ({type(e).__name__}): the client states it'
        ' records cannot be verified') from e
  return manifest


def upgrade(directory: str, owner: Optional[str],
            print_fn=print) -> list[str]:
  """Converts a store written by an earlier version of this package, once.

  Earlier versions wrote `.npz` states, manifests without checksums (their
  files were adopted when opened) and manifests without an owner. This
  rewrites each `.npz` as a `.state` file (the same leaves' bytes), records
  the sha256 of every state file of a committed round that the manifest
  does not list, and the owner; each step is printed and the manifest's
  `upgraded` log records it. Use it on a store you know to be the run's own:
  it adopts the files it finds, which is what opening a store no longer does.

  Returns:
    The steps taken (none for a store that needs none).

  Raises:
    ClientStateError: If the directory has no manifest (nothing says which
      rounds were committed), or it is damaged.
  """
  path = os.path.join(directory, MANIFEST_NAME)
  manifest = _read_manifest(path)
  if not manifest:
    raise ClientStateError(
        f'{path} is missing: nothing records which rounds were committed,'
        ' so the store cannot be converted')
  committed = [int(r) for r in manifest.get(
      'committed_rounds', [manifest['committed_round']])]
  files = dict(manifest.get('files') or {})
  steps = []
  for name in sorted(os.listdir(directory)):
    if not (name.startswith(_PREFIX) and name.endswith(_LEGACY_SUFFIX)):
      continue
    new_name = name[:-len(_LEGACY_SUFFIX)] + _SUFFIX
    with np.load(os.path.join(directory, name)) as npz:
      leaves = [npz[f'leaf_{k}'] for k in range(len(npz.files))]
    _atomic_write(os.path.join(directory, new_name),
                  lambda f, leaves=leaves: ClientStateStore._write(f, leaves))
    os.remove(os.path.join(directory, name))
    steps.append(f'converted {name} to {new_name}')
  for name in sorted(os.listdir(directory)):
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
      continue
    _, version = ClientStateStore._parse_file_name(name)
    if name in files or version > max(committed):
      continue  # recorded, or a later round's (deleted on resume)
    with open(os.path.join(directory, name), 'rb') as f:
      files[name] = hashlib.sha256(f.read()).hexdigest()
    steps.append(f'recorded {name} (sha256 {files[name][:12]}...)')
  if manifest.get('owner') != owner:
    steps.append(f'recorded the owner {owner}'
                 + (f' (was {manifest["owner"]})' if 'owner' in manifest
                    else ''))
  if not steps:
    return steps
  for step in steps:
    print_fn(f'{directory}: {step}')
  upgraded = list(manifest.get('upgraded', [])) + [{
      'at': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
      'steps': len(steps), 'owner': owner}]
  _atomic_write(path, lambda f: f.write(json.dumps({
      'committed_round': max(committed), 'committed_rounds': committed,
      'owner': owner, 'files': files, 'upgraded': upgraded}).encode()))
  return steps


if __name__ == '__main__':
  import sys
  if len(sys.argv) != 3:
    sys.exit('usage: python -m fl_engine.client_state_store DIRECTORY OWNER')
  try:
    if not upgrade(sys.argv[1], sys.argv[2]):
      print(f'{sys.argv[1]}: nothing to convert')
  except (ClientStateError, OSError) as e:
    sys.exit(f'error: {e}')
