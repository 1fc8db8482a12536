"""A grid's runs as a SLURM job array, submitted through submitit.

    python -m reproduce gel table1 --launcher=slurm [--wait]
    python -m reproduce gel table1 --status

`launch` makes every unfinished run of a grid (`reproduce.sweep.SweepPoint`)
one task of a job array. A task runs exactly the point's command, the one the
local launcher runs, in the same run directory, with its output in the same
`sweep_logs/<run>.stdout|.stderr` (appended, one header per attempt): a
finished run is skipped and an unfinished one resumes from its last
checkpoint wherever it ran before. What is decided where:

* **Preemption and time limits.** Jobs are submitted with `--requeue` and
  submitit's `--signal=USR2@90`. On USR2 (preemption, or the time limit
  near) `RunJob.checkpoint` stops the driver with SIGTERM (the driver keeps
  its last checkpoint and exits) and submitit requeues the task; a task
  requeued by SLURM itself (`scontrol requeue`, a preempting partition)
  gets SIGTERM, the driver stops the same way, and the restarted task runs
  the same command again, which resumes. Either way the resumed run's
  `metrics.csv` equals an uninterrupted one's (the driver's resume
  contract, `tests/reproduce/test_cluster.py` on a real cluster).
* **Nothing runs twice.** A launch holds `<folder>/launch.lock` while it
  reads what is queued and submits; runs whose tasks are still in `squeue`
  are not submitted again. A task whose run directory is held by another
  live run (another launch, a local run) exits 0 saying so: the driver
  refuses the directory with `outputs.EXIT_LOCKED`.
* **States without accounting.** Many clusters (and the test cluster) run
  without `slurmdbd`, where `sacct` answers nothing and submitit's own job
  states are unreliable. States are read instead from the run directories
  (finished), `squeue` (pending, running) and the record each task writes
  when its command ends (`sweep_logs/<run>.job.json`: failed, with its exit
  code, or stopped); submitit's state polling is never used.

Experiments that time their runs side by side (`max_parallel=1`, or a
measurement) are refused: their figures compare timings taken on one machine.

Why one module: what a task writes when its command ends, what a launch
records, and how states are read back from both and `squeue` are one
contract; split, each half would restate the other's file names and
states.
"""

import contextlib
import dataclasses
import datetime
import fcntl
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Optional

import submitit

from reproduce import sweep

LAUNCHERS = ('local', 'slurm')
LAUNCHES_FILE = 'launches.json'
JOB_RECORD_SUFFIX = '.job.json'
# The driver's exit code for a run directory held by another live run
# (`experiment_driver.outputs.EXIT_LOCKED`; not imported: a task imports
# nothing of TensorFlow's).
EXIT_LOCKED = 75
# How many times a task that reaches its time limit is requeued: each
# requeue resumes from the last checkpoint, so this bounds the wall time
# a run may take, not the work lost.
MAX_TIMEOUT_REQUEUES = 20

# States of a run, as `status` reports them.
FINISHED, RUNNING, PENDING, FAILED, STOPPED, UNKNOWN, TO_RUN = (
    'finished', 'running', 'pending', 'failed', 'stopped',
    'submitted (squeue does not answer)', 'to run')
STATES = (FINISHED, RUNNING, PENDING, FAILED, STOPPED, UNKNOWN, TO_RUN)


@dataclasses.dataclass(frozen=True)
class Resources:
  """What one run asks the cluster for (one task of the array)."""

  partition: Optional[str] = None  # None: the cluster's default partition
  gpus_per_run: int = 0
  cpus_per_run: int = 2
  mem_gb: float = 4.0
  time_min: int = 180
  array_parallelism: int = 256  # tasks of the array running at once
  sbatch: tuple[tuple[str, str], ...] = ()  # other sbatch options
  setup: tuple[str, ...] = ()  # shell lines before the run (module load...)

  def __post_init__(self):
    for name in ('cpus_per_run', 'time_min', 'array_parallelism'):
      if getattr(self, name) < 1:
        raise ValueError(f'--{name} must be >= 1, got {getattr(self, name)}')
    if self.gpus_per_run < 0:
      raise ValueError(f'--gpus_per_run must be >= 0, got {self.gpus_per_run}')
    if not (math.isfinite(self.mem_gb) and self.mem_gb > 0):
      raise ValueError(f'--mem_gb must be a finite number > 0, got'
                       f' {self.mem_gb}')


