"""What `python -m reproduce` does with `--launcher`, `--status` and
`--plan`'s flags: which combinations it refuses, and the slurm launcher's
submit, wait and report (`reproduce.cluster` does the submitting and reads
the states; `reproduce.__main__` parses and dispatches)."""

import dataclasses
import math
import os
import sys
from collections.abc import Callable

from reproduce import cluster
from reproduce import core

# Flags that only the slurm launcher reads.
_SLURM_FLAGS = ('wait', 'partition', 'gpus_per_run', 'cpus_per_run', 'mem_gb',
                'time_min', 'array_parallelism', 'sbatch', 'setup',
                'poll_seconds')


def check_flags(args) -> None:
  """Refuses flags that would do nothing with the chosen launcher or mode."""
  given = [name for name in _SLURM_FLAGS
           if getattr(args, name) not in (None, False, [])]
  if args.plan:
    others = [name for name in ('status', 'report_only', 'dry_run')
              if getattr(args, name)] + given
    if others or args.parallel is not None:
      raise ValueError(f'--plan runs nothing; --'
                       f'{(others or ["parallel"])[0]} does nothing with it')
    return
  if args.status:
    for name in ('report_only', 'dry_run'):
      if getattr(args, name):
        raise ValueError(f'--status runs nothing; --{name} does nothing'
                         ' with it')
    if given or args.parallel is not None:
      raise ValueError(f'--status runs nothing; --'
                       f'{(given or ["parallel"])[0]} does nothing with it')
    return
  if args.launcher == 'local':
    if given:
      raise ValueError(f'--{given[0]} does nothing with --launcher=local'
                       ' (it is for --launcher=slurm)')
    if args.parallel is None:
      args.parallel = 2
    if args.parallel < 1:
      raise ValueError(f'--parallel must be >= 1, got {args.parallel}')
    return
  if args.parallel is not None:
    raise ValueError('--parallel does nothing with --launcher=slurm (each'
                     ' run is a job; --array_parallelism caps how many run'
                     ' at once)')
  if args.report_only:
    raise ValueError('--report_only runs nothing: --launcher does nothing'
                     ' with it')
  if args.dry_run and args.wait:
    raise ValueError('--dry_run submits nothing: --wait does nothing with it')
  base = cluster.DEFAULT_RESOURCES[args.scale]
  chosen = {name: getattr(args, name) for name in (
      'partition', 'gpus_per_run', 'cpus_per_run', 'mem_gb', 'time_min',
      'array_parallelism') if getattr(args, name) is not None}
  args.resources = dataclasses.replace(
      base, **chosen,
      sbatch=tuple(cluster.parse_sbatch_option(o) for o in args.sbatch),
      setup=tuple(args.setup))
  if args.poll_seconds is not None and not (
      math.isfinite(args.poll_seconds) and args.poll_seconds > 0):
    raise ValueError(f'--poll_seconds must be a finite number > 0, got'
                     f' {args.poll_seconds}')
  if args.poll_seconds is not None and not args.wait:
    raise ValueError('--poll_seconds does nothing without --wait')


def clusterable(experiments, skip: bool, args_scale: str):
  """The experiments a cluster may run: not those that time their runs side
  by side on one machine. Named ones are refused; with `all`, skipped with
  a line."""
  kept = []
  for e in experiments:
    if args_scale != core.PAPER_SMOKE and (e.max_parallel == 1 or
                                          e.measure is not None):
      why = (f'{e.paper} {e.name} times its runs side by side on one machine'
             ' (its figures compare those timings)')
      if not skip:
        raise ValueError(f'{why}: run it with --launcher=local')
      print(f'not launched on the cluster: {why}; run it with'
            ' --launcher=local')
      continue
    kept.append(e)
  return kept


def _log_dir(args, e) -> str:
  return os.path.join(core.run_root(args.root_output_dir, e, args.scale),
                      core.sweep.LOG_DIR_NAME)


def _folder(args, e) -> str:
  return cluster.folder_for(
      core.run_root(args.root_output_dir, e, args.scale), e.name)


def status(args, experiments, points) -> int:
  for e in experiments:
    statuses = cluster.status(points[(e.paper, e.name)], _folder(args, e),
                              _log_dir(args, e))
    for line in cluster.status_lines(f'{e.paper} {e.name}', statuses,
                                     _log_dir(args, e)):
      print(line)
  return 0


def launch_on_slurm(args, experiments, phases, points,
                    run_and_report: Callable[..., int]) -> int:
  """Submits each experiment's unfinished runs as a job array; with
  `--wait`, waits for them and writes the reports."""
  title = lambda e: f'{e.paper} {e.name}'
  if args.dry_run:
    for e in experiments:
      todo = [p for p in points[(e.paper, e.name)]
              if not core.sweep.is_finished(p)]
      print(f'# {title(e)}: {len(todo)} runs to submit as one job array'
            f' (of {len(points[(e.paper, e.name)])}); each task runs one of:')
      for p in todo:
        print(f'#   {core.sweep.shlex.join(p.command)}')
      if todo:
        print(cluster.sbatch_script(_folder(args, e), args.resources,
                                    f'{e.paper}-{e.name}', len(todo)))
    return 0
  try:
    for e in experiments:
      done = cluster.launch(points[(e.paper, e.name)], _folder(args, e),
                            _log_dir(args, e), args.resources,
                            f'{e.paper}-{e.name}')
      arrays = sorted({job.split('_')[0] for job in done.submitted.values()})
      print(f'{title(e)}: submitted {len(done.submitted)} runs'
            + (f' as job {", ".join(arrays)}' if arrays else '')
            + f'; {len(done.queued_already)} queued already,'
            f' {len(done.finished)} finished', flush=True)
  except ValueError as error:
    print(f'error: {error}', file=sys.stderr)
    return 2
  if not args.wait:
    again = ' '.join(['python -m reproduce', args.paper, *args.experiments,
                      f'--scale={args.scale}'])
    print(f'{again} --status shows their progress; {again} --report_only'
          ' writes the reports when they are done')
    return 0
  failed = False
  for e in experiments:
    statuses = cluster.wait(points[(e.paper, e.name)], _folder(args, e),
                            _log_dir(args, e), title(e),
                            poll_seconds=args.poll_seconds or 15.0)
    for line in cluster.status_lines(title(e), statuses, _log_dir(args, e)):
      print(line)
    failed |= any(s.state in (cluster.FAILED, cluster.STOPPED)
                  for s in statuses)
  args.report_only = True
  return max(int(failed), run_and_report(args, experiments, phases, None))
