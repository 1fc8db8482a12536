"""Runs grids of experiments as ordinary run directories.

    python -m reproduce.sweep --preset=cohort --total_rounds=1500 \
        --root_output_dir=/tmp/fl_papers --axis=seed:0,1,2,3,4 \
        -- --task=emnist --server_optimizer=adam

A grid is a base command (default `python run_experiment.py`) plus named axes,
each a driver flag and its values; every point of their product is one
`<command> <driver flags> --<axis>=<value>... --root_output_dir=...
--experiment_name=<name> --total_rounds=...` process, run one after
another or `--parallel=N` at a time. Flags after `--` go to every point.
A run of the driver forks from a Python that has imported the driver
already (`experiment_driver.prestart`), which saves most of each run's start.

The experiment name is derived from the grid values
(`<prefix>__<flag>=<value>__...`), so rerunning the sweep finds each point's
run directory again: a point whose `metrics.csv` already reaches
`--total_rounds` is skipped; any other is run, and the driver resumes it from
its last checkpoint. A failing point is reported (its name, exit code and last
line of stderr; full output in `<root_output_dir>/sweep_logs/`) and does not
stop the others; the sweep then exits with code 1.

Presets are the grids of Charles et al. (2021) (SPEC.md §1):

* `cohort`: M over {1, 10, 50, 100, 200, 400, 800} (Figures 2-5, 15-27).
* `learning_rate`: client and server learning rates over
  {10^i : -3 <= i <= 1} at M = 10 (appendix A.4; use with
  `--axis=seed:0,1,2,3,4` for the paper's 5 trials).
* `local_steps`: batch size 1, local steps {1, 2, 4, ..., 256} (as
  `--max_elements_per_client`) x M {16, 32, ..., 1024} (Section 5.5,
  Figure 13).
* `straggler`: M over {10, 50, 100, 200, 400, 800} x straggler λ over
  {0.1, 1, 10, 100} (appendix B.5, Figures 28-31).

`--axis` adds axes to a preset (or makes the whole grid without one);
`--dry_run` prints the commands without running them.

Why one module: a point's name, its command, when its run directory counts
as finished (its last round, written with the point's flags) and how the
runner skips, resumes or reports it are one contract; `reproduce` builds
on all of it.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import itertools
import json
import math
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from experiment_driver import prestart
from fl_common import default_context
from fl_common import run_layout

_REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COMMAND = (sys.executable, os.path.join(_REPO_DIR, 'run_experiment.py'))
DEFAULT_ROOT_OUTPUT_DIR = '/tmp/fl_papers'  # the driver's default
LOG_DIR_NAME = 'sweep_logs'
# Flags the sweep sets itself for every point.
RESERVED_FLAGS = ('root_output_dir', 'experiment_name', 'total_rounds')
_FLAG_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
_UNSAFE_IN_NAME = re.compile(r'[^A-Za-z0-9._=+-]')


@dataclasses.dataclass(frozen=True)
class Axis:
  """A driver flag and the values the grid gives it (as on a command line)."""

  flag: str
  values: tuple[str, ...]

  def __post_init__(self):
    if not _FLAG_NAME.match(self.flag):
      raise ValueError(f'axis flag must be a flag name, got {self.flag!r}')
    if not self.values:
      raise ValueError(f'axis {self.flag!r} has no values')
    if len(set(self.values)) != len(self.values):
      raise ValueError(f'axis {self.flag!r} repeats a value: {self.values}')


@dataclasses.dataclass(frozen=True)
class Preset:
  """A paper grid: its axes and the flags fixed for all its points."""

  axes: tuple[Axis, ...]
  flags: Mapping[str, str]


def _powers_of_two(low: int, high: int) -> tuple[str, ...]:
  return tuple(str(2**i) for i in range(low.bit_length() - 1,
                                        high.bit_length()))


LEARNING_RATES = ('0.001', '0.01', '0.1', '1', '10')  # {10^i : -3 <= i <= 1}
PRESETS = {
    'cohort': Preset(
        axes=(Axis('clients_per_round',
                   ('1', '10', '50', '100', '200', '400', '800')),),
        flags={}),
    'learning_rate': Preset(
        axes=(Axis('client_learning_rate', LEARNING_RATES),
              Axis('server_learning_rate', LEARNING_RATES)),
        flags={'clients_per_round': '10'}),
    'local_steps': Preset(
        axes=(Axis('clients_per_round', _powers_of_two(16, 1024)),
              Axis('max_elements_per_client', _powers_of_two(1, 256))),
        flags={'train_batch_size': '1', 'client_epochs': '1'}),
    'straggler': Preset(
        axes=(Axis('clients_per_round',
                   ('10', '50', '100', '200', '400', '800')),
              Axis('straggler_lambda', ('0.1', '1', '10', '100'))),
        flags={}),
}


@dataclasses.dataclass(frozen=True)
class SweepPoint:
  """One run of the grid."""

  experiment_name: str
  values: Mapping[str, str]  # axis flag -> value
  command: tuple[str, ...]
  run_dir: str
  total_rounds: int


@dataclasses.dataclass(frozen=True)
class PointResult:
  point: SweepPoint
  status: str  # 'skipped' (already finished), 'succeeded' or 'failed'
  exit_code: Optional[int] = None
  last_error_line: str = ''
  elapsed_sec: Optional[float] = None  # wall time of the subprocess, if run


def parse_axis(text: str) -> Axis:
  """`'flag:v1,v2,...'` -> `Axis('flag', ('v1', 'v2', ...))`."""
  flag, sep, values = text.partition(':')
  if not sep:
    raise ValueError(f"an axis is 'flag:value,value,...', got {text!r}")
  return Axis(flag.strip(), tuple(v.strip() for v in values.split(',')
                                  if v.strip()))


def parse_driver_flags(args: Sequence[str]) -> dict[str, Optional[str]]:
  """`['--task=emnist', '--noclipping']` -> `{'task': 'emnist', ...}`.

  A flag without `=` (a boolean such as `--noclipping`) maps to None.
  """
  parsed = {}
  for arg in args:
    name, sep, value = arg[2:].partition('=') if arg.startswith('--') else (
        '', '', '')
    if not _FLAG_NAME.match(name):
      raise ValueError(f'driver flags must be --name=value or --name, got'
                       f' {arg!r}')
    parsed[name] = value if sep else None
  return parsed


def _name_part(flag: str, value: str) -> str:
  return _UNSAFE_IN_NAME.sub('_', f'{flag}={value}')


def build_points(axes: Sequence[Axis],
                 root_output_dir: str,
                 total_rounds: int,
                 name_prefix: str = 'sweep',
                 flags: Optional[Mapping[str, Optional[str]]] = None,
                 command: Sequence[str] = DEFAULT_COMMAND) -> list[SweepPoint]:
  """The grid's points, the last axis varying fastest.

  Args:
    axes: The grid's axes (distinct flags).
    root_output_dir: Where the run directories go.
    total_rounds: Rounds of every run; a point is finished when its
      `metrics.csv` reaches this round.
    name_prefix: Start of every experiment name.
    flags: Driver flags given to every point (`None` value: a bare flag).
    command: The program and its leading arguments.

  Raises:
    ValueError: For no axes, a repeated axis flag, a flag that is both fixed
      and an axis, a reserved flag (`root_output_dir`, `experiment_name`,
      `total_rounds`), `total_rounds` < 1, an empty command or prefix.
  """
  flags = dict(flags or {})
  axis_flags = [axis.flag for axis in axes]
  if not axes:
    raise ValueError('a sweep needs at least one axis (--preset or --axis)')
  if len(set(axis_flags)) != len(axis_flags):
    raise ValueError(f'axis flags repeat: {axis_flags}')
  both = sorted(set(axis_flags) & set(flags))
  if both:
    raise ValueError(f'flag(s) {", ".join(both)} are both an axis and fixed')
  reserved = sorted(set(RESERVED_FLAGS) & (set(axis_flags) | set(flags)))
  if reserved:
    raise ValueError(f'the sweep sets {", ".join(reserved)} itself; use its'
                     ' own options')
  if total_rounds < 1:
    raise ValueError(f'total_rounds must be >= 1, got {total_rounds}')
  if not command:
    raise ValueError('command must not be empty')
  if not name_prefix or _UNSAFE_IN_NAME.search(name_prefix):
    raise ValueError('name_prefix must be non-empty letters, digits or ._=+-,'
                     f' got {name_prefix!r}')
  fixed_args = [f'--{name}' if value is None else f'--{name}={value}'
                for name, value in flags.items()]
  points = []
  for values in itertools.product(*(axis.values for axis in axes)):
    assignment = dict(zip(axis_flags, values))
    name = '__'.join([name_prefix, *itertools.starmap(_name_part,
                                                      assignment.items())])
    points.append(SweepPoint(
        experiment_name=name,
        values=assignment,
        command=(*command, *fixed_args,
                 *(f'--{flag}={value}' for flag, value in assignment.items()),
                 f'--root_output_dir={root_output_dir}',
                 f'--experiment_name={name}',
                 f'--total_rounds={total_rounds}'),
        run_dir=os.path.join(root_output_dir, name),
        total_rounds=total_rounds))
  names = [p.experiment_name for p in points]
  if len(set(names)) != len(names):
    raise ValueError('two points get the same experiment name (values that'
                     f' differ only in characters replaced by _): {names}')
  return points


def _same_value(recorded: object, text: str) -> bool:
  """Whether a flag's value in `hparams.json` is the one `--flag=text` set."""
  if isinstance(recorded, bool):
    return text.lower() in (('true', '1') if recorded else ('false', '0'))
  if isinstance(recorded, (int, float)):
    try:
      return math.isclose(float(recorded), float(text), rel_tol=1e-9)
    except ValueError:
      return False
  if isinstance(recorded, list):
    return [str(v) for v in recorded] == [v.strip() for v in text.split(',')]
  return str(recorded) == text


