"""An experiment's finished runs as one committed file, so that its report
can be regenerated, and its grid finished, on another machine.

A confirmatory pass takes longer than one machine keeps its disk (GeL's
Table 1 alone is ~7 h on 2 cores), and a reviewer should be able to read the
numbers a report was computed from without rerunning it. `--runs_archive=DIR`
keeps, per experiment, scale and phase, one `tar.xz` under
`DIR/<paper>/<experiment>/<scale>_<phase>.tar.xz` holding what a report
reads of each finished run (`metrics.csv`, `hparams.json`, `manifest.json`;
no checkpoint, no TensorBoard) and the runs' wall times; a confirmatory
report also reads the root's development-seed runs, kept beside in
`<scale>_exploratory.tar.xz` (`restore_read`, `save_read`). Before a grid runs,
the archive's runs that are missing from the run directories are restored
(a restored run counts as finished, as `sweep.is_finished` reads it); each
run that finishes is added to it at once, so a pass cut off loses at most
the runs in flight.

The archive is rewritten whole (a temporary file, then a rename): a reader
never sees half of it, and a run once in it stays in it. Members are named
`<run name>/<file>`; a member of any other name, or of a run not in the
grid, is refused rather than extracted.
"""

import io
import json
import lzma
import os
import tarfile
from collections.abc import Mapping, Sequence
from typing import Optional

from fl_common import run_layout
from reproduce import core
from reproduce import protocol as protocols
from reproduce import sweep

KEPT_FILES = (run_layout.METRICS_FILE, run_layout.HPARAMS_FILE,
              run_layout.MANIFEST_FILE)
TIMINGS_MEMBER = 'timings.json'  # run name -> seconds, as core's timings


def archive_path(archive_dir: str, paper: str, experiment: str, scale: str,
                 phase: str) -> str:
  return os.path.join(archive_dir, paper, experiment,
                      f'{scale}_{phase}.tar.xz')


def _read(path: str, names: set[str]
          ) -> tuple[dict[str, dict[str, bytes]], dict[str, float]]:
  """(run name -> file name -> bytes, timings) of the archive at `path`;
  empty when there is none.

  Raises:
    ValueError: If the archive is damaged, or a member is not a kept file
      of a run of `names`.
  """
  if not os.path.exists(path):
    return {}, {}
  try:
    return _members(path, names)
  except (tarfile.TarError, EOFError, lzma.LZMAError,
          json.JSONDecodeError) as e:
    raise ValueError(f'{path} is damaged ({type(e).__name__}: {e}); restore'
                     ' it from git') from None


def _members(path: str, names: set[str]
             ) -> tuple[dict[str, dict[str, bytes]], dict[str, float]]:
  runs: dict[str, dict[str, bytes]] = {}
  timings: dict[str, float] = {}
  with tarfile.open(path, 'r:xz') as tar:
    for member in tar.getmembers():
      if member.name == TIMINGS_MEMBER and member.isfile():
        timings = {k: float(v) for k, v in
                   json.load(tar.extractfile(member)).items()}
        continue
      run, _, file = member.name.partition('/')
      if not (member.isfile() and run in names and file in KEPT_FILES):
        raise ValueError(f'{path}: member {member.name!r} is not a kept file'
                         ' of a run of this grid (a run archive holds'
                         f' <run>/{{{",".join(KEPT_FILES)}}})')
      runs.setdefault(run, {})[file] = tar.extractfile(member).read()
  return runs, timings


def restore(points: Sequence[sweep.SweepPoint], path: str,
            other_code: bool = True) -> tuple[list[str], dict[str, float]]:
  """Writes each archived run whose run directory does not exist; returns
  the names restored and their wall times. A run directory that exists is
  left as it is (a finished run is the same run; an unfinished one resumes
  from its own checkpoint). Without `other_code`, a run made (in any of its
  rounds) by code other than this checkout's run code
  (`core.is_this_run_code`) is not restored: its point runs again, and
  replaces it in the archive when it finishes."""
  by_name = {p.experiment_name: p for p in points}
  runs, timings = _read(path, set(by_name))
  restored = []
  for name, files in sorted(runs.items()):
    run_dir = by_name[name].run_dir
    if os.path.exists(run_dir):
      continue
    if not other_code and not _of_this_run_code(
        files.get(run_layout.MANIFEST_FILE)):
      continue
    partial = f'{run_dir}.restoring{os.getpid()}'
    os.makedirs(partial)
    for file, data in files.items():
      with open(os.path.join(partial, file), 'wb') as f:
        f.write(data)
    os.replace(partial, run_dir)
    restored.append(name)
  return restored, {n: timings[n] for n in restored if n in timings}


def _of_this_run_code(manifest: Optional[bytes]) -> bool:
  """Whether every round of a run (its `manifest.json`'s code records) was
  made by this checkout's run code; False for a run that records none."""
  try:
    code = json.loads(manifest or b'{}').get(run_layout.MANIFEST_CODE_KEY)
  except (ValueError, AttributeError):
    return False
  revisions = [c.get('revision') for c in code or () if isinstance(c, dict)]
  return bool(revisions) and all(map(core.is_this_run_code, revisions))


