"""`--launcher=slurm` (`reproduce.cluster`) on a real one-node SLURM cluster.

The cluster is started once for the module by `tools/local_slurm.sh` (which
installs Debian's `slurm-wlm` and `munge` if missing): `slurmctld`, `slurmd`
and, if none answers, `munged`, stopped at the end by their pids. Where it
cannot start (no root, no packages), every test here fails with the reason;
`FL_PAPERS_NO_SLURM=1` turns that into a skip saying so, for a machine where
a cluster cannot run (CI does not set it).

Runs are the driver's Synthetic ones, a few rounds each, on CPUs.
"""

import contextlib
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import time

import pandas as pd
import pytest

from fl_common import run_layout
from reproduce import __main__ as reproduce_main
from reproduce import cluster
from reproduce import sweep

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
_SCRIPT = os.path.join(_REPO, 'tools', 'local_slurm.sh')
# Two runs fit the two CPUs of the smallest machine this runs on.
_SMALL = ('--cpus_per_run=1', '--mem_gb=1')
_RESOURCES = cluster.Resources(cpus_per_run=1, mem_gb=1, time_min=30)


@pytest.fixture(scope='module')
def slurm(tmp_path_factory, monkeypatch_module):
  """A running cluster; `SLURM_CONF` points at it for this process and the
  commands it starts."""
  directory = tmp_path_factory.mktemp('slurm')
  started = subprocess.run([_SCRIPT, 'start', str(directory)],
                           capture_output=True, text=True, check=False)
  if started.returncode != 0:
    reason = (started.stderr.strip().splitlines() or ['no output'])[-1]
    message = f'the local SLURM cluster did not start: {reason}'
    if os.environ.get('FL_PAPERS_NO_SLURM') == '1':
      pytest.skip(message + ' (FL_PAPERS_NO_SLURM=1)')
    pytest.fail(message, pytrace=False)
  monkeypatch_module.setenv('SLURM_CONF', str(directory / 'slurm.conf'))
  try:
    yield directory
  finally:
    subprocess.run(['scancel', '--full', '-u', 'root'], check=False,
                   capture_output=True)
    subprocess.run([_SCRIPT, 'stop', str(directory)], check=False)


@pytest.fixture(scope='module')
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as patch:
    yield patch