def conflicting_flags(point: SweepPoint) -> list[str]:
  """The flags of `point.command` that its run directory's `hparams.json`
  records with another value (none if it has no such file)."""
  try:
    with open(os.path.join(point.run_dir, run_layout.HPARAMS_FILE)) as f:
      recorded = json.load(f)
  except FileNotFoundError:
    return []
  conflicts = []
  for argument in point.command:
    name, sep, text = argument[2:].partition('=')
    if (argument.startswith('--') and sep and name in recorded and
        name not in RESERVED_FLAGS and
        not _same_value(recorded[name], text)):
      conflicts.append(name)
  return conflicts


def is_finished(point: SweepPoint) -> bool:
  """Whether the point's `metrics.csv` holds its last round, written by a
  run of the point's flags. A run directory of the same name with other
  flags (a grid whose rates changed) is not this point's: running the point
  then ends in the driver's refusal to resume it, rather than its results
  standing for the point's."""
  try:
    with open(os.path.join(point.run_dir, run_layout.METRICS_FILE), newline='') as f:
      rounds = [float(row[run_layout.ROUND_COLUMN]) for row in csv.DictReader(f)]
  except (FileNotFoundError, KeyError, ValueError):
    return False
  return (bool(rounds) and max(rounds) >= point.total_rounds and
          not conflicting_flags(point))


