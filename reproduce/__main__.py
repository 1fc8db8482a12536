"""python -m reproduce PAPER [EXPERIMENT ...] [--scale=local|paper|smoke]
                     [--phase=confirmatory|exploratory]
                     [--launcher=local|slurm [--wait]] [--status]
python -m reproduce freeze PAPER EXPERIMENT [EXPERIMENT ...]
python -m reproduce history PAPER [EXPERIMENT ...]

Runs each named experiment's grid of driver runs (finished runs skipped,
unfinished ones resumed, `--parallel` at a time) and writes its report: the
paper's numbers beside the package's, its figures and its history. `PAPER`
may be `all`; no `EXPERIMENT` means every experiment of the paper. `--list`
lists them.

Phases (`reproduce.protocol`): `exploratory` (the default) runs development
seeds, for developing a setup; `confirmatory` (what `make reproduce` runs)
needs the experiment's protocol frozen and unchanged, and runs its frozen
version's confirmatory seeds. `freeze` freezes protocols; `history`
rewrites committed reports' histories from git.

Launchers: `local` (the default) runs the grid here, `--parallel` at a
time; `slurm` submits its unfinished runs as one SLURM job array through
submitit (`reproduce.cluster`, docs/cluster.md) and returns, or with
`--wait` shows progress and writes the report when the grid is done.
`--status` shows a grid's runs (finished, running, pending, failed) from
the run directories and `squeue`.

`--runs_archive=DIR` keeps each experiment's finished runs in one file
(`reproduce.run_archive`): a grid cut off on one machine resumes on another,
and a report regenerates from the committed runs alone. With
`--rerun_other_code`, archived runs made by other run code are made again
(a report brought to this commit's code, into an empty run directory).

Confirmatory reports go to `results/<paper>/<experiment>/` at the local
scale (the committed evidence); other reports under
`<root_output_dir>/reports/<phase>/<scale>/`, unless `--report_dir` says
where.
"""

import argparse
import os
import sys
import tarfile
import time
from collections.abc import Sequence
from typing import Optional

from experiment_driver import prestart
from fl_engine import runtime
import reproduce
from reproduce import cluster
from reproduce import launching
from reproduce import core
from reproduce import plan
from reproduce import run_archive
from reproduce import protocol as protocols