def _reproduce_here(*args):
  """`python -m reproduce` in this process, for the calls that return at
  once (submitting, `--status`): the command's own process is `_reproduce`'s
  (`--wait`, with its timeout), and each fresh one pays TensorFlow's import."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = reproduce_main.main(list(args))
    except SystemExit as e:
      code = e.code
  done = subprocess.CompletedProcess(args, code, out.getvalue(),
                                     err.getvalue())
  if code != 0:
    raise AssertionError(f'exit {code}:\n{done.stdout[-3000:]}\n'
                         f'{done.stderr[-3000:]}')
  return done


def _reproduce(*args, check=True, timeout=900):
  done = subprocess.run([sys.executable, '-m', 'reproduce', *args],
                        capture_output=True, text=True, cwd=_REPO,
                        timeout=timeout, check=False)
  if check and done.returncode != 0:
    raise AssertionError(f'exit {done.returncode}:\n{done.stdout[-3000:]}\n'
                         f'{done.stderr[-3000:]}')
  return done


def _queue() -> dict[str, str]:
  states = cluster.squeue_states()
  assert states is not None
  return states


def _wait_until(condition, timeout=300, what='the condition'):
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if condition():
      return
    time.sleep(1)
  raise AssertionError(f'{what} did not happen in {timeout} s; queue:'
                       f' {cluster.squeue_states()}')


def _metrics(run_dir) -> pd.DataFrame:
  frame = pd.read_csv(os.path.join(run_dir, run_layout.METRICS_FILE))
  return frame.drop(columns=[c for c in run_layout.TIMING_COLUMNS
                             if c in frame.columns])


def _start_now(job: str) -> None:
  """Starts a requeued job now, not after SLURM's ~2 min BeginTime. Not at
  once: a restart within the second of its requeue is refused by slurmd
  ("Job credential revoked", the job then ends as failed), the race that
  delay exists for. So: once the node has let go of the old instance, and
  a few seconds after."""
  _wait_until(lambda: subprocess.run(
      ['sinfo', '-h', '-o', '%t'], capture_output=True, text=True,
      check=False).stdout.strip() == 'idle', what='the node to be idle')
  time.sleep(3)
  subprocess.run(['scontrol', 'update', f'jobid={job}', 'StartTime=now'],
                 check=True)


def _rounds_done(run_dir) -> int:
  try:
    return len(pd.read_csv(os.path.join(run_dir, run_layout.METRICS_FILE)))
  except (FileNotFoundError, pd.errors.EmptyDataError):
    return 0


def _attempts(log_dir, name) -> int:
  with open(os.path.join(log_dir, f'{name}.stdout')) as f:
    return sum(line.startswith(f'== {name}: job ') for line in f)


def test_a_grid_runs_as_a_job_array_and_is_not_resubmitted_while_queued(
    slurm, tmp_path):
  del slurm
  grid = ('gel', 'fig2', '--scale=smoke', f'--root_output_dir={tmp_path}')
  # Submitted held, so that the runs are still queued when the second
  # launch looks, however slow this machine.
  first = _reproduce_here(*grid, '--launcher=slurm', *_SMALL,
                          '--sbatch=hold')
  (array,) = re.findall(r'submitted 2 runs as job (\d+)', first.stdout)
  assert '--status' in first.stdout
  queued = [job for job in _queue() if job.split('_')[0] == array]
  assert sorted(queued) == [f'{array}_0', f'{array}_1']
  # A second launch while the tasks are queued submits nothing.
  second = _reproduce_here(*grid, '--launcher=slurm', *_SMALL)
  assert 'submitted 0 runs; 2 queued already, 0 finished' in second.stdout
  status = _reproduce_here(*grid, '--status')
  assert status.stdout.strip() == 'gel fig2: 2 runs: 2 pending'
  subprocess.run(['scontrol', 'release', array], check=True)
  # --wait submits nothing new, waits, then writes the report.
  waited = _reproduce(*grid, '--launcher=slurm', *_SMALL, '--wait',
                      '--poll_seconds=1')
  assert 'submitted 0 runs' in waited.stdout
  assert 'gel fig2: 2 runs: 2 finished' in waited.stdout
  report = tmp_path / 'reports/exploratory/smoke/gel/fig2/README.md'
  assert f'report: {report}' in waited.stdout and report.is_file()
  log_dir = tmp_path / 'gel/smoke' / sweep.LOG_DIR_NAME
  for name in ('fig2_synthetic__algorithm=fedavg_budgeted__seed=0',
               'fig2_synthetic__algorithm=fedavgcm_budgeted__seed=0'):
    assert _attempts(log_dir, name) == 1
    with open(log_dir / f'{name}.job.json') as f:
      assert json.load(f)['state'] == 'finished'
  assert _reproduce_here(*grid, '--status').stdout.strip() == (
      'gel fig2: 2 runs: 2 finished')
  # Finished runs are not submitted again.
  again = _reproduce_here(*grid, '--launcher=slurm', *_SMALL)
  assert 'submitted 0 runs; 0 queued already, 2 finished' in again.stdout


def _points(root, names_and_flags, rounds):
  points = []
  for name, flags in names_and_flags:
    points += sweep.build_points(
        (sweep.Axis('seed', ('3',)),), str(root), rounds, name_prefix=name,
        flags={'task': 'synthetic', 'clients_per_round': '5',
               'rounds_per_eval': '5', 'max_eval_clients': '10',
               'noper_client_eval': None, **flags})
  return points


@pytest.mark.parametrize('how', ['scontrol_requeue', 'usr2'])
def test_a_requeued_run_resumes_to_the_uninterrupted_metrics(slurm,
                                                             tmp_path, how):
  """SLURM's requeue (`scontrol requeue`, a preempting partition) and the
  time limit's or preemption's USR2 (submitit's signal: the task stops the
  driver and requeues itself) both resume the run where it was."""
  del slurm
  (point,) = _points(tmp_path / 'slurm', [('requeued', {
      'rounds_per_checkpoint': '4'})], rounds=60)
  (reference,) = _points(tmp_path / 'local', [('requeued', {
      'rounds_per_checkpoint': '4'})], rounds=60)
  folder = str(tmp_path / 'submitit')
  log_dir = str(tmp_path / 'logs')
  launched = cluster.launch([point], folder, log_dir, _RESOURCES, 'requeue')
  (job,) = launched.submitted.values()
  _wait_until(lambda: _rounds_done(point.run_dir) >= 10, what='round 10')
  if how == 'usr2':
    subprocess.run(['scancel', '--signal=USR2', job], check=True)
  else:
    subprocess.run(['scontrol', 'requeue', job], check=True)
  _wait_until(lambda: _queue().get(job) == 'PENDING', what='the requeue')
  _start_now(job)
  subprocess.run(reference.command, check=True, capture_output=True)
  _wait_until(lambda: job not in _queue(), timeout=600, what='the end')
  assert sweep.is_finished(point)
  name = point.experiment_name
  assert _attempts(log_dir, name) == 2
  with open(os.path.join(log_dir, f'{name}.stderr')) as f:
    stderr = f.read()
  assert re.search(r'terminated at round \d+ \(last checkpoint: round \d+\)',
                   stderr), stderr[-2000:]
  resumed = _metrics(point.run_dir)
  assert list(resumed['round']) == list(range(1, 61))
  pd.testing.assert_frame_equal(resumed, _metrics(reference.run_dir))


def test_a_failed_run_is_reported_by_name_with_its_log(slurm, tmp_path):
  del slurm
  good, bad = _points(tmp_path, [('good', {}), ('bad', {
      'server_learning_rate': '-1'})], rounds=2)
  folder = str(tmp_path / 'submitit')
  log_dir = str(tmp_path / 'logs')
  cluster.launch([good, bad], folder, log_dir, _RESOURCES, 'failing')
  statuses = cluster.wait([good, bad], folder, log_dir, 'failing',
                          poll_seconds=1)
  assert [s.state for s in statuses] == ['finished', 'failed']
  lines = cluster.status_lines('grid', statuses, log_dir)
  assert lines[0] == 'grid: 2 runs: 1 finished, 1 failed'
  assert lines[1].startswith(f'  failed: {bad.experiment_name} (job ')
  assert 'exit 2 on ' in lines[1]
  assert any(line.startswith('    | error: ') and 'server_learning_rate' in
             line for line in lines[2:]), lines


def test_a_job_whose_run_another_run_holds_runs_nothing_and_exits_0(
    slurm, tmp_path):
  del slurm
  (point,) = _points(tmp_path, [('held', {})], rounds=2)
  os.makedirs(point.run_dir)
  folder = str(tmp_path / 'submitit')
  log_dir = str(tmp_path / 'logs')
  with open(os.path.join(point.run_dir, run_layout.LOCK_FILE), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # as a live run holds it
    lock.write(f'{os.getpid()}\n')
    lock.flush()
    launched = cluster.launch([point], folder, log_dir, _RESOURCES, 'held')
    (job,) = launched.submitted.values()
    _wait_until(lambda: job not in _queue(), what='the end')
  with open(os.path.join(folder, f'{job}_0_log.out')) as f:
    assert 'is in use by another run; this job runs nothing' in f.read()
  with open(os.path.join(folder, f'{job}_0_result.pkl'), 'rb') as f:
    assert b'success' in f.read()  # exited 0: not a failure
  assert not os.path.exists(cluster.job_record_path(log_dir,
                                                    point.experiment_name))
  assert not sweep.is_finished(point)


def test_two_launches_at_once_run_each_run_once(slurm, tmp_path):
  del slurm
  grid = ('gel', 'fig2', '--scale=smoke', f'--root_output_dir={tmp_path}',
          '--launcher=slurm', *_SMALL)
  both = [subprocess.Popen([sys.executable, '-m', 'reproduce', *grid],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=_REPO) for _ in range(2)]
  outputs = [p.communicate(timeout=300) for p in both]
  assert [p.returncode for p in both] == [0, 0], outputs
  submitted = sorted(int(re.search(r'submitted (\d) runs', out).group(1))
                     for out, _ in outputs)
  assert submitted == [0, 2]
  _reproduce(*grid, '--wait', '--poll_seconds=1')
  log_dir = tmp_path / 'gel/smoke' / sweep.LOG_DIR_NAME
  for name in ('fig2_synthetic__algorithm=fedavg_budgeted__seed=0',
               'fig2_synthetic__algorithm=fedavgcm_budgeted__seed=0'):
    assert _attempts(log_dir, name) == 1


# What needs no cluster: the flags, the script a launch submits, the states.

from reproduce import __main__ as cli  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.parametrize('args, message', [
    (('--partition=gpu',), '--partition does nothing with --launcher=local'),
    (('--wait',), '--wait does nothing with --launcher=local'),
    (('--launcher=slurm', '--parallel=3'), '--parallel does nothing with'
     ' --launcher=slurm'),
    (('--launcher=slurm', '--report_only'), '--report_only runs nothing'),
    (('--launcher=slurm', '--dry_run', '--wait'), '--dry_run submits'
     ' nothing'),
    (('--launcher=slurm', '--poll_seconds=1'), '--poll_seconds does nothing'
     ' without --wait'),
    (('--launcher=slurm', '--sbatch=a b'), '--sbatch takes an sbatch option'),
    (('--launcher=slurm', '--cpus_per_run=0'), '--cpus_per_run must be >= 1'),
    (('--launcher=slurm', '--mem_gb=nan'), '--mem_gb must be a finite number'),
    (('--launcher=slurm', '--wait', '--poll_seconds=inf'),
     '--poll_seconds must be a finite number'),
    (('--status', '--wait'), '--status runs nothing; --wait does nothing'),
    (('--status', '--dry_run'), '--status runs nothing; --dry_run does'),
])
def test_flags_that_would_do_nothing_are_refused_in_one_line(
    args, message, tmp_path, capsys):
  code = cli.main(['gel', 'fig2', '--scale=smoke',
                   f'--root_output_dir={tmp_path}', *args])
  out, err = capsys.readouterr()
  assert code == 2 and out == ''
  (line,) = err.strip().splitlines()
  assert line.startswith(f'error: {message}'), line
  assert not os.listdir(tmp_path)


def test_a_grid_timed_on_one_machine_is_refused_on_the_cluster(tmp_path,
                                                                capsys):
  code = cli.main(['adabest', 'table_cost', '--launcher=slurm', '--dry_run',
                   f'--root_output_dir={tmp_path}'])
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and line == (
      'error: adabest table_cost times its runs side by side on one machine'
      ' (its figures compare those timings): run it with --launcher=local')


def test_dry_run_prints_the_script_at_the_scales_resources(tmp_path, capsys):
  code = cli.main(['gel', 'fig2', '--scale=paper', '--launcher=slurm',
                   '--dry_run', f'--root_output_dir={tmp_path}',
                   '--partition=gpu', '--sbatch=account=lab',
                   '--setup=module load cuda/12'])
  out = capsys.readouterr().out
  assert code == 0
  runs = [line for line in out.splitlines() if line.startswith('#   ')]
  assert runs and all('run_experiment.py' in line for line in runs)
  script = out[out.index('#!/bin/bash'):]
  for option in (f'--array=0-{len(runs) - 1}%{len(runs)}',
                 '--gpus-per-node=1', '--cpus-per-task=8', '--mem=32768MB',
                 '--time=1440', '--partition=gpu', '--account=lab',
                 '--requeue', '--signal=USR2@90', '--job-name=gel-fig2'):
    assert f'#SBATCH {option}\n' in script, option
  assert '\nmodule load cuda/12\n' in script
  assert not os.path.exists(tmp_path / 'gel')  # nothing written


def test_a_dry_run_prints_the_script_on_a_machine_without_slurm(
    tmp_path, capsys, monkeypatch):
  # submitit's executor refuses to start where no `srun` is on PATH; a dry
  # run, which submits nothing, must not (a fresh machine, a laptop).
  monkeypatch.setenv('PATH', str(tmp_path / 'no_slurm_here'))
  code = cli.main(['gel', 'fig2', '--scale=paper', '--launcher=slurm',
                   '--dry_run', f'--root_output_dir={tmp_path / "runs"}'])
  out = capsys.readouterr().out
  assert code == 0 and '#SBATCH --job-name=gel-fig2\n' in out
  assert not os.path.exists(tmp_path / 'runs')


def _finished_point(root, name, rounds=2, done=True):
  (point,) = sweep.build_points((sweep.Axis('seed', ('1',)),), str(root),
                                rounds, name_prefix=name)
  os.makedirs(point.run_dir)
  last = rounds if done else rounds - 1
  pd.DataFrame({'round': range(1, last + 1)}).to_csv(
      os.path.join(point.run_dir, run_layout.METRICS_FILE), index=False)
  return point


def test_states_come_from_run_directories_the_queue_and_task_records(
    tmp_path, monkeypatch):
  root, folder, log_dir = tmp_path / 'runs', tmp_path / 'f', tmp_path / 'l'
  os.makedirs(folder)
  os.makedirs(log_dir)
  names = ('finished', 'running', 'pending', 'failed', 'stopped', 'gone',
           'requeued', 'new')
  points = [_finished_point(root, n, done=(n == 'finished')) for n in names]
  jobs = {p.experiment_name: f'7_{i}' for i, p in enumerate(points[:-1])}
  # `requeued` failed as job 3_0 once, then was submitted again as 7_6.
  with open(folder / cluster.LAUNCHES_FILE, 'w') as f:
    json.dump([{'array': '3', 'jobs': {points[6].experiment_name: '3_0'}},
               {'array': '7', 'jobs': jobs}], f)
  for point, job, state in ((points[3], '7_3', 'failed'),
                            (points[4], '7_4', 'stopped'),
                            (points[6], '3_0', 'failed')):
    with open(cluster.job_record_path(log_dir, point.experiment_name),
              'w') as f:
      json.dump({'job': job, 'state': state, 'exit_code': 2, 'host': 'n1'}, f)
  (log_dir / f'{points[3].experiment_name}.stderr').write_text(
      '== header\nTraceback\nerror: bad flag\n')
  queue = {'7_1': 'RUNNING', '7_2': 'PENDING', '7_6': 'PENDING',
           '9_0': 'RUNNING'}
  statuses = cluster.status(points, str(folder), str(log_dir), queue)
  assert [s.state for s in statuses] == [
      'finished', 'running', 'pending', 'failed', 'stopped', 'stopped',
      'pending', 'to run']
  assert statuses[5].detail == 'left the queue unfinished (cancelled?)'
  lines = cluster.status_lines('g', statuses, str(log_dir), tail=2)
  assert lines[0] == ('g: 8 runs: 1 finished, 1 running, 2 pending, 1 failed,'
                      ' 2 stopped, 1 to run')
  assert lines[1:4] == [
      f'  failed: {points[3].experiment_name} (job 7_3, exit 2 on n1)',
      '    | Traceback', '    | error: bad flag']
  # Where squeue does not answer, a submitted run's state is unknown, not
  # stopped; the run directories still tell what finished.
  monkeypatch.setattr(cluster, 'squeue_states', lambda: None)
  unknown = cluster.status(points, str(folder), str(log_dir))
  assert [s.state for s in unknown] == (['finished'] + [cluster.UNKNOWN] * 6
                                        + ['to run'])


def _docs_one_run_script() -> str:
  with open(os.path.join(_REPO, 'docs', 'cluster.md')) as f:
    text = f.read()
  return re.search(r'<!-- cluster: one run -->\n```bash\n(.*?)```', text,
                   re.S).group(1)


def test_the_docs_one_run_script_requeues_near_its_limit_and_resumes(
    slurm, tmp_path):
  """docs/cluster.md's sbatch script as shown, with this machine's paths,
  resources and a Synthetic run: USR1 (what SLURM sends 5 min before the
  limit) stops the driver and requeues the job, which resumes the run to
  the uninterrupted metrics."""
  del slurm
  flags = ('--task=synthetic --clients_per_round=5 --rounds_per_eval=5'
           ' --max_eval_clients=10 --noper_client_eval --total_rounds=60'
           ' --rounds_per_checkpoint=4')
  venv = os.path.dirname(os.path.dirname(sys.executable))
  script = _docs_one_run_script()
  for old, new in (('cd /shared/fl_papers_tff', f'cd {_REPO}'),
                   ('source .venv/bin/activate',
                    f'source {venv}/bin/activate'),
                   ('--cpus-per-task=8', '--cpus-per-task=1'),
                   ('#SBATCH --gpus-per-node=1\n', ''),
                   ('--mem=32G', '--mem=1G'),
                   ('--output=%x-%j.out', f'--output={tmp_path}/%j.out')):
    assert old in script, old
    script = script.replace(old, new)
  script, count = re.subn(
      r'python run_experiment\.py .*?&\n',
      f'python run_experiment.py {flags} --root_output_dir={tmp_path}/runs'
      ' --experiment_name=doc &\n', script, flags=re.S)
  assert count == 1
  (tmp_path / 'run.sh').write_text(script)
  submitted = subprocess.run(['sbatch', '--parsable', str(tmp_path / 'run.sh')],
                             capture_output=True, text=True, check=True)
  job = submitted.stdout.strip()
  _wait_until(lambda: _rounds_done(tmp_path / 'runs' / 'doc') >= 10,
              what='round 10')
  subprocess.run(['scancel', '--batch', '--signal=USR1', job], check=True)
  _wait_until(lambda: _queue().get(job) == 'PENDING', what='the requeue')
  _start_now(job)
  reference = tmp_path / 'reference'
  subprocess.run([sys.executable, os.path.join(_REPO, 'run_experiment.py'),
                  *flags.split(), f'--root_output_dir={reference}',
                  '--experiment_name=doc'], check=True, capture_output=True)
  _wait_until(lambda: job not in _queue(), timeout=600, what='the end')
  with open(tmp_path / f'{job}.out') as f:
    output = f.read()
  assert 'time limit near: stopping and requeueing' in output, output[-2000:]
  resumed = _metrics(tmp_path / 'runs' / 'doc')
  assert list(resumed['round']) == list(range(1, 61))
  pd.testing.assert_frame_equal(resumed, _metrics(reference / 'doc'))


def test_a_cluster_under_a_deep_directory_runs_its_jobs(tmp_path):
  """slurmd makes each job step's socket in its spool, and a socket's path
  holds at most 107 bytes: under a deep directory (Bazel's test temporary
  directory) the script keeps the spool in a short one, and `stop` removes
  it."""
  directory = tmp_path / ('deep' * 20) / 'slurm'
  directory.mkdir(parents=True)
  started = subprocess.run([_SCRIPT, 'start', str(directory)],
                           capture_output=True, text=True, check=False)
  if started.returncode != 0:
    pytest.fail(f'the local SLURM cluster did not start: {started.stderr}',
                pytrace=False)
  env = {**os.environ, 'SLURM_CONF': str(directory / 'slurm.conf')}
  spool = os.path.realpath(directory / 'spool')
  try:
    assert len(spool) < 40 and os.path.isdir(spool)
    out = tmp_path / 'job.out'
    job = subprocess.run(
        ['sbatch', '--wait', '--cpus-per-task=1', '--mem=100M',
         f'--output={out}', '--wrap=echo ran'],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert job.returncode == 0, job.stderr
    assert out.read_text().strip() == 'ran'
  finally:
    subprocess.run([_SCRIPT, 'stop', str(directory)], check=False)
  assert not os.path.exists(spool)
  assert not os.path.lexists(directory / 'spool')