# Per scale: a smoke run takes minutes on a CPU; a local-scale run up to an
# hour or two on two cores; a paper-scale run (EMNIST CNN or Stack Overflow
# LSTM, cohorts up to 800, 1,500+ rounds) a day on one GPU. A run that
# outlives its limit is requeued and resumes (`MAX_TIMEOUT_REQUEUES`).
DEFAULT_RESOURCES = {
    'smoke': Resources(cpus_per_run=1, mem_gb=2, time_min=30),
    'paper_smoke': Resources(cpus_per_run=1, mem_gb=3, time_min=30),
    'local': Resources(cpus_per_run=2, mem_gb=4, time_min=180),
    'paper': Resources(gpus_per_run=1, cpus_per_run=8, mem_gb=32,
                       time_min=24 * 60),
}


def parse_sbatch_option(text: str) -> tuple[str, str]:
  """`'account=lab'` or `'--account=lab'` -> `('account', 'lab')`;
  `'exclusive'` -> `('exclusive', '')`."""
  name, _, value = text.lstrip('-').partition('=')
  if not name or not all(c.isalnum() or c in '-_' for c in name):
    raise ValueError(f'--sbatch takes an sbatch option as name=value, got'
                     f' {text!r}')
  return name.replace('_', '-'), value


def executor_parameters(resources: Resources, name: str) -> dict:
  """submitit `SlurmExecutor.update_parameters` for `resources`."""
  extra = {'requeue': True}
  extra.update({k: (v if v else True) for k, v in resources.sbatch})
  parameters = dict(
      job_name=name,
      time=resources.time_min,
      cpus_per_task=resources.cpus_per_run,
      mem=f'{int(resources.mem_gb * 1024)}MB',
      array_parallelism=resources.array_parallelism,
      additional_parameters=extra,
      setup=list(resources.setup),
      stderr_to_stdout=False,
  )
  if resources.partition:
    parameters['partition'] = resources.partition
  if resources.gpus_per_run:
    # The in-process runtime places rounds on the GPUs the job sees
    # (SLURM sets CUDA_VISIBLE_DEVICES for its gres).
    parameters['gpus_per_node'] = resources.gpus_per_run
  return parameters


class _ScriptOnlyExecutor(submitit.SlurmExecutor):
  """A `SlurmExecutor` that writes scripts where no `srun` is on PATH (a
  dry run on a laptop): submitit's refuses to start there. It submits
  nothing; `launch` uses submitit's own."""

  @classmethod
  def affinity(cls) -> int:
    return 1


def _executor(folder: str, resources: Resources, name: str,
              executor_class=submitit.SlurmExecutor
              ) -> submitit.SlurmExecutor:
  executor = executor_class(folder=folder,
                            max_num_timeout=MAX_TIMEOUT_REQUEUES)
  executor.update_parameters(**executor_parameters(resources, name))
  return executor


def sbatch_script(folder: str, resources: Resources, name: str,
                  tasks: int) -> str:
  """The sbatch script a launch of `tasks` runs submits.

  Below submitit's public API (its executor's script text, with the array
  size it sets while submitting): its public API submits but does not show
  the script, and a dry run must print exactly what would be submitted,
  with or without SLURM on this machine.
  """
  executor = _executor(folder, resources, name, _ScriptOnlyExecutor)
  if tasks > 1:
    executor.parameters['map_count'] = tasks
  return executor._make_submission_file_text(  # pylint: disable=protected-access
      executor._submitit_command_str, 'dry_run')  # pylint: disable=protected-access


