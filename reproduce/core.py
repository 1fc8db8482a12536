"""Experiments: a paper's table or figure as grids of driver runs and a report.

An `Experiment` names the table or figure it reproduces (`source`), the grids
of driver runs that reproduce it at each scale (`setting(scale)`), and how its
numbers are read off the run directories (`analyze`, which uses
`reproduce.analysis`). `run_experiment` runs the grids through
`reproduce.sweep` (ordinary run directories: resumable, finished points
skipped, `parallel` at a time) and `write_report` puts the package's numbers
beside the paper's (`paper_numbers.csv`, each with its source) in a markdown
report with the experiment's figures.

Scales:

* `paper`: the paper's own setting (its datasets, models, cohorts, rounds and
  seeds), for users with the data and the hardware.
* `local`: what a 2-core machine without downloads has (Synthetic, the bundled
  digits), at sizes that finish; its report says what it substitutes.
* `smoke`: the local scale cut to its first `SMOKE_MAX_GRIDS` grids, each to
  two values of its first axis and one of the others, `SMOKE_ROUNDS` rounds
  and one seed, so that CI runs every experiment's code end to end.

Why one module: an experiment's grids, runs, reading and report are one
pipeline over the same conventions (run names, scales, the long-form table);
split, each part would re-import the others.

An experiment that no training run can show (GeL's Figure 3: the gradient
coefficients of one client's update) has no grids but a `measure`: a function
of the scale (a measuring subprocess), whose long-form frame is kept as
`<run root>/<name>/measured.csv` and read by `analyze` like the runs' frame.
An experiment with grids may measure too (AdaBest's cost tables: the counted
arithmetic beside the timed runs); `analyze` and the effects then read both
in one frame, the measured rows told apart by their own columns.

Grids of one paper share a run root (`<root>/<paper>/<scale>/`): a grid that
two experiments name alike (GeL's Table 1 runs, read again by Figure 4) runs
once.
"""

import collections
import dataclasses
import functools
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd

from experiment_driver import prestart
from experiment_driver import release_managers
from experiment_driver import run_files
from fl_common import run_layout
from reproduce import analysis
from reproduce import history
from reproduce import protocol as protocols
from reproduce import sweep
from reproduce import verdicts

SCALES = ('local', 'paper', 'smoke', 'paper_smoke')
# `paper_smoke` keeps paper-scale commands from rotting unseen: per
# experiment, the first point of each paper-scale grid (one whose flags
# differ from an earlier grid's first point only in numbers is not run:
# `paper_smoke_shape`), for one round on
# the task's small stand-in data (`--use_synthetic_data`: TFF's synthetic
# EMNIST, TFDS's mock images partitioned, a generated play), with no
# network; the cohort and a partition's client count are the paper's capped
# by the stand-in's clients. It runs; it reports nothing (one round says
# nothing of a claim).
PAPER_SMOKE = 'paper_smoke'
PAPER_SMOKE_ROUNDS = 1
# Training clients of each task's stand-in (`--use_synthetic_data`): a
# paper-smoke run's cohort is the paper's, capped by them. Tasks absent
# here read no files (generated data): their flags stay the paper's.
STAND_IN_CLIENTS = {
    'emnist': 1,  # TFF's synthetic EMNIST: 2 clients, 1 kept for validation
    'leaf_shakespeare': 3,
    'stackoverflow': 1,
    'cifar100': 1,
    # Partitioned tasks split TFDS's mock images (20 per client and split)
    # into --num_clients: capped too, so that a CIFAR ResNet evaluates 400
    # mock images, not 20,000.
    'emnist_l': 20,
    'cifar10': 20,
    'cifar100_partitioned': 20,
}
# Flags a stand-in's client count caps.
_CAPPED_BY_STAND_IN = ('clients_per_round', 'num_clients')
SMOKE_ROUNDS = 2
SMOKE_MAX_GRIDS = 2  # a smoke run keeps an experiment's first grids only
PAPER_NUMBERS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  'paper_numbers.csv')
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_DIR, 'results')
DEFAULT_ROOT = '/tmp/fl_papers/reproduce'
TIMINGS_FILE = 'timings.json'
MEASURED_FILE = 'measured.csv'
PAPER_TITLES = {
    'gel': 'GeL: guess and learn (Boukhari et al. 2024)',
    'large_cohort': 'On large-cohort training for federated learning'
                    ' (Charles et al. 2021)',
    'adabest': 'AdaBest (Varno et al. 2022)',
}
# Driver flags whose value must not exceed a smoke run's rounds.
_PER_ROUNDS_FLAGS = ('rounds_per_eval', 'rounds_per_checkpoint')

# A report's verdict line starts with this (`read_verdict` finds it).
VERDICT_PREFIX = '**Verdict:** '

# Columns of an analysis table (long form: one number per row and quantity).
ROW = 'row'
QUANTITY = 'quantity'
VALUE = 'value'
STD = 'std'
NUM_RUNS = 'n'
SOURCE = 'source'
PAPER_ROW = 'paper_row'  # optional: the paper's row a package row stands by