def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m reproduce',
      description=__doc__.split('\n\n')[1].replace('\n', ' '))
  parser.add_argument('paper', nargs='?',
                      help=f'One of {", ".join(reproduce.PAPERS)} or all.')
  parser.add_argument('experiments', nargs='*', metavar='EXPERIMENT',
                      help='Experiments of the paper (default: all).')
  parser.add_argument('--scale', default='local', choices=core.SCALES)
  parser.add_argument('--phase', default=protocols.EXPLORATORY,
                      choices=protocols.PHASES,
                      help='confirmatory: the frozen protocol\'s seeds;'
                      ' exploratory: development seeds.')
  parser.add_argument('--protocols_dir', default=protocols.PROTOCOLS_DIR,
                      help='Where the protocols are (default: the'
                      ' package\'s).')
  parser.add_argument('--seeds', type=int, default=None,
                      help='Seeds per grid point, exploratory only (default:'
                      ' the protocol\'s, else the scale\'s).')
  parser.add_argument('--root_output_dir', default=core.DEFAULT_ROOT,
                      help='Root of the run directories.')
  parser.add_argument('--report_dir', default=None,
                      help='Where reports go (one subdirectory per'
                      ' experiment under <report_dir>/<paper>/).')
  parser.add_argument('--parallel', type=int, default=None,
                      help='Runs at once (local launcher; default 2).')
  parser.add_argument('--launcher', default='local',
                      choices=cluster.LAUNCHERS,
                      help='local: run here; slurm: one SLURM job per run.')
  parser.add_argument('--plan', action='store_true',
                      help='List the grid\'s runs and estimate their'
                      ' device-hours from the committed benchmark; run'
                      ' nothing.')
  parser.add_argument('--status', action='store_true',
                      help='Show each grid\'s runs (finished, running,'
                      ' pending, failed) and exit.')
  slurm = parser.add_argument_group(
      'slurm launcher', 'Per run (one task of the job array); defaults by'
      ' --scale: ' + '; '.join(
          f'{scale} {r.cpus_per_run} CPUs, {r.gpus_per_run} GPUs,'
          f' {r.mem_gb:g} GB, {r.time_min} min'
          for scale, r in cluster.DEFAULT_RESOURCES.items()) + '.')
  slurm.add_argument('--wait', action='store_true',
                     help='Block with a progress bar until the grid is done,'
                     ' then write the report.')
  slurm.add_argument('--partition', default=None)
  slurm.add_argument('--gpus_per_run', type=int, default=None,
                     help='GPUs per run (--gpus-per-node).')
  slurm.add_argument('--cpus_per_run', type=int, default=None)
  slurm.add_argument('--mem_gb', type=float, default=None)
  slurm.add_argument('--time_min', type=int, default=None,
                     help='Time limit per job; a run that reaches it is'
                     ' requeued and resumes.')
  slurm.add_argument('--array_parallelism', type=int, default=None,
                     help='Tasks of the array running at once.')
  slurm.add_argument('--sbatch', action='append', default=[],
                     metavar='NAME=VALUE',
                     help='Another sbatch option (repeat: --sbatch=account=lab'
                     ' --sbatch=qos=high).')
  slurm.add_argument('--setup', action='append', default=[], metavar='LINE',
                     help='A shell line run before each run (module load,'
                     ' venv activation); repeat for more.')
  slurm.add_argument('--poll_seconds', type=float, default=None,
                     help='How often --wait reads the queue (default 15).')
  parser.add_argument('--report_only', action='store_true',
                      help='Run nothing; report from the finished runs.')
  parser.add_argument('--runs_archive', default=None, metavar='DIR',
                      help='Keep each experiment\'s finished runs (metrics,'
                      ' flags, manifest) in one file under DIR: missing runs'
                      ' are restored from it first, each run that finishes'
                      ' is added (reproduce.run_archive). With'
                      ' --report_only: report from it, and add the runs on'
                      ' disk.')
  parser.add_argument('--rerun_other_code', action='store_true',
                      help='With --runs_archive: restore no archived run of'
                      ' the phase that runs whose code differs from this'
                      ' checkout\'s run code (RUN_CODE in reproduce/core.py);'
                      ' the grid makes those runs again, and each replaces'
                      ' its old run in the archive as it finishes. Needs a'
                      ' --root_output_dir without finished runs of other'
                      ' code.')
  parser.add_argument('--dry_run', action='store_true',
                      help='Print each run\'s command and status; run and'
                      ' write nothing.')
  parser.add_argument('--list', action='store_true',
                      help='List the experiments and exit.')
  return parser


def _select(paper: Optional[str], names: Sequence[str]):
  if paper is None:
    raise ValueError('name a paper (or all) and optionally experiments;'
                     ' --list lists them')
  if paper != 'all' and paper not in reproduce.PAPERS:
    raise ValueError(f'unknown paper {paper!r}; papers:'
                     f' {", ".join(reproduce.PAPERS)}, all')
  if paper == 'all':
    if names:
      raise ValueError('with all, name no experiment')
    return list(reproduce.EXPERIMENTS.values())
  known = [name for p, name in reproduce.EXPERIMENTS if p == paper]
  unknown = [name for name in names if name not in known]
  if unknown:
    raise ValueError(f'unknown experiment(s) {", ".join(unknown)} of'
                     f' {paper}; its experiments: {", ".join(known)}')
  return [reproduce.EXPERIMENTS[(paper, name)] for name in (names or known)]


def report_dir(args, experiment: core.Experiment) -> str:
  if args.report_dir:
    base = args.report_dir
  elif args.scale == 'local' and args.phase == protocols.CONFIRMATORY:
    base = core.RESULTS_DIR
  else:
    base = os.path.join(args.root_output_dir, 'reports', args.phase,
                        args.scale)
  return os.path.join(base, experiment.paper, experiment.name)


def _check_protocols_dir(path: str) -> None:
  if not os.path.isdir(path):
    raise ValueError(f'--protocols_dir={path} is not a directory')