def tail_lines(path: str, count: int) -> list[str]:
  """The last `count` non-blank lines of a log (none if it is missing)."""
  try:
    with open(path, errors='replace') as f:
      lines = [line.rstrip() for line in f if line.strip()]
  except FileNotFoundError:
    return []
  return lines[-count:]


def last_line(path: str) -> str:
  lines = tail_lines(path, 1)
  return lines[0].strip() if lines else ''


def _run_point(point: SweepPoint, log_dir: str,
               prestarter: prestart.Prestarter) -> PointResult:
  stdout_path = os.path.join(log_dir, f'{point.experiment_name}.stdout')
  stderr_path = os.path.join(log_dir, f'{point.experiment_name}.stderr')
  start = time.monotonic()
  try:
    exit_code = prestarter.run(point.command, stdout_path, stderr_path)
  except OSError as e:  # the command cannot be started at all
    return PointResult(point, 'failed', None, f'{type(e).__name__}: {e}')
  elapsed = time.monotonic() - start
  if exit_code == 0:
    return PointResult(point, 'succeeded', 0, elapsed_sec=elapsed)
  return PointResult(point, 'failed', exit_code, last_line(stderr_path),
                     elapsed_sec=elapsed)


def run_sweep(points: Sequence[SweepPoint],
              parallel: int = 1,
              log_dir: Optional[str] = None,
              print_fn: Callable[[str], None] = print,
              on_result: Optional[Callable[[PointResult], None]] = None,
              prestarter: Optional[prestart.Prestarter] = None,
              ) -> list[PointResult]:
  """Runs the unfinished points, `parallel` at a time, in grid order.

  Args:
    points: From `build_points`.
    parallel: How many subprocesses run at once.
    log_dir: Where each point's stdout/stderr go; default
      `<root_output_dir>/sweep_logs` of the first point.
    print_fn: Receives one line per event.
    on_result: Called with each run point's result as it ends (one at a
      time), so that what a sweep records survives its interruption.
    prestarter: Runs the points (and is left open), so that several sweeps
      share its servers; default: one of the sweep's own, closed at its end.

  Returns:
    One result per point, in the order of `points`.

  Raises:
    ValueError: If `parallel` < 1.
  """
  if parallel < 1:
    raise ValueError(f'parallel must be >= 1, got {parallel}')
  if not points:
    return []
  log_dir = log_dir or os.path.join(os.path.dirname(points[0].run_dir),
                                    LOG_DIR_NAME)
  os.makedirs(log_dir, exist_ok=True)
  lock = threading.Lock()
  width = len(str(len(points)))

  def report(index: int, text: str) -> None:
    with lock:
      print_fn(f'[{index + 1:>{width}}/{len(points)}]'
               f' {points[index].experiment_name}: {text}')

  def run(index: int) -> PointResult:
    point = points[index]
    if is_finished(point):
      report(index, 'skipped, already finished')
      return PointResult(point, 'skipped')
    report(index, 'running' + (' (resuming)' if os.path.isdir(point.run_dir)
                               else ''))
    result = _run_point(point, log_dir, prestarter)
    if on_result is not None:
      with lock:
        on_result(result)
    if result.status == 'succeeded':
      report(index, 'done')
    else:
      report(index, f'FAILED (exit {result.exit_code}):'
                    f' {result.last_error_line}')
    return result

  with contextlib.ExitStack() as stack:
    if prestarter is None:
      prestarter = stack.enter_context(prestart.Prestarter())
    pool = stack.enter_context(
        concurrent.futures.ThreadPoolExecutor(max_workers=parallel))
    return list(pool.map(run, range(len(points))))