@dataclasses.dataclass(frozen=True)
class Grid:
  """Driver runs: fixed flags, axes (their product), rounds and seeds.

  `name` starts every run's experiment name; two grids of one paper with the
  same name must be the same grid (their runs are shared). `seed_flag` is the
  driver flag that takes the seeds `first_seed..first_seed+seeds-1` as a
  last axis (`None`: the grid has no seed axis).
  """

  name: str
  flags: Mapping[str, Optional[str]]
  total_rounds: int
  axes: tuple[sweep.Axis, ...] = ()
  seed_flag: Optional[str] = 'seed'
  # Flags that take the same seed as `seed_flag` (a partitioned task's
  # `partition_seed` is the seed axis, and `seed` then varies the
  # initialization and the client sampling with it).
  tied_seed_flags: tuple[str, ...] = ()
  # At most this many of the experiment's seeds (a costly grid beside cheap
  # ones); None: all of them.
  max_seeds: Optional[int] = None
  # The first seed: a replication on fresh seeds starts past the seeds the
  # experiment's other grids use.
  first_seed: int = 0
  # Flags a smoke run adds (e.g. a downloading task's small stand-in, so
  # that the smoke scale needs no network).
  smoke_flags: Mapping[str, Optional[str]] = dataclasses.field(
      default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Setting:
  """An experiment at one scale: its grids, default seeds, substitutions."""

  grids: tuple[Grid, ...]
  seeds: int
  substitutes: str = ''  # markdown; what this scale runs instead of the paper


@dataclasses.dataclass
class Analysis:
  """What `Experiment.analyze` read off the runs.

  `table` is long-form: one row per (`row`, `quantity`) with `value`, `std`
  (over seeds, NaN for one run) and `n` (runs); rows and quantities named as
  in `paper_numbers.csv` line up with the paper's numbers. `figures` are file
  names written in the output directory; `notes` are markdown paragraphs.
  """

  table: pd.DataFrame
  figures: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Experiment:
  paper: str
  name: str
  source: str  # e.g. 'Table 1, Synthetic rows'
  claim: str  # what the paper shows there, in one or two sentences
  setting: Callable[[str], Setting]  # 'local' or 'paper' -> Setting
  analyze: Callable[[pd.DataFrame, str], Analysis]  # (runs, output dir)
  # Runs at a time at most, whatever --parallel says: 1 for an experiment
  # that reads wall times, which runs side by side would distort.
  max_parallel: Optional[int] = None
  # Instead of driver runs (then no grids) or beside them: scale -> a frame
  # `analyze` reads, with the runs' if there are any (no TFF runtime here:
  # `measure_in_subprocess`).
  measure: Optional[Callable[[str], pd.DataFrame]] = None
  # scale -> the effects the paper reports, as paired comparisons of runs
  # (`reproduce.verdicts`); the report's verdict is computed from them.
  effects: Callable[[str], Sequence[verdicts.Effect]] = lambda scale: ()
  # scale -> why this scale cannot show the effect (what it needs), or None.
  not_testable: Callable[[str], Optional[str]] = lambda scale: None


@dataclasses.dataclass(frozen=True)
class Verdict:
  """An experiment's computed verdict at one scale, with its effects'."""

  verdict: str
  reason: str
  assessments: tuple[verdicts.Assessment, ...]


@dataclasses.dataclass(frozen=True)
class Phase:
  """Which runs a command makes and reads: `protocols.EXPLORATORY`
  (development seeds) or `protocols.CONFIRMATORY` (the frozen version's
  seed block), with the experiment's protocol (None: an experiment without
  one, exploratory only) and, confirmatory, its frozen version's record."""

  name: str = protocols.EXPLORATORY
  protocol: Optional[protocols.Protocol] = None
  frozen: Optional[Mapping[str, object]] = None

  @property
  def first_seed(self) -> int:
    return int(self.frozen['first_seed']) if self.frozen else 0


def phase_for(experiment: Experiment, name: str, scale: str,
              protocols_dir: str = protocols.PROTOCOLS_DIR) -> Phase:
  """The experiment's phase `name` at `scale`.

  Raises:
    ValueError: Confirmatory: if the protocol is missing, not frozen,
      changed since its freeze, or not what the code carries out.
  """
  if name not in protocols.PHASES:
    raise ValueError(f'phase must be one of {", ".join(protocols.PHASES)},'
                     f' got {name!r}')
  try:
    protocol = protocols.load(experiment.paper, experiment.name,
                              protocols_dir)
  except ValueError:
    if name == protocols.CONFIRMATORY or os.path.exists(
        protocols.path_of(experiment.paper, experiment.name, protocols_dir)):
      raise
    return Phase(name)
  if name == protocols.EXPLORATORY:
    return Phase(name, protocol)
  record = protocols.frozen(protocol)
  found = protocols.differences(protocol, experiment, scale)
  if found:
    raise ValueError(f'the code does not carry out the frozen {protocol.path}'
                     f' (version {record["version"]}): ' + '; '.join(found[:3])
                     + (f' (and {len(found) - 3} more)' if len(found) > 3
                        else ''))
  return Phase(name, protocol, record)


def judge(experiment: Experiment, frame: pd.DataFrame, scale: str,
          phase: Optional[Phase] = None) -> Verdict:
  """The experiment's verdict on its runs' frame (`reproduce.verdicts`),
  its effects declared as its protocol declares them."""
  effects = protocols.apply(phase.protocol if phase else None,
                            experiment.effects(scale))
  assessments = verdicts.assess_all(frame, effects)
  not_testable = experiment.not_testable(scale)
  verdict = verdicts.combine([a.verdict for a in assessments if a.primary],
                             not_testable)
  if not_testable:
    reason = (f'{not_testable} Test it with `python -m reproduce'
              f' {experiment.paper} {experiment.name} --scale=paper`.')
  elif not assessments:
    reason = 'the experiment declares no effect to test.'
  else:
    primary = [a for a in assessments if a.primary]
    counts = collections.Counter(a.verdict for a in primary)
    # Secondary effects do not make the verdict, but what they show is
    # said beside it: a reversal among them is not hidden in a count.
    secondary = collections.Counter(a.verdict for a in assessments
                                    if not a.primary)
    reason = ('Primary effects: '
              + ', '.join(f'{n} of {len(primary)} {v}'
                          for v, n in counts.most_common())
              + (f'; {sum(secondary.values())} secondary (not in the'
                 ' verdict): ' + ', '.join(
                     f'{secondary[v]} {v}' for v in verdicts.EFFECT_VERDICTS
                     if secondary[v]) if secondary else '') + '.')
  return Verdict(verdict, reason, assessments)


def setting_fn(grids_fn: Callable[[str], tuple[Grid, ...]],
               local_seeds: int, substitutes: str = '',
               paper_seeds: int = 5) -> Callable[[str], Setting]:
  """`Experiment.setting` from a grids function: the papers' seeds at the
  paper scale, `local_seeds` and the `substitutes` text at the local one."""
  def setting(scale: str) -> Setting:
    if scale == 'paper':
      return Setting(grids_fn(scale), seeds=paper_seeds)
    return Setting(grids_fn(scale), seeds=local_seeds,
                   substitutes=substitutes)
  return setting


def seed_values(count: int, first: int = 0) -> tuple[str, ...]:
  return tuple(str(seed) for seed in range(first, first + count))


def _smoke_grid(grid: Grid) -> Grid:
  """The grid cut to 2 values of its first axis, 1 of the others; an axis
  whose flag is a smoke flag takes that value only (e.g. a cohort axis on
  a stand-in dataset of 3 clients)."""
  axes = tuple(
      dataclasses.replace(axis, values=(
          (grid.smoke_flags[axis.flag],) if axis.flag in grid.smoke_flags
          else axis.values[:2 if i == 0 else 1]))
      for i, axis in enumerate(grid.axes))
  axis_flags = {axis.flag for axis in axes}
  flags = {**grid.flags, **{flag: value for flag, value in
                            grid.smoke_flags.items() if flag not in axis_flags}}
  for flag in _PER_ROUNDS_FLAGS:
    if flag in flags:
      flags[flag] = '1'
  return dataclasses.replace(grid, axes=axes, flags=flags,
                             total_rounds=min(grid.total_rounds, SMOKE_ROUNDS))


def _paper_smoke_grid(grid: Grid) -> Grid:
  """The grid's first point (first value of every axis), one round, on the
  task's stand-in data with the cohort capped by its clients."""
  axes = tuple(dataclasses.replace(axis, values=axis.values[:1])
               for axis in grid.axes)
  flags = dict(grid.flags)
  task = flags.get('task')
  if task in STAND_IN_CLIENTS:
    flags['use_synthetic_data'] = None
    cap = STAND_IN_CLIENTS[task]
    axes = tuple(
        dataclasses.replace(axis, values=(str(min(int(axis.values[0]),
                                                  cap)),))
        if axis.flag in _CAPPED_BY_STAND_IN else axis for axis in axes)
    for flag in _CAPPED_BY_STAND_IN:
      if flag in flags:
        flags[flag] = str(min(int(flags[flag]), cap))
    if not any('clients_per_round' in where
               for where in (flags, {a.flag for a in axes})):
      flags['clients_per_round'] = str(cap)
  for flag in _PER_ROUNDS_FLAGS:
    if flag in flags:
      flags[flag] = '1'
  return dataclasses.replace(grid, axes=axes, flags=flags, max_seeds=1,
                             total_rounds=PAPER_SMOKE_ROUNDS)


def paper_smoke_shape(flags: Mapping[str, object]) -> tuple:
  """What a paper-smoke command checks of a run's flags: which flags it
  sets and every value that is not a number (task, algorithm, optimizer,
  model). Two first points that differ only in numbers (a cohort, a
  Dirichlet alpha, a beta, a budget) take the same flags, task, algorithm
  and model on the same stand-in data for one round; what a number alone
  changes is the tests' and `--scale=smoke`'s to check."""
  def shape(value):
    try:
      float(str(value))
    except ValueError:
      return str(value)
    return '<number>'
  return tuple(sorted((flag, shape(value)) for flag, value in flags.items()))


def _paper_smoke_grids(grids: Sequence[Grid]) -> tuple[Grid, ...]:
  """`_paper_smoke_grid` of every grid, but each shape of command once
  (`paper_smoke_shape`): a grid whose first point differs from an earlier
  grid's only in numbers is not run again (Table 2's 108 grids are 3
  datasets x 3 partitions x 3 participations x 4 algorithms; its
  participations and Dirichlet alphas are numbers)."""
  seen, kept = set(), []
  for grid in map(_paper_smoke_grid, grids):
    first = {**grid.flags, **{a.flag: a.values[0] for a in grid.axes}}
    first.pop(grid.seed_flag, None)
    key = paper_smoke_shape(first)
    if key not in seen:
      seen.add(key)
      kept.append(grid)
  return tuple(kept)


def grid_of(described: Mapping[str, object]) -> Grid:
  """A protocol's grid (`protocols.describe_grid`'s spelling) as a `Grid`."""
  unset = lambda v: None if v == protocols.UNSET else v
  return Grid(
      name=described['name'],
      flags={k: unset(v) for k, v in described['flags'].items()},
      total_rounds=described['rounds'],
      axes=tuple(sweep.Axis(flag, tuple(values))
                 for flag, values in described['axes'].items()),
      seed_flag=unset(described.get('seed_flag', 'seed')),
      tied_seed_flags=tuple(described.get('tied_seed_flags', ())),
      max_seeds=described.get('max_seeds'),
      first_seed=described.get('first_seed', 0),
      smoke_flags={k: unset(v)
                   for k, v in described.get('smoke_flags', {}).items()})


def _declared(experiment: Experiment, scale: str,
              phase: Optional[Phase]) -> Setting:
  """The experiment's setting at `scale` ('local' or 'paper') as its
  protocol declares it: the protocol's grids and seed count where it has
  them (the runs made are the protocol's), else the code's."""
  setting = experiment.setting(scale)
  protocol = phase.protocol if phase else None
  if protocol is None:
    return setting
  grids = protocol.grids(scale)
  seeds = protocol.seeds(scale)
  return dataclasses.replace(
      setting,
      grids=setting.grids if grids is None else tuple(map(grid_of, grids)),
      seeds=setting.seeds if seeds is None else seeds)


def setting_for(experiment: Experiment, scale: str,
                phase: Optional[Phase] = None) -> Setting:
  """The experiment's setting at `scale`: its protocol's grids and seed
  count where it has a protocol (`_declared`); the smoke scale cuts the
  local one."""
  if scale not in SCALES:
    raise ValueError(f'scale must be one of {", ".join(SCALES)}, got'
                     f' {scale!r}')
  if scale == PAPER_SMOKE:
    paper = _declared(experiment, 'paper', phase)
    return dataclasses.replace(paper, grids=_paper_smoke_grids(paper.grids),
                               seeds=1)
  if scale != 'smoke':
    return _declared(experiment, scale, phase)
  local = _declared(experiment, 'local', phase)
  return dataclasses.replace(
      local, grids=tuple(_smoke_grid(g)
                         for g in local.grids[:SMOKE_MAX_GRIDS]), seeds=1)


def run_root(root: str, experiment: Experiment, scale: str) -> str:
  return os.path.join(root, experiment.paper, scale)


def build_points(experiment: Experiment, scale: str, root: str,
                 seeds: Optional[int] = None,
                 command: Sequence[str] = sweep.DEFAULT_COMMAND,
                 phase: Optional[Phase] = None,
                 ) -> list[sweep.SweepPoint]:
  """Every run of the experiment at `scale` in `phase` (default:
  exploratory; seeds default: the protocol's, else the scale's).

  Raises:
    ValueError: For an unknown scale, `seeds` < 1, a malformed grid, or a
      seed of the other phase's range (`protocols.check_seeds`).
  """
  phase = phase or Phase()
  setting = setting_for(experiment, scale, phase)
  if seeds is not None and seeds < 1:
    raise ValueError(f'seeds must be >= 1, got {seeds}')
  seeds = setting.seeds if seeds is None else seeds
  directory = run_root(root, experiment, scale)
  points = []
  for grid in setting.grids:
    if not grid.seed_flag:
      points += sweep.build_points(grid.axes, directory, grid.total_rounds,
                                   name_prefix=grid.name, flags=grid.flags,
                                   command=command)
      continue
    values = seed_values(min(seeds, grid.max_seeds or seeds),
                         phase.first_seed + grid.first_seed)
    protocols.check_seeds(phase.name, [int(v) for v in values],
                          phase.first_seed if phase.frozen else None)
    for seed in values:
      points += sweep.build_points(
          (*grid.axes, sweep.Axis(grid.seed_flag, (seed,))), directory,
          grid.total_rounds, name_prefix=grid.name,
          flags={**grid.flags, **{f: seed for f in grid.tied_seed_flags}},
          command=command)
  return list({p.run_dir: p for p in points}.values())


def _timings_path(experiment: Experiment, scale: str, root: str) -> str:
  return os.path.join(run_root(root, experiment, scale), TIMINGS_FILE)


def read_timings(experiment: Experiment, scale: str,
                 root: str) -> dict[str, float]:
  """Seconds each run of the paper's root took when it last ran to the end."""
  try:
    with open(_timings_path(experiment, scale, root)) as f:
      return {k: float(v) for k, v in json.load(f).items()}
  except FileNotFoundError:
    return {}


def _record_timing(experiment: Experiment, scale: str, root: str,
                   result: sweep.PointResult) -> None:
  """Adds a finished run's wall time to the paper's `timings.json`."""
  if result.status != 'succeeded' or result.elapsed_sec is None:
    return
  timings = read_timings(experiment, scale, root)
  timings[result.point.experiment_name] = round(result.elapsed_sec, 1)
  _write_timings(experiment, scale, root, timings)


def add_timings(experiment: Experiment, scale: str, root: str,
                timings: Mapping[str, float]) -> None:
  """Adds runs' wall times (restored runs': `reproduce.run_archive`) to the
  paper's `timings.json`, keeping those it holds."""
  if timings:
    _write_timings(experiment, scale, root,
                   {**timings, **read_timings(experiment, scale, root)})


def _write_timings(experiment: Experiment, scale: str, root: str,
                   timings: Mapping[str, float]) -> None:
  path = _timings_path(experiment, scale, root)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  release_managers.write_atomically(
      path, json.dumps(dict(sorted(timings.items())), indent=1))


def measure_in_subprocess(module: str, args: Sequence[str],
                          what: str) -> pd.DataFrame:
  """The CSV that `python -m <module> <args>` prints, as a frame: how a
  measured experiment measures (a subprocess, like every run, so that this
  process imports no algorithm and no TFF runtime).

  Raises:
    RuntimeError: If the measurement fails (with its last error line).
  """
  done = subprocess.run([sys.executable, '-m', module, *args], cwd=REPO_DIR,
                        capture_output=True, text=True, check=False)
  if done.returncode:
    lines = done.stderr.strip().splitlines() or ['(no output)']
    raise RuntimeError(f'measuring {what} failed: {lines[-1]}')
  return pd.read_csv(io.StringIO(done.stdout))


def measured_path(experiment: Experiment, scale: str, root: str) -> str:
  """Where a measured experiment's frame is kept."""
  return os.path.join(run_root(root, experiment, scale), experiment.name,
                      MEASURED_FILE)


def _measure(experiment: Experiment, scale: str, root: str,
             print_fn: Callable[[str], None]) -> None:
  start = time.monotonic()
  frame = experiment.measure(scale)
  path = measured_path(experiment, scale, root)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  release_managers.write_atomically(path, frame.to_csv(index=False))
  timings = read_timings(experiment, scale, root)
  timings[experiment.name] = round(time.monotonic() - start, 1)
  _write_timings(experiment, scale, root, timings)
  print_fn(f'measured: {path}')


def run_order(experiment: Experiment, points: Sequence[sweep.SweepPoint]
              ) -> list[sweep.SweepPoint]:
  """The order the points run in: grid order, except for an experiment
  timed one at a time (`max_parallel=1`), whose points run seed by seed
  (each seed's runs of every grid back to back, in grid order), so that the
  machine's drift over the sweep falls between seeds, which pairing by seed
  cancels, not between the algorithms compared."""
  if experiment.max_parallel != 1:
    return list(points)
  return sorted(points, key=lambda p: [
      float(v) for f, v in sorted(p.values.items()) if f.endswith('seed')])


def run_experiment(experiment: Experiment, scale: str, root: str,
                   seeds: Optional[int] = None, parallel: int = 2,
                   print_fn: Callable[[str], None] = print,
                   prestarter: Optional[prestart.Prestarter] = None,
                   phase: Optional[Phase] = None,
                   on_finished: Optional[Callable[[sweep.SweepPoint], None]]
                   = None,
                   ) -> list[sweep.PointResult]:
  """Runs the experiment's unfinished points (`parallel` at a time, at most
  `experiment.max_parallel`), recording each one's wall time as it ends; a
  measured experiment is measured again (it takes seconds). `prestarter`
  (`reproduce.sweep.run_sweep`) lets several experiments share its servers;
  `on_finished` is called with each point that runs to its end, after its
  wall time is recorded."""
  def on_result(result: sweep.PointResult) -> None:
    _record_timing(experiment, scale, root, result)
    if on_finished is not None and result.status == 'succeeded':
      on_finished(result.point)

  points = run_order(experiment, build_points(experiment, scale, root, seeds,
                                              phase=phase))
  if experiment.measure is not None and scale != PAPER_SMOKE:
    _measure(experiment, scale, root, print_fn)
  if experiment.max_parallel is not None:
    parallel = min(parallel, experiment.max_parallel)
  return sweep.run_sweep(
      points, parallel,
      log_dir=os.path.join(run_root(root, experiment, scale),
                           sweep.LOG_DIR_NAME),
      print_fn=print_fn,
      on_result=on_result, prestarter=prestarter)


def _counted(values: Sequence[str], unrecorded: str) -> str:
  """'a (3 runs); b (1 run)': each value with its count, most common first,
  `run_files.UNRECORDED` spelled `unrecorded`."""
  counts = collections.Counter(values)
  return '; '.join(f'{value} ({count} run{"" if count == 1 else "s"})'
                   for value, count in sorted(counts.items(),
                                              key=lambda kv: (-kv[1], kv[0]))
                   ).replace(run_files.UNRECORDED, unrecorded)


def code_sentence(finished: Sequence[sweep.SweepPoint]) -> str:
  """Which code made the finished runs, and in which environment, from
  their manifests (`run_files.Manifest.revisions`, `.environments`): each
  revision (or sequence of them for a run resumed by other code) and each
  environment, with its count of runs. Runs made before manifests recorded
  environments leave the environment unstated."""
  manifests = [run_files.Manifest(p.run_dir).read() for p in finished]
  sentence = (
      f'Code that made them (`{run_layout.MANIFEST_FILE}`): '
      + _counted([' then '.join(m.revisions()) for m in manifests],
                 'not recorded (made before runs recorded their code)') + '.')
  environments = [' then '.join(m.environments()) for m in manifests]
  if any(e != run_files.UNRECORDED for e in environments):
    sentence += (' Environment: '
                 + _counted(environments,
                            'not recorded (made before runs recorded it)')
                 + '.')
  return sentence


def load_finished_runs(points: Sequence[sweep.SweepPoint]) -> pd.DataFrame:
  """The tidy frame (`reproduce.analysis.load_runs`) of the finished points.

  Rounds past a point's `total_rounds` (a directory reused by a longer grid)
  are cut, so every run of a grid is read alike.

  Raises:
    ValueError: If no point has finished.
  """
  finished = [p for p in points if sweep.is_finished(p)]
  if not finished:
    raise ValueError('no run of this experiment has finished; run it first'
                     ' (without --report_only)')
  frames = []
  for point in finished:
    frame = analysis.load_run(point.run_dir)
    frames.append(frame[frame[analysis.ROUND] <= point.total_rounds])
  return pd.concat(frames, ignore_index=True, sort=False)


def paper_numbers(paper: str, experiment: str,
                  path: str = PAPER_NUMBERS_FILE) -> pd.DataFrame:
  """The paper's published numbers for one experiment, with their sources."""
  numbers = pd.read_csv(path, dtype={ROW: str, QUANTITY: str})
  return numbers[(numbers['paper'] == paper)
                 & (numbers['experiment'] == experiment)].drop(
                     columns=['paper', 'experiment']).reset_index(drop=True)


def over_seeds(per_run: pd.DataFrame, by: Sequence[str],
               values: Sequence[str]) -> pd.DataFrame:
  """Mean, std (ddof 1; NaN for one run) and count of `values` per `by`.

  NaN values (e.g. a run that never reached a target) are left out of the
  mean and the count.

  Returns:
    Long form: the `by` columns, `quantity`, `value`, `std`, `n`.
  """
  rows = []
  for key, group in per_run.groupby(list(by), sort=True, dropna=False):
    key = key if isinstance(key, tuple) else (key,)
    for column in values:
      column_values = group[column].astype(float).dropna()
      rows.append({**dict(zip(by, key)), QUANTITY: column,
                   VALUE: column_values.mean() if len(column_values) else np.nan,
                   STD: (column_values.std(ddof=1) if len(column_values) > 1
                         else np.nan),
                   NUM_RUNS: len(column_values)})
  return pd.DataFrame(rows)


def format_number(value: float, std: float = math.nan,
                  count: Optional[int] = None) -> str:
  """`12.3 ± 0.4 (n=5)`; `—` for NaN; integers without decimals."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    text = '—'
  else:
    text = _short(value)
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
      text += f' ± {_short(std)}'
  if count is not None and not (isinstance(count, float) and math.isnan(count)):
    text += f' (n={int(count)})'
  return text


def _short(value: float) -> str:
  value = float(value)
  if value == int(value) and abs(value) < 1e6:
    return str(int(value))
  magnitude = abs(value)
  if magnitude >= 100:
    return f'{value:.1f}'
  if magnitude >= 1:
    return f'{value:.2f}'
  return f'{value:.3g}'


def side_by_side(paper: pd.DataFrame, package: pd.DataFrame) -> pd.DataFrame:
  """Outer join of the paper's numbers and the package's on (row, quantity).

  A package row may name the paper's row it stands beside in a `paper_row`
  column (e.g. a digits run beside the paper's EMNIST-L row); otherwise, or
  where it is empty, its own `row` is matched.

  Returns:
    Columns `row`, `quantity`, `paper`, `package`, `source` (strings),
    the package's order first, then rows only the paper has.
  """
  package = package.copy().reset_index(drop=True)
  package['package'] = [format_number(v, s, n) for v, s, n in zip(
      package[VALUE], package[STD], package[NUM_RUNS])]
  key = package[ROW]
  if PAPER_ROW in package:
    key = package[PAPER_ROW].where(package[PAPER_ROW].notna(), package[ROW])
  package['_key'] = key
  package['_order'] = range(len(package))
  paper = paper.copy()
  paper['paper'] = [format_number(v, s) for v, s in zip(paper[VALUE],
                                                        paper[STD])]
  paper = paper.rename(columns={ROW: '_key'})
  merged = package[[ROW, '_key', QUANTITY, 'package', '_order']].merge(
      paper[['_key', QUANTITY, 'paper', SOURCE]], on=['_key', QUANTITY],
      how='outer', sort=False)
  merged[ROW] = merged[ROW].where(merged[ROW].notna(), merged['_key'])
  merged['_order'] = merged['_order'].fillna(
      pd.Series(range(len(package), len(package) + len(merged)),
                index=merged.index))
  merged = merged.sort_values('_order', kind='stable')
  return merged.fillna({'package': 'not run here', 'paper': '—',
                        SOURCE: ''})[
      [ROW, QUANTITY, 'paper', 'package', SOURCE]].reset_index(drop=True)


def markdown_table(frame: pd.DataFrame) -> str:
  header = '| ' + ' | '.join(frame.columns) + ' |'
  rule = '|' + '|'.join('---' for _ in frame.columns) + '|'
  lines = [header, rule]
  for row in frame.itertuples(index=False):
    lines.append('| ' + ' | '.join(str(v).replace('|', '\\|') for v in row)
                 + ' |')
  return '\n'.join(lines)


def command_line(experiment: Experiment, scale: str,
                 seeds: Optional[int],
                 phase: str = protocols.CONFIRMATORY) -> str:
  parts = ['python', '-m', 'reproduce', experiment.paper, experiment.name,
           f'--scale={scale}', f'--phase={phase}']
  if seeds is not None:
    parts.append(f'--seeds={seeds}')
  return shlex.join(parts)


def _training_seconds(frame: pd.DataFrame) -> float:
  columns = [c for c in run_layout.TIMING_COLUMNS if c in frame.columns]
  return float(frame[columns].sum().sum()) if columns else 0.0


VERDICT_FILE = 'verdict.json'


def _judged_phase(experiment: Experiment, scale: str, root: str,
                  seeds: Optional[int], phase: Phase,
                  measured: Optional[pd.DataFrame]
                  ) -> Optional[tuple[Verdict, list[sweep.SweepPoint],
                                      list[sweep.SweepPoint], pd.DataFrame]]:
  """(verdict, points, finished points, frame) of one phase's runs in
  `root`, or None when none of them has finished."""
  points = build_points(experiment, scale, root, seeds, phase=phase)
  finished = [p for p in points if sweep.is_finished(p)]
  if measured is not None and not points:
    frame = measured
  elif not finished:
    return None
  else:
    frame = load_finished_runs(points)
    if measured is not None:
      # Measured rows beside the runs' (their run columns empty), which
      # `analyze` and the effects tell apart by their own columns.
      frame = pd.concat([frame, measured], ignore_index=True)
  judged = judge(experiment, frame, scale, phase)
  if len(finished) < len(points):
    # A verdict is the whole design's: before its last run, none.
    judged = dataclasses.replace(
        judged, verdict=verdicts.INCOMPLETE,
        reason=f'{len(finished)} of the design\'s {len(points)} runs have'
               ' finished: no verdict until every one has (the effects'
               ' below are the finished runs\' so far, not a verdict).')
  return judged, points, finished, frame


def _effects_title(phase: str, found) -> str:
  judged, points, finished, _ = found
  if judged.verdict == verdicts.INCOMPLETE:
    return (f'Effects ({phase}, {len(finished)} of {len(points)} runs: not a'
            ' verdict)')
  return f'Effects ({phase})'


def _phase_record(found) -> Optional[dict]:
  """`verdict.json`'s entry for one phase (`_judged_phase`'s result)."""
  judged, points, finished, _ = found
  if judged.verdict == verdicts.INCOMPLETE:
    return {'verdict': verdicts.INCOMPLETE, 'finished': len(finished),
            'runs': len(points)}
  return _verdict_record(judged)


def _seed_range(experiment: Experiment, scale: str, phase: Phase,
                seeds: Optional[int]) -> str:
  setting = setting_for(experiment, scale, phase)
  count = seeds or setting.seeds
  firsts = [g.first_seed for g in setting.grids if g.seed_flag]
  if not firsts:
    return 'no seed axis'
  low = phase.first_seed + min(firsts)
  high = phase.first_seed + max(g.first_seed + min(count, g.max_seeds or count)
                                for g in setting.grids if g.seed_flag) - 1
  return f'seeds {low}-{high}'


def _effects_section(judged: Verdict, title: str) -> list[str]:
  if not judged.assessments:
    return []
  by_cell = [a.effect for a in judged.assessments
             if isinstance(a.effect, verdicts.Effect)
             and not a.effect.pairs_by_seed]
  pairing = ('seed' if not by_cell else
             'seed or, where the table counts cells, by a grid\'s cell (equal'
             f' {", ".join(by_cell[0].pair_flags)})')
  return [f'## {title}', '',
          'Each effect pairs the treatment\'s and the baseline\'s runs by'
          f' {pairing}. Intervals: 95 % (paired t; for a 0/1 outcome the'
          ' exact interval of the exact McNemar test), 90 % for an'
          ' equivalence (TOST). p: Holm-corrected over the primary effects;'
          ' a secondary effect\'s is its own.', '',
          markdown_table(verdicts.effects_table(judged.assessments)), '']


def _verdict_record(judged: Optional[Verdict]) -> Optional[dict]:
  if judged is None:
    return None
  return {'verdict': judged.verdict,
          'effects': verdicts.counts(judged.assessments),
          'secondary': sum(not a.primary for a in judged.assessments)}


def write_report(experiment: Experiment, scale: str, root: str,
                 output_dir: str, seeds: Optional[int] = None,
                 phase: Optional[Phase] = None) -> str:
  """Analyzes the finished runs and writes `<output_dir>/README.md` and
  `<output_dir>/verdict.json`.

  The report's verdict is its phase's (confirmatory: the frozen protocol's
  seeds). A confirmatory report also reads the exploratory runs it finds in
  `root` (development seeds) as exploratory, and every report carries its
  protocol and its history (`reproduce.history`).

  Returns:
    The report's path.

  Raises:
    ValueError: If no run has finished or the analysis cannot be made.
  """
  phase = phase or Phase()
  timings = read_timings(experiment, scale, root)
  measured = None
  if experiment.measure is not None:
    path = measured_path(experiment, scale, root)
    if not os.path.isfile(path):
      raise ValueError(f'{path} is missing; measure it first (without'
                       ' --report_only)')
    measured = pd.read_csv(path)
    measurement = (f'the measurement took'
                   f' {timings.get(experiment.name, math.nan):.1f} s'
                   f' (`{path}`)')
  found = _judged_phase(experiment, scale, root, seeds, phase, measured)
  if found is None:
    raise ValueError(f'no {phase.name} run of this experiment has finished;'
                     ' run it first (without --report_only)')
  judged, points, finished, frame = found
  incomplete = judged.verdict == verdicts.INCOMPLETE
  if measured is not None and not points:
    provenance = (
        f'Scale `{scale}`: no driver run; {measurement}.'
        ' Rerunning the command measures again and regenerates this report.')
  else:
    run_seconds = [timings[p.experiment_name] for p in finished
                   if p.experiment_name in timings]
    at_a_time = 'one' if experiment.max_parallel == 1 else 'two'
    provenance = (
        f'Scale `{scale}`: {len(finished)} of {len(points)} runs finished'
        f' (`{run_root(root, experiment, scale)}`). Each run\'s wall time'
        f' from the command line summed: {sum(run_seconds):.0f} s over'
        f' {len(run_seconds)} runs ({at_a_time} at a time by default); their'
        f' rounds and evaluations alone (`metrics.csv`):'
        f' {_training_seconds(frame):.0f} s. {code_sentence(finished)}'
        + (f' Besides the runs, {measurement}.' if measured is not None
           else '') +
        ' Rerunning the command skips finished runs'
        + (', measures again' if measured is not None else '') +
        ' and regenerates this report from their directories.')
  exploratory = None
  if phase.name == protocols.CONFIRMATORY and points:  # (seeds to tell apart)
    exploratory = _judged_phase(
        experiment, scale, root, seeds,
        Phase(protocols.EXPLORATORY, phase.protocol), measured)
  os.makedirs(output_dir, exist_ok=True)
  result = experiment.analyze(frame, output_dir)
  table = side_by_side(paper_numbers(experiment.paper, experiment.name),
                       result.table)
  setting = setting_for(experiment, scale, phase)
  package = verdicts.package_sentence(judged.assessments) or (
      'no effect declared.')
  report_path = os.path.join(output_dir, 'README.md')
  # The history is the committed report's (`results/`): read when writing
  # it there, referred to from a report written elsewhere.
  committed = _report_path(RESULTS_DIR, experiment)
  in_results = os.path.abspath(report_path) == os.path.abspath(committed)
  past = []
  if phase.protocol is not None and in_results:
    module = os.path.join(REPO_DIR, 'reproduce',
                          f'{experiment.paper}_experiments.py')
    past = history.of_report(REPO_DIR, committed, phase.protocol.path,
                             module, experiment.name)
  lines = [
      f'# {PAPER_TITLES[experiment.paper]}: {experiment.source}',
      '',
      f'**Paper:** {experiment.claim} ({experiment.source})',
      '',
      _protocol_line(experiment, scale, phase, seeds),
      '',
      f'**Package ({phase.name}{", so far" if incomplete else ""}):** at'
      f' scale `{scale}`, {package}',
      '',
      f'{VERDICT_PREFIX}{judged.verdict} ({phase.name}). {judged.reason}'
      f' (Rules: `{verdicts.RULES_DOC}`.)',
      '',
      _exploratory_line(phase, exploratory, past, experiment, scale, seeds),
      '',
      '```',
      command_line(experiment, scale, seeds, phase.name),
      '```',
      '',
      provenance,
      '',
  ]
  lines += _effects_section(judged, _effects_title(phase.name, found))
  if exploratory is not None:
    lines += _effects_section(exploratory[0], _effects_title(
        protocols.EXPLORATORY, exploratory))
  if setting.substitutes:
    lines += ['**What this scale substitutes for the paper\'s setting.** '
              + setting.substitutes, '']
  lines += ['## The paper beside the package', '',
            markdown_table(table), '',
            'Package values: mean ± standard deviation over the runs that'
            ' reached the quantity (n); "—": no run did.', '']
  if result.figures:
    lines += ['## Figures', '']
    lines += [f'![{name}]({name})' for name in result.figures] + ['']
  if result.notes:
    lines += ['## Reading', ''] + [note + '\n' for note in result.notes]
  if phase.protocol is not None:
    lines += ['## History', '',
              *(history.markdown(past) if in_results else [
                  'This report was written outside `results/`; the committed'
                  ' report\'s history is in'
                  f' `{os.path.relpath(committed, REPO_DIR)}`.']), '']
  release_managers.write_atomically(report_path,
                                    '\n'.join(lines).rstrip() + '\n')
  record = {
      'phase': phase.name, 'scale': scale,
      'protocol': (None if phase.protocol is None else {
          'sha256': phase.protocol.sha256,
          'version': phase.frozen['version'] if phase.frozen else None}),
      phase.name: _phase_record(found),
  }
  if exploratory is not None:
    record[protocols.EXPLORATORY] = _phase_record(exploratory)
  elif phase.name == protocols.CONFIRMATORY:
    # No development-seed run here: the last committed exploratory
    # version's verdict, as the report's Exploratory line says.
    before = _exploratory_versions(past)
    if before:
      record[protocols.EXPLORATORY] = {
          'verdict': before[-1].verdict + (
              ' (rules before protocols)'
              if before[-1].phase == history.BEFORE_PROTOCOLS else ''),
          'commit': before[-1].commit}
  release_managers.write_atomically(
      os.path.join(output_dir, VERDICT_FILE),
      json.dumps(record, indent=1) + '\n')
  return report_path


_HISTORY_HEADING = '\n## History\n'


def refresh_history(experiment: Experiment,
                    base_dir: str = RESULTS_DIR) -> str:
  """Rewrites the History section of the committed report (`results/`)
  from git, and gives a report written before protocols the line that
  says so (its verdict is exploratory). Returns the report's path.

  Raises:
    ValueError: If the report does not exist.
  """
  path = _report_path(base_dir, experiment)
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    raise ValueError(f'{path} does not exist') from None
  head = text.split(_HISTORY_HEADING)[0].rstrip()
  protocol_path = protocols.path_of(experiment.paper, experiment.name)
  if '**Protocol:**' not in head:
    status = (f'**Protocol:** [`{os.path.relpath(protocol_path, REPO_DIR)}`]'
              f'({os.path.relpath(protocol_path, os.path.dirname(path))})'
              f' ({_protocol_cell(experiment)}). This report was made before'
              ' protocols, on development seeds, by the earlier rules (a'
              ' Student-t interval for every quantity, two pairs enough, no'
              ' correction, direction mostly without size): its verdict is'
              ' exploratory. The confirmatory report (`--phase=confirmatory`)'
              ' replaces it.')
    paper_end = head.find('\n\n', head.find('**Paper:**'))
    head = head[:paper_end] + '\n\n' + status + head[paper_end:]
  module = os.path.join(REPO_DIR, 'reproduce',
                        f'{experiment.paper}_experiments.py')
  past = history.of_report(REPO_DIR, path, protocol_path, module,
                           experiment.name)
  release_managers.write_atomically(
      path, head + '\n' + _HISTORY_HEADING + '\n'
      + '\n'.join(history.markdown(past)) + '\n')
  return path


def _protocol_line(experiment: Experiment, scale: str, phase: Phase,
                   seeds: Optional[int]) -> str:
  if phase.protocol is None:
    return ('**Protocol:** none (this experiment has no protocol file:'
            ' exploratory only).')
  rel = os.path.relpath(phase.protocol.path, REPO_DIR)
  seed_range = _seed_range(experiment, scale, phase, seeds)
  if phase.frozen:
    commit = phase.frozen.get('commit')
    return (f'**Protocol:** [`{rel}`]({os.path.relpath(phase.protocol.path, os.path.join(RESULTS_DIR, experiment.paper, experiment.name))})'
            f' version {phase.frozen["version"]}, sha256'
            f' `{phase.protocol.sha256[:16]}`, frozen'
            f' {phase.frozen["frozen_at"]}'
            + (f' at commit `{commit[:7]}`' if commit else '')
            + (f'; confirmatory {seed_range}, drawn at the freeze.'
               if seed_range != 'no seed axis' else
               '; no seeds (a measurement).'))
  return (f'**Protocol:** `{rel}` (sha256 `{phase.protocol.sha256[:16]}`,'
          ' not frozen for this run: exploratory, development'
          f' {_seed_range(experiment, scale, phase, seeds)}).')


def _exploratory_line(phase: Phase, exploratory, past, experiment,
                      scale: str, seeds: Optional[int]) -> str:
  if phase.name == protocols.EXPLORATORY:
    return ('**Exploratory:** this report is exploratory (development'
            ' seeds); its verdict decides nothing until a frozen protocol'
            ' is run on confirmatory seeds.')
  if exploratory is not None:
    dev = _seed_range(experiment, scale,
                      Phase(protocols.EXPLORATORY, phase.protocol), seeds)
    return (f'**Exploratory:** {exploratory[0].verdict} on development'
            f' {dev} ({len(exploratory[2])} of its {len(exploratory[1])}'
            ' runs in this root), by the same'
            ' rules; see the exploratory effects below.')
  before = _exploratory_versions(past)
  if before:
    last = before[-1]
    return (f'**Exploratory:** no development-seed run in this root; the'
            f' last committed exploratory version said {last.verdict}'
            f' (`{last.commit}`, {last.date}, under the rules of its day;'
            ' see History).')
  return '**Exploratory:** none recorded.'


def _exploratory_versions(past: Sequence[history.Entry]
                          ) -> list[history.Entry]:
  """The committed versions (oldest first) that stated an exploratory
  verdict: made before protocols, or on development seeds; not an earlier
  confirmatory version (a rerun's predecessor)."""
  return [e for e in past if e.verdict != 'none stated'
          and e.phase != protocols.CONFIRMATORY]


def read_verdict(report_path: str) -> Optional[str]:
  """The verdict a report states (`VERDICT_PREFIX`), or None (no report, or
  one written before reports had verdicts)."""
  try:
    with open(report_path) as f:
      for line in f:
        if line.startswith(VERDICT_PREFIX):
          text = line[len(VERDICT_PREFIX):]
          return next((v for v in (*verdicts.VERDICTS, verdicts.INCOMPLETE)
                       if text.startswith(v)), None)
  except FileNotFoundError:
    pass
  return None


# The report's provenance states its runs' summed wall time so
# (`write_report`); `read_run_time` reads it back for the index.
_RUN_TIME = re.compile(r'wall time from the command line summed: (\d+) s over'
                       r' (\d+) runs')
_SCALE = re.compile(r'Scale `(\w+)`: \d+ of \d+ runs finished')


_CODE = re.compile(r'Code that made them \(`[^`]+`\): ([^\n]*?)\.(?: Environment|'
                   r' Rerunning| Besides|$)', re.M)
_REVISION = re.compile(r'git ([0-9a-f]{7,40})(\+modified)?')

# The code a driver run executes, as git pathspecs: its packages, the
# driver, its install and its lock (Bazel's BUILD files run nothing). Two
# revisions that agree on these make the same run of the same flags (a
# run's flags are its own record, checked against its grid's:
# `sweep.is_finished`); a report's text, a grid's code and the tests are
# not among them, nor is this definition (a change of it changes no run).
RUN_CODE = ('adabest_tff', 'experiment_driver', 'fl_common', 'fl_engine',
            'gel_tff', 'large_cohort', 'tasks', 'run_experiment.py',
            'setup.py', 'requirements', ':(exclude,glob)**/BUILD')


def read_code_revisions(report_path: str) -> list[str]:
  """The code revisions (short hashes, in order of first mention) that a
  report says made its runs (`code_sentence`), a run of a work tree with
  uncommitted changes as `<hash>+modified`; [] when it says none."""
  try:
    with open(report_path) as f:
      found = _CODE.search(f.read())
  except FileNotFoundError:
    return []
  if not found:
    return []
  return list(dict.fromkeys(
      revision[:7] + modified
      for revision, modified in _REVISION.findall(found.group(1))))


def _has_this_run_code(revision: str) -> Optional[bool]:
  """Whether `revision`'s run code (`RUN_CODE`) is this
  checkout's (HEAD's); None when that cannot be told: a revision not in
  this history, or a run of uncommitted changes."""
  changed = _run_code_changed_since(revision)
  return None if changed is None else not changed


def _run_code_changed_since(revision: str) -> Optional[tuple[str, ...]]:
  """The files of `RUN_CODE` that differ between `revision` and this
  checkout's HEAD; None when that cannot be told (as `_has_this_run_code`)."""
  if revision.endswith('+modified'):
    return None
  head = history.git(REPO_DIR, 'rev-parse', 'HEAD')
  return _changed_run_code(REPO_DIR, revision, (head or '').strip())


@functools.lru_cache(maxsize=256)
def _changed_run_code(repo: str, revision: str,
                      head: str) -> Optional[tuple[str, ...]]:
  """`_run_code_changed_since` at a known HEAD (cached: an archive's runs
  share a few revisions)."""
  if not head or history.git(
      repo, 'cat-file', '-e', f'{revision}^{{commit}}') is None:
    return None
  changed = history.git(repo, 'diff', '--name-only', revision, head,
                        '--', *RUN_CODE)
  return None if changed is None else tuple(changed.split())


def is_this_run_code(recorded: str) -> bool:
  """Whether a run's recorded revision (`run_layout.code_revision`: `git
  <commit>`, `git <commit>+modified`, an installed version, `unknown`) is
  a commit of this history with this checkout's run code (`RUN_CODE`)."""
  found = re.fullmatch(r'git ([0-9a-f]{7,40})(\+modified)?', recorded)
  return bool(found) and _has_this_run_code(
      found.group(1) + (found.group(2) or '')) is True


def _code_sentence_of_pass(report_paths: Sequence[str]) -> str:
  """Which code revisions made the driver runs of the confirmatory reports
  at `report_paths`, each with its count of reports; whether that is one
  revision (the confirmatory pass "at one commit") or not yet; and, when
  not, which revisions run this commit's run code (`RUN_CODE`)
  and how many reports have a run of other code (those to rerun). ''
  when no report has driver runs. A revision that is not in this
  repository's history (a commit of a session that never landed) is said
  so."""
  counts: collections.Counter = collections.Counter()
  of_revision = {}  # revision -> its reports
  for report in report_paths:
    revisions = read_code_revisions(report)
    counts.update(revisions)
    for revision in revisions:
      of_revision.setdefault(revision, []).append(report)
  reports = len({r for made in of_revision.values() for r in made})
  if not reports:  # a measured report without driver runs states none
    return ''
  this_code = {r: _has_this_run_code(r) for r in counts}
  def named(revision: str) -> str:
    if revision.endswith('+modified'):
      return f'{revision} (uncommitted changes)'
    if this_code[revision] is None:
      return f'{revision} (not in this history)'
    return revision
  def reports_of(n: int) -> str:
    return f'{n} report{"" if n == 1 else "s"}'
  listed = '; '.join(
      f'{named(r)} ({reports_of(n)})'
      for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
  one = len(counts) == 1
  sentence = (f' The {reports} confirmatory reports\' runs were made by'
              f' {len(counts)} revision{"" if one else "s"} of the code'
              f' (their manifests, as each report states): {listed}')
  if one:
    (revision,) = counts
    if this_code[revision] is False:  # one pass, but not of HEAD's code
      changed = _run_code_changed_since(revision)
      return sentence + (
          f'. One pass at one commit, whose run code is not this'
          f' commit\'s: {len(changed)} file{"" if len(changed) == 1 else "s"}'
          f' of `RUN_CODE` changed since (`git diff {revision} HEAD --'
          ' RUN_CODE`), so a run made at this commit need not give these'
          ' numbers; rerunning the reports here (`--rerun_other_code`)'
          ' would make them of this commit.')
    return sentence + '.'
  same = sorted(r for r, same in this_code.items() if same)
  other = {report for r, same in this_code.items() if not same
           for report in of_revision[r]}
  code = ('this commit\'s run code (the files a run executes: `RUN_CODE`'
          ' in `reproduce/core.py`)')
  sentence += ('; a report whose runs span revisions is counted under each.'
               ' Not yet one pass at one commit: '
               + (f'{", ".join(same)} ha{"s" if len(same) == 1 else "ve"}'
                  f' {code}' if same else f'none of them has {code}'))
  if other:
    named_reports = ', '.join(sorted(
        ' '.join(os.path.normpath(path).split(os.sep)[-3:-1])
        for path in other))
    return sentence + (f'; the {reports_of(len(other))} with runs of other'
                       f' or unknown code ({named_reports}) are rerun from'
                       ' their frozen protocols to make it one.')
  return sentence + ('; the runs are of one code, and rerunning the reports'
                     ' made at other commits would make them of one'
                     ' commit.')


def read_run_time(report_path: str) -> Optional[tuple[int, float]]:
  """(runs, their summed wall time in seconds) a report states, or None (no
  report, or a measured experiment with no driver run)."""
  try:
    with open(report_path) as f:
      found = _RUN_TIME.search(f.read())
  except FileNotFoundError:
    return None
  return (int(found.group(2)), float(found.group(1))) if found else None


def _report_scale(report_path: str) -> Optional[str]:
  """The scale a report's runs were made at, as its provenance states."""
  try:
    with open(report_path) as f:
      found = _SCALE.search(f.read())
  except FileNotFoundError:
    return None
  return found.group(1) if found else None


def _distinct_runs(experiments: Sequence[Experiment],
                   base_dir: str) -> tuple[int, int, float]:
  """(runs in the grids of the reports that state their runs, distinct runs
  among them, an estimate of the distinct runs' summed seconds).

  Reports of one paper share a run directory when their grids hold the same
  flags, so a run two reports read runs once, but each report's stated time
  counts it. Reports state only their sums, so a run already counted by an
  earlier report is taken out at the mean run time of the report that reads
  it again: an estimate, stated as one."""
  total, distinct, seconds = 0, set(), 0.0
  for e in experiments:
    report = _report_path(base_dir, e)
    scale = _report_scale(report)
    if scale is None:
      continue
    points = {p.run_dir for p in build_points(e, scale, root='/runs')}
    total += len(points)
    run_time = read_run_time(report)
    if run_time is not None and points:
      seconds += run_time[1] * len(points - distinct) / len(points)
    distinct |= points
  return total, len(distinct), seconds


def _report_path(base_dir: str, experiment: Experiment) -> str:
  return os.path.join(base_dir, experiment.paper, experiment.name,
                      'README.md')


def read_verdict_record(report_path: str) -> Optional[dict]:
  """The report's `verdict.json` (`write_report`), or None for a report
  written before reports had one."""
  try:
    with open(os.path.join(os.path.dirname(report_path), VERDICT_FILE)) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def _phase_verdicts(report: str) -> tuple[str, str]:
  """(confirmatory, exploratory) verdicts of a report as the index shows
  them: from its `verdict.json`; a report written before protocols has no
  confirmatory verdict, and its stated one is exploratory."""
  record = read_verdict_record(report)
  if record is None:
    stated = read_verdict(report)
    return ('not run yet', f'{stated} (rules before protocols)' if stated
            else 'none stated')
  get = lambda phase: (record.get(phase) or {}).get('verdict')
  return (get(protocols.CONFIRMATORY) or 'not run yet',
          get(protocols.EXPLORATORY) or '—')


def _protocol_cell(experiment: Experiment) -> str:
  """'v2 frozen', or 'draft' (a protocol not frozen yet)."""
  try:
    protocol = protocols.load(experiment.paper, experiment.name)
    records = protocols.versions(protocol)
  except ValueError:
    return 'none'
  if not records:
    return 'draft'
  latest = records[-1]
  changed = '' if latest['sha256'] == protocol.sha256 else ', changed since'
  return f'v{latest["version"]} frozen{changed}'


def _report_cell(base_dir: str, experiment: Experiment,
                 link_prefix: str) -> tuple[str, str, str]:
  """(confirmatory verdict, exploratory verdict, link) of an experiment's
  report under `base_dir`."""
  report = _report_path(base_dir, experiment)
  if not os.path.isfile(report):
    return ('not run yet', '—', f'not run yet: `python -m reproduce {experiment.paper}'
                      f' {experiment.name}`')
  confirmatory, exploratory = _phase_verdicts(report)
  target = f'{link_prefix}{experiment.name}/README.md'
  return confirmatory, exploratory, f'[{target}]({target})'


def write_index(experiments: Sequence[Experiment], base_dir: str,
                paper: str) -> str:
  """`<base_dir>/<paper>/README.md`: the paper's experiments, each linked to
  its report (with its verdict) or given the command that makes it; and
  `<base_dir>/README.md` over every paper (`write_results_index`)."""
  lines = [f'# {PAPER_TITLES[paper]}: reproductions', '',
           'One report per table or figure, each regenerated by its command'
           ' (`python -m reproduce`, see the repository README); the paper\'s'
           ' numbers are in `reproduce/paper_numbers.csv`; verdicts follow'
           f' `{verdicts.RULES_DOC}`.', '',
           '| experiment | reproduces | confirmatory | exploratory | report |',
           '|---|---|---|---|---|']
  for e in experiments:
    if e.paper != paper:
      continue
    confirmatory, exploratory, link = _report_cell(base_dir, e, '')
    lines.append(f'| `{e.name}` | {e.source} | {confirmatory} |'
                 f' {exploratory} | {link} |')
  path = os.path.join(base_dir, paper, 'README.md')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  release_managers.write_atomically(path, '\n'.join(lines) + '\n')
  write_results_index(experiments, base_dir)
  return path


def _effect_counts(base_dir: str, experiments: Sequence[Experiment],
                   phase: str) -> collections.Counter:
  """Primary effects per verdict over the reports' `verdict.json`s."""
  counts = collections.Counter()
  for e in experiments:
    record = read_verdict_record(_report_path(base_dir, e)) or {}
    for verdict, n in ((record.get(phase) or {}).get('effects') or {}).items():
      counts[verdict] += n
  return counts


def _counted_verdicts(counts: Mapping[str, int], order: Sequence[str]) -> str:
  """'2 REPRODUCED, 1 REVERSED': `order`'s verdicts first, then any other
  (a report's verdict under earlier rules)."""
  keys = [v for v in order if counts.get(v)] + sorted(
      v for v in counts if v not in order and v != '—' and counts[v])
  return ', '.join(f'{counts[v]} {v}' for v in keys) or 'none'


def write_results_index(experiments: Sequence[Experiment],
                        base_dir: str) -> str:
  """`<base_dir>/README.md`: every report's confirmatory and exploratory
  verdicts, and the counts of reports and of primary effects."""
  rows = []
  reports = {protocols.CONFIRMATORY: collections.Counter(),
             protocols.EXPLORATORY: collections.Counter()}
  seconds = collections.Counter()  # paper -> its reports' runs summed
  made = []  # the reports' paths
  for e in experiments:
    confirmatory, exploratory, link = _report_cell(base_dir, e,
                                                   f'{e.paper}/')
    reports[protocols.CONFIRMATORY][confirmatory] += 1
    if confirmatory != 'not run yet':
      made.append(_report_path(base_dir, e))
    reports[protocols.EXPLORATORY][exploratory] += 1
    run_time = read_run_time(_report_path(base_dir, e))
    if run_time is not None:
      seconds[e.paper] += run_time[1]
    runs = ('—' if run_time is None
            else f'{run_time[0]}, {run_time[1] / 3600:.1f} h')
    rows.append(f'| {e.paper} | `{e.name}` | {e.source} |'
                f' {_protocol_cell(e)} | {confirmatory} | {exploratory} |'
                f' {runs} | {link} |')
  frozen = sum(protocols.is_frozen(e.paper, e.name) for e in experiments)
  legacy = sum(n for v, n in reports[protocols.EXPLORATORY].items()
               if v.endswith('(rules before protocols)'))
  summary = {phase: _counted_verdicts(
      counts, (*verdicts.VERDICTS, verdicts.INCOMPLETE, 'not run yet'))
      for phase, counts in reports.items()}
  effects = {phase: _counted_verdicts(
      _effect_counts(base_dir, experiments, phase), verdicts.EFFECT_VERDICTS)
      for phase in reports}
  total_seconds = sum(seconds.values())
  by_paper = ', '.join(f'{paper} {seconds[paper] / 3600:.1f} h'
                       for paper in dict.fromkeys(e.paper for e in experiments)
                       if seconds[paper])
  grid_runs, distinct, distinct_seconds = _distinct_runs(experiments,
                                                         base_dir)
  lines = ['# Reproductions: every report and its verdict', '',
           f'{len(rows)} reports. **Confirmatory** (a frozen protocol run on'
           f' its confirmatory seeds): {summary[protocols.CONFIRMATORY]};'
           f' their primary effects: {effects[protocols.CONFIRMATORY]}.'
           f' **Exploratory** (development seeds):'
           f' {summary[protocols.EXPLORATORY]}; their primary effects:'
           f' {effects[protocols.EXPLORATORY]}.'
           + f' Protocols: {frozen} of {len(rows)} frozen'
           + (', the others drafts under revision (exploratory only).'
              if frozen < len(rows) else '.')
           + (f' {legacy} exploratory verdicts were made before protocols,'
              ' by earlier rules (direction, the paper\'s size in few'
              ' effects, Student-t intervals for 0/1 outcomes, two pairs'
              ' enough, no correction); they stay in each report\'s'
              ' history.' if legacy else '')
           + ' Each verdict is computed by the rules of'
           f' `{verdicts.RULES_DOC}`; `make reproduce` runs the'
           ' confirmatory pass and keeps each experiment\'s finished runs'
           ' beside its report (`local_confirmatory.tar.xz`), from which'
           ' `--report_only --runs_archive=results` regenerates it.'
           + _code_sentence_of_pass(made), '',
           'Runs: each report\'s finished runs and their wall times summed'
           f' ({total_seconds / 3600:.1f} h over the reports'
           + (f': {by_paper}' if by_paper else '') +
           f'). A run two reports read is counted in each: the reports\''
           f' grids hold {distinct:,} distinct runs of {grid_runs:,}.'
           ' Counting each run once (a shared run is taken out of the later'
           ' report that reads it at that report\'s mean run time: an'
           ' estimate), the runs take about'
           f' {distinct_seconds / 3600:.1f} h; two run at a time, so'
           ' `make reproduce` into one empty directory takes about'
           f' {distinct_seconds / 7200:.1f} h on 2 cores.',
           '', '| paper | experiment | reproduces | protocol | confirmatory |'
           ' exploratory | runs | report |',
           '|---|---|---|---|---|---|---|---|', *rows]
  path = os.path.join(base_dir, 'README.md')
  os.makedirs(base_dir, exist_ok=True)
  release_managers.write_atomically(path, '\n'.join(lines) + '\n')
  return path