def _freeze(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m reproduce freeze',
      description='Freezes protocols: records each one\'s SHA-256, the commit'
      ' that holds it and its confirmatory seeds (reproduce.protocol).')
  parser.add_argument('paper')
  parser.add_argument('experiments', nargs='+', metavar='EXPERIMENT')
  parser.add_argument('--protocols_dir', default=protocols.PROTOCOLS_DIR)
  parser.add_argument('--dry_run', action='store_true',
                      help='Check each protocol and print what its freeze'
                      ' would record; write nothing.')
  args = parser.parse_args(argv)
  try:
    experiments = _select(args.paper, args.experiments)
    _check_protocols_dir(args.protocols_dir)
    loaded = [(e, protocols.load(e.paper, e.name, args.protocols_dir))
              for e in experiments]
    for e, protocol in loaded:
      record = protocols.freeze(protocol, e, dry_run=args.dry_run)
      if args.dry_run and record.get('already'):
        print(f'frozen already: {protocol.path} version {record["version"]},'
              f' sha256 {record["sha256"][:16]}')
        continue
      if args.dry_run:
        print(f'would freeze: {protocol.path} as version {record["version"]},'
              f' sha256 {record["sha256"][:16]}, confirmatory seeds from'
              f' {record["first_seed"]}')
        continue
      print(f'frozen: {protocol.path} version {record["version"]}, sha256'
            f' {record["sha256"][:16]}, commit {record["commit"] or "none"},'
            f' confirmatory seeds from {record["first_seed"]}')
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


def _history(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m reproduce history',
      description='Rewrites each committed report\'s History section from'
      ' git (reproduce.history), running nothing.')
  parser.add_argument('paper')
  parser.add_argument('experiments', nargs='*', metavar='EXPERIMENT')
  args = parser.parse_args(argv)
  try:
    for e in _select(args.paper, args.experiments):
      print(f'history: {core.refresh_history(e)}')
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
  # Importing the library imports TFF; this process runs no computation
  # (each run is a driver subprocess), so TFF's default context goes now,
  # before argparse may exit on bad arguments.
  runtime.refuse_unmanaged_default_context()
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ['freeze']:
    return _freeze(argv[1:])
  if argv[:1] == ['history']:
    return _history(argv[1:])
  args = _parser().parse_args(argv)
  try:
    if args.list:
      for e in reproduce.EXPERIMENTS.values():
        print(f'{e.paper:13} {e.name:18} {e.source}')
      return 0
    launching.check_flags(args)
    if args.report_only and args.dry_run:
      raise ValueError('--report_only and --dry_run exclude each other')
    experiments = _select(args.paper, args.experiments)
    _check_protocols_dir(args.protocols_dir)
    if args.rerun_other_code and (args.runs_archive is None
                                  or args.report_only):
      raise ValueError('--rerun_other_code does nothing without'
                       ' --runs_archive or with --report_only (it chooses'
                       ' which archived runs are made again)')
    if args.runs_archive is not None:
      if not args.runs_archive.strip():
        raise ValueError('--runs_archive needs a directory, got an empty'
                         ' value')
      if args.dry_run or args.plan or args.status:
        raise ValueError('--runs_archive does nothing with --dry_run, --plan'
                         ' or --status (they write no run)')
      if args.launcher == 'slurm':
        raise ValueError('--runs_archive does nothing with --launcher=slurm'
                         ' (its jobs write the run directories): archive'
                         ' the finished grid with --report_only'
                         ' --runs_archive=DIR')
      if args.scale == core.PAPER_SMOKE:
        raise ValueError('--runs_archive does nothing at --scale=paper_smoke'
                         ' (its runs are not reported)')
    if args.scale == core.PAPER_SMOKE and (
        args.phase == protocols.CONFIRMATORY or args.seeds is not None or
        args.report_only):
      raise ValueError('--scale=paper_smoke checks that the paper-scale'
                       ' commands run, one round each: it takes no'
                       ' --phase=confirmatory, --seeds or --report_only')
    if args.seeds is not None and args.phase == protocols.CONFIRMATORY:
      raise ValueError('--seeds: a confirmatory run takes its protocol\'s'
                       ' seed count (change the protocol and freeze it'
                       ' again, or run --phase=exploratory)')
    if args.paper == 'all' and args.phase == protocols.CONFIRMATORY:
      # `all` confirms what is frozen; the rest is named, not run.
      unfrozen = [e for e in experiments if not protocols.is_frozen(
          e.paper, e.name, args.protocols_dir)]
      for e in unfrozen:
        print(f'not frozen, not run: {e.paper} {e.name} (exploratory only'
              ' until its protocol is frozen)')
      experiments = [e for e in experiments if e not in unfrozen]
    if args.launcher == 'slurm' and not args.status:
      experiments = launching.clusterable(experiments, args.paper == 'all',
                                         args.scale)
    # Every protocol is checked and every grid built before anything runs.
    phases = {(e.paper, e.name): core.phase_for(e, args.phase, args.scale,
                                                args.protocols_dir)
              for e in experiments}
    points = {(e.paper, e.name): core.build_points(
        e, args.scale, args.root_output_dir, args.seeds,
        phase=phases[(e.paper, e.name)]) for e in experiments}
    if args.seeds is not None and not any(points.values()):
      raise ValueError('--seeds does nothing here: no selected experiment'
                       ' has driver runs (each is measured)')
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if args.plan:
    try:
      planned = [plan.lines(f'{e.paper} {e.name} --scale={args.scale}',
                            points[(e.paper, e.name)]) for e in experiments]
    except ValueError as error:
      print(f'error: {error}', file=sys.stderr)
      return 2
    for lines in planned:
      print('\n'.join(lines))
    return 0
  if args.status:
    return launching.status(args, experiments, points)
  if args.launcher == 'slurm':
    return launching.launch_on_slurm(args, experiments, phases, points,
                                     _run_and_report)
  if args.dry_run:
    for e in experiments:
      if e.measure:
        print(f'{e.paper} {e.name}: measured'
              + ('' if points[(e.paper, e.name)] else ', no driver run'))
      for point in points[(e.paper, e.name)]:
        status = 'finished' if core.sweep.is_finished(point) else 'to run'
        print(f'{e.paper} {e.name}: {status:8}'
              f'  {core.sweep.shlex.join(point.command)}')
    return 0
  # One prestarter for all the experiments: its servers import the driver
  # once, not once per experiment (`experiment_driver.prestart`).
  with prestart.Prestarter() as prestarter:
    return _run_and_report(args, experiments, phases, prestarter)