def _refuse_finished_runs_of_other_code(points, root: str) -> None:
  """Raises ValueError if a finished run in the root is of other run code
  (a rerun would skip it rather than make it again)."""
  other = []
  for point in filter(sweep.is_finished, points):
    try:
      with open(os.path.join(point.run_dir, run_layout.MANIFEST_FILE),
                'rb') as f:
        manifest = f.read()
    except FileNotFoundError:
      manifest = None
    if not _of_this_run_code(manifest):
      other.append(point.experiment_name)
  if other:
    raise ValueError(
        f'--rerun_other_code: {root} holds {len(other)} finished runs of'
        f' other run code (e.g. {other[0]}), which would be skipped, not'
        ' made again; give an empty --root_output_dir')


def _remove_stale_partials(path: str) -> None:
  """Removes `<path>.tmp<pid>` files whose writer no longer runs (a pass
  killed while it wrote the archive leaves one; the archive itself is
  whole, as the rename never happened). A live writer's file stays."""
  directory = os.path.dirname(path) or '.'
  prefix = os.path.basename(path) + '.tmp'
  for name in os.listdir(directory):
    pid = name[len(prefix):]
    if not (name.startswith(prefix) and pid.isdigit()):
      continue
    try:
      os.kill(int(pid), 0)
    except ProcessLookupError:
      os.remove(os.path.join(directory, name))
    except PermissionError:
      pass  # another user's live process


def save(points: Sequence[sweep.SweepPoint], path: str,
         timings: Mapping[str, float]) -> int:
  """Adds every finished point's kept files (and wall time, where
  `timings` has it) to the archive at `path`; returns how many runs it
  holds. Runs already archived stay, whether or not they are on disk."""
  runs, archived_timings = _read(path, {p.experiment_name for p in points})
  for point in points:
    if not sweep.is_finished(point):
      continue
    files = {}
    for file in KEPT_FILES:
      try:
        with open(os.path.join(point.run_dir, file), 'rb') as f:
          files[file] = f.read()
      except FileNotFoundError:
        pass
    runs[point.experiment_name] = files
    if point.experiment_name in timings:
      archived_timings[point.experiment_name] = timings[point.experiment_name]
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  _remove_stale_partials(path)
  partial = f'{path}.tmp{os.getpid()}'
  # Fixed times and order: the same runs give the same bytes (a commit of
  # an unchanged archive changes nothing).
  # xz: a tenth smaller than gzip on long runs' metrics, and no timestamp.
  with lzma.open(partial, 'wb', preset=9) as packed:
    with tarfile.open(fileobj=packed, mode='w') as tar:
      members = [(TIMINGS_MEMBER, json.dumps(
          dict(sorted(archived_timings.items())), indent=1).encode())]
      members += [(f'{name}/{file}', data)
                  for name, files in sorted(runs.items())
                  for file, data in sorted(files.items())]
      for name, data in members:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))
  os.replace(partial, path)
  return len(runs)


def _print(line: str) -> None:
  print(line, flush=True)


def restore_read(archive_dir: str, experiment, scale: str, root: str,
                 seeds, phase, print_fn=None, rerun_other_code: bool = False
                 ) -> list[tuple[list[sweep.SweepPoint], str]]:
  """(points, archive path) of each phase whose runs the experiment's
  report reads (`phase` first, the one that runs; a confirmatory report
  also reads the root's development-seed runs), after restoring the
  archived runs missing from the run directories and their wall times.
  [] for a measured experiment without runs. With `rerun_other_code`,
  the running phase's archived runs of other run code are not restored
  (`restore`), so that the grid makes them again at this code.

  Raises:
    ValueError: If an archive cannot be read, or, with `rerun_other_code`,
      if a finished run in the root is of other run code (it would be
      skipped, not made again).
    OSError, tarfile.TarError: If an archive cannot be read.
  """
  print_fn = print_fn or _print
  read = [phase]
  if phase.name == protocols.CONFIRMATORY:
    read.append(core.Phase(protocols.EXPLORATORY, phase.protocol))
  kept = []
  for each in read:
    points = core.build_points(experiment, scale, root, seeds, phase=each)
    if not points:
      continue
    rerun = rerun_other_code and each is phase
    if rerun:
      _refuse_finished_runs_of_other_code(points, root)
    path = archive_path(archive_dir, experiment.paper, experiment.name,
                        scale, each.name)
    restored, timings = restore(points, path, other_code=not rerun)
    core.add_timings(experiment, scale, root, timings)
    if os.path.exists(path):
      print_fn(f'runs_archive: {path}: {len(restored)} runs restored')
    kept.append((points, path))
  return kept


def save_read(kept: Sequence[tuple[list[sweep.SweepPoint], str]],
              experiment, scale: str, root: str, print_fn=None) -> None:
  """`save` of each of `restore_read`'s archives that has a finished run
  to keep (no empty archive is written)."""
  print_fn = print_fn or _print
  for points, path in kept:
    if any(map(sweep.is_finished, points)) or os.path.exists(path):
      held = save(points, path, core.read_timings(experiment, scale, root))
      print_fn(f'runs_archive: {path}: {held} runs')