def summary_lines(results: Sequence[PointResult]) -> list[str]:
  """A count per status and one line per failed point."""
  counts = {status: sum(r.status == status for r in results)
            for status in ('skipped', 'succeeded', 'failed')}
  lines = [f'sweep: {len(results)} points, ' + ', '.join(
      f'{count} {status}' for status, count in counts.items())]
  lines += [f'failed: {r.point.experiment_name} (exit {r.exit_code}):'
            f' {r.last_error_line}' for r in results if r.status == 'failed']
  return lines


def _axis_argument(text: str) -> Axis:
  try:
    return parse_axis(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from e


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m reproduce.sweep',
      usage='%(prog)s [options] [-- driver flags]',
      description=__doc__.split('\n\n')[0])
  parser.add_argument('--preset', choices=sorted(PRESETS),
                      help='A grid of the paper (see module docstring).')
  parser.add_argument('--axis', action='append', type=_axis_argument,
                      default=[],
                      metavar='FLAG:V1,V2,...',
                      help='An axis; repeat for more (added to the preset).')
  parser.add_argument('--total_rounds', type=int, required=True,
                      help='Rounds per run (finished points are skipped).')
  parser.add_argument('--root_output_dir', default=DEFAULT_ROOT_OUTPUT_DIR,
                      help='Root of the run directories.')
  parser.add_argument('--name_prefix', default=None,
                      help='Experiment-name prefix; default: the preset name'
                      ' or "sweep".')
  parser.add_argument('--parallel', type=int, default=1,
                      help='Points run at once.')
  parser.add_argument('--command', default=shlex.join(DEFAULT_COMMAND),
                      help='The driver command (shell-quoted).')
  parser.add_argument('--dry_run', action='store_true',
                      help='Print the commands and whether each point is'
                      ' finished; run nothing.')
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the sweep; returns 0, 1 if a point failed, 2 for bad options."""
  default_context.refuse_unmanaged_default_context()  # runs subprocesses
  argv = list(sys.argv[1:] if argv is None else argv)
  split = argv.index('--') if '--' in argv else len(argv)
  args = _parser().parse_args(argv[:split])  # exits with code 2 if bad
  try:
    preset = PRESETS[args.preset] if args.preset else Preset((), {})
    flags = {**preset.flags, **parse_driver_flags(argv[split + 1:])}
    points = build_points(
        axes=(*preset.axes, *args.axis),
        root_output_dir=args.root_output_dir,
        total_rounds=args.total_rounds,
        name_prefix=args.name_prefix or args.preset or 'sweep',
        flags=flags,
        command=shlex.split(args.command))
    if args.dry_run:
      for point in points:
        status = 'finished' if is_finished(point) else 'to run'
        print(f'{status:8}  {shlex.join(point.command)}')
      return 0
    results = run_sweep(points, args.parallel)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for line in summary_lines(results):
    print(line)
  return 1 if any(r.status == 'failed' for r in results) else 0


if __name__ == '__main__':
  sys.exit(main())