def _run_and_report(args, experiments, phases, prestarter) -> int:
  """Runs (unless `--report_only`) and reports each experiment in turn."""
  failed = False
  for e in experiments:
    phase = phases[(e.paper, e.name)]
    print(f'== {e.paper} {e.name}: {e.source} ({args.scale}, {phase.name})',
          flush=True)
    try:
      kept = run_archive.restore_read(
          args.runs_archive, e, args.scale, args.root_output_dir, args.seeds,
          phase, rerun_other_code=args.rerun_other_code
      ) if args.runs_archive is not None else []
    except (ValueError, OSError, tarfile.TarError) as error:
      print(f'error: {e.paper} {e.name}: {error}', file=sys.stderr)
      failed = True
      continue
    on_finished = None
    if kept:
      points, archive = kept[0]  # the phase that runs
      def on_finished(_, points=points, archive=archive, e=e):
        run_archive.save(points, archive, core.read_timings(
            e, args.scale, args.root_output_dir))
    if not args.report_only:
      start = time.monotonic()
      results = core.run_experiment(e, args.scale, args.root_output_dir,
                                    args.seeds, args.parallel,
                                    prestarter=prestarter, phase=phase,
                                    on_finished=on_finished)
      if results or not e.measure:
        for line in core.sweep.summary_lines(results):
          print(line)
      print(f'{time.monotonic() - start:.0f} s', flush=True)
      failed |= any(r.status == 'failed' for r in results)
    run_archive.save_read(kept, e, args.scale, args.root_output_dir)
    if args.scale == core.PAPER_SMOKE:
      print('paper_smoke: the runs only, no report', flush=True)
      continue
    try:
      directory = report_dir(args, e)  # <base>/<paper>/<experiment>
      path = core.write_report(e, args.scale, args.root_output_dir,
                               directory, args.seeds, phase)
      print(f'report: {path}', flush=True)
      core.write_index(list(reproduce.EXPERIMENTS.values()),
                       os.path.dirname(os.path.dirname(directory)), e.paper)
    except ValueError as error:
      print(f'error: {e.paper} {e.name}: {error}', file=sys.stderr)
      failed = True
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