def _write_json_atomically(path: str, value) -> None:
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=1)
    f.write('\n')
  os.replace(tmp, path)


def job_record_path(log_dir: str, name: str) -> str:
  return os.path.join(log_dir, name + JOB_RECORD_SUFFIX)


class RunJob(submitit.helpers.Checkpointable):
  """One array task: the point's command, as the local launcher runs it."""

  def __init__(self):
    self._child = None

  def __getstate__(self):
    return {}  # a process is not pickled into the requeued submission

  def __setstate__(self, state):
    del state
    self._child = None

  def __call__(self, name: str, command: Sequence[str], log_dir: str) -> str:
    os.makedirs(log_dir, exist_ok=True)
    job = os.environ.get('SLURM_ARRAY_JOB_ID')
    job_id = (f'{job}_{os.environ.get("SLURM_ARRAY_TASK_ID")}' if job else
              os.environ.get('SLURM_JOB_ID', 'local'))
    attempt = int(os.environ.get('SLURM_RESTART_COUNT', '0') or 0)
    header = (f'== {name}: job {job_id}, attempt {attempt + 1}, on'
              f' {socket.gethostname()} at {_now()}\n')
    print(header.strip(), flush=True)
    stdout = os.path.join(log_dir, f'{name}.stdout')
    stderr = os.path.join(log_dir, f'{name}.stderr')
    with open(stdout, 'a') as out, open(stderr, 'a') as err:
      out.write(header)
      err.write(header)
      out.flush()
      err.flush()
      # SLURM sends the time limit's and preemption's USR2 to every
      # process of the job: the driver ignores it (its default action
      # would kill it mid-round) and is stopped by `checkpoint` instead.
      self._child = subprocess.Popen(
          list(command), stdout=out, stderr=err,
          preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
      code = self._child.wait()
    record = {'run': name, 'job': job_id, 'attempt': attempt + 1,
              'host': socket.gethostname(), 'exit_code': code, 'at': _now()}
    if code == 0:
      state = FINISHED
    elif code == EXIT_LOCKED:
      state = 'locked'
    elif code in (128 + 15, 128 + 1, -15):  # SIGTERM, SIGHUP: stopped
      state = STOPPED
    else:
      state = FAILED
    record['state'] = state
    if state != 'locked':  # the holder's own job writes the record
      _write_json_atomically(job_record_path(log_dir, name), record)
    if state == 'locked':
      message = (f'{name}: its run directory is in use by another run; this'
                 ' job runs nothing (the run is not run twice)')
      print(message, flush=True)
      return message
    if state == FAILED:
      raise RuntimeError(f'{name} failed (exit {code}): '
                         f'{sweep.last_line(stderr)}')
    return f'{name}: {state} (exit {code})'

  def checkpoint(self, *args, **kwargs):
    """Preempted or near the time limit (submitit's USR2): the driver is
    stopped as a user stops it (SIGTERM: it exits keeping its last
    checkpoint), and the same command is requeued; it resumes."""
    if self._child is not None and self._child.poll() is None:
      self._child.terminate()
      try:
        self._child.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self._child.kill()
    return super().checkpoint(*args, **kwargs)


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')


def folder_for(run_root: str, experiment_name: str) -> str:
  """Where an experiment's submissions, task logs and launch record go."""
  return os.path.join(run_root, 'slurm', experiment_name)


@contextlib.contextmanager
def _launch_lock(folder: str) -> Iterator[None]:
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, 'launch.lock'), 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)  # a second launch waits for the first
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def read_launches(folder: str) -> list[dict]:
  """The launch record: one entry per submission, `{array, submitted_at,
  jobs: {run name: job id}}`, oldest first."""
  try:
    with open(os.path.join(folder, LAUNCHES_FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return []


def squeue_states() -> Optional[dict[str, str]]:
  """`{job id: state}` of every job `squeue` lists (array tasks as
  `<array>_<task>`), or None where there is no `squeue` or it fails (no
  cluster reachable)."""
  try:
    done = subprocess.run(['squeue', '-h', '-r', '-o', '%i|%T'],
                          capture_output=True, text=True, timeout=60,
                          check=False)
  except (OSError, subprocess.TimeoutExpired):
    return None
  if done.returncode != 0:
    return None
  states = {}
  for line in done.stdout.splitlines():
    job, _, state = line.strip().partition('|')
    if job:
      states[job] = state
  return states


def latest_jobs(folder: str) -> dict[str, str]:
  """`{run name: job id}` of each run's latest submission."""
  jobs = {}
  for launch in read_launches(folder):
    jobs.update(launch['jobs'])
  return jobs


def _queued_state(job: Optional[str], queue: Mapping[str, str]
                  ) -> Optional[str]:
  state = queue.get(job) if job else None
  if state is None:
    return None
  return RUNNING if state in ('RUNNING', 'COMPLETING', 'CONFIGURING',
                              'STAGE_OUT') else PENDING


@dataclasses.dataclass(frozen=True)
class RunStatus:
  point: sweep.SweepPoint
  state: str  # one of STATES
  job: Optional[str] = None
  detail: str = ''  # a failed or stopped run's exit code and host


def status(points: Sequence[sweep.SweepPoint], folder: str, log_dir: str,
           queue: Optional[Mapping[str, str]] = None) -> list[RunStatus]:
  """Each point's state from its run directory, `squeue` and its task's
  record (see the module docstring)."""
  queue = squeue_states() if queue is None else queue
  jobs = latest_jobs(folder)
  result = []
  for point in points:
    job = jobs.get(point.experiment_name)
    queued = _queued_state(job, queue or {})
    if sweep.is_finished(point):
      result.append(RunStatus(point, FINISHED, job))
    elif job and queue is None:
      # Without the queue, a submitted run's state is not known here.
      result.append(RunStatus(point, UNKNOWN, job))
    elif queued:
      result.append(RunStatus(point, queued, job))
    else:
      record = _read_record(log_dir, point.experiment_name)
      if job and record and record.get('job') == job and record.get(
          'state') in (FAILED, STOPPED):
        result.append(RunStatus(
            point, record['state'], job,
            f'exit {record.get("exit_code")} on {record.get("host")}'))
      elif job:
        # Submitted, no longer queued, unfinished and no record of an end:
        # cancelled or killed before its command ended (a node's failure,
        # scancel).
        result.append(RunStatus(point, STOPPED, job,
                                'left the queue unfinished (cancelled?)'))
      else:
        result.append(RunStatus(point, TO_RUN))
  return result


def _read_record(log_dir: str, name: str) -> Optional[dict]:
  try:
    with open(job_record_path(log_dir, name)) as f:
      return json.load(f)
  except (FileNotFoundError, ValueError):
    return None


def counts(statuses: Sequence[RunStatus]) -> dict[str, int]:
  return {state: sum(s.state == state for s in statuses) for state in STATES}


def status_lines(title: str, statuses: Sequence[RunStatus], log_dir: str,
                 tail: int = 5) -> list[str]:
  """The counts, then each failed or stopped run by name with its last log
  lines."""
  if not statuses:
    return [f'{title}: no driver runs']
  tally = counts(statuses)
  lines = [f'{title}: {len(statuses)} runs: ' + ', '.join(
      f'{tally[state]} {state}' for state in STATES if tally[state])]
  for s in statuses:
    if s.state in (FAILED, STOPPED):
      lines.append(f'  {s.state}: {s.point.experiment_name} (job {s.job},'
                   f' {s.detail})')
      path = os.path.join(log_dir, f'{s.point.experiment_name}.stderr')
      lines += [f'    | {line}' for line in sweep.tail_lines(path, tail)]
  return lines


@dataclasses.dataclass(frozen=True)
class Launch:
  """What one experiment's launch did."""

  submitted: dict[str, str]  # run name -> job id
  queued_already: list[str]  # runs whose tasks were still queued
  finished: list[str]


def launch(points: Sequence[sweep.SweepPoint], folder: str, log_dir: str,
           resources: Resources, name: str) -> Launch:
  """Submits the unfinished points that no queued task holds, as one job
  array (one task per point, in grid order)."""
  with _launch_lock(folder):
    queue = squeue_states()
    if queue is None:
      raise ValueError('squeue does not answer: no SLURM cluster is'
                       ' reachable from here (is SLURM_CONF set?)')
    jobs = latest_jobs(folder)
    finished = [p.experiment_name for p in points if sweep.is_finished(p)]
    queued = [p.experiment_name for p in points
              if p.experiment_name not in finished and
              _queued_state(jobs.get(p.experiment_name), queue)]
    todo = [p for p in points if p.experiment_name not in finished and
            p.experiment_name not in queued]
    submitted = {}
    if todo:
      os.makedirs(log_dir, exist_ok=True)
      executor = _executor(folder, resources, name)
      with executor.batch():
        submitted_jobs = [executor.submit(RunJob(), p.experiment_name,
                                          tuple(p.command), log_dir)
                          for p in todo]
      submitted = {p.experiment_name: job.job_id
                   for p, job in zip(todo, submitted_jobs)}
      launches = read_launches(folder)
      launches.append({'array': submitted_jobs[0].job_id.split('_')[0],
                       'submitted_at': _now(), 'jobs': submitted})
      _write_json_atomically(os.path.join(folder, LAUNCHES_FILE), launches)
  return Launch(submitted, queued, finished)


def wait(points: Sequence[sweep.SweepPoint], folder: str, log_dir: str,
         title: str, poll_seconds: float = 15.0,
         print_fn: Callable[[str], None] = print) -> list[RunStatus]:
  """Blocks until no run of the launch is pending or running, with a
  progress bar (done / running / pending / failed); returns the last
  states."""
  import tqdm  # pylint: disable=g-import-not-at-top
  # A bar on a terminal; in a log (CI, nohup), a line when the counts change.
  bar = (tqdm.tqdm(total=len(points), desc=title, unit='run',
                   file=sys.stderr, dynamic_ncols=True)
         if sys.stderr.isatty() else None)
  last = None
  # A finished run stays finished: each poll reads only the others' files.
  # A run counts as finished here once its task has also left the queue, so
  # that its task's record is written when this returns.
  finished: dict[str, RunStatus] = {}
  try:
    while True:
      queue = squeue_states()
      fresh = status([p for p in points if p.experiment_name not in finished],
                     folder, log_dir, queue)
      ending = [s for s in fresh if s.state == FINISHED and
                _queued_state(s.job, queue or {})]
      finished.update((s.point.experiment_name, s) for s in fresh
                      if s.state == FINISHED and s not in ending)
      by_name = {s.point.experiment_name: s for s in fresh}
      statuses = [finished.get(p.experiment_name) or by_name[p.experiment_name]
                  for p in points]
      tally = counts(statuses)
      line = (f'running {tally[RUNNING]}, pending {tally[PENDING]},'
              f' failed {tally[FAILED] + tally[STOPPED]}')
      if bar is not None:
        bar.n = tally[FINISHED]
        bar.set_postfix_str(line, refresh=False)
        bar.refresh()
      elif (tally[FINISHED], line) != last:
        print_fn(f'{title}: {tally[FINISHED]}/{len(points)} done, {line}')
        sys.stdout.flush()
        last = (tally[FINISHED], line)
      if not tally[RUNNING] and not tally[PENDING] and not ending:
        return statuses
      time.sleep(poll_seconds)
  finally:
    if bar is not None:
      bar.close()
