"""The driver's resident memory over a long run: flat, within a bound.

`measure_long_run` runs `python run_experiment.py --task=synthetic` for
`rounds` rounds (the paper-scale AdaBest/FedDyn runs are 5,000 rounds and
more) with the driver's defaults (evaluation every 10 rounds, a checkpoint
every 50), reads the driver's resident set (`VmRSS`) from `/proc` as each
`sample_every`-th round's progress line arrives, and reports it per
sample. The first `warm_up` rounds fill TensorFlow's and the in-process
runtime's caches (plans, imported graphs) and the allocator's arenas; after
them the resident set must stay within `BOUND_MB` of its value at the end
of the warm-up. A leak of the kinds this package has met (a client
dataset's function library kept per round, a traced function per
bootstrap) adds 0.4-0.6 MB a round: 2 GB over 4,500 rounds.
"""

import os
import re
import subprocess
import sys
import tempfile

BOUND_MB = 64.0
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROUND = re.compile(r'round (\d+)/')


def _rss_mb(pid: int) -> float:
  with open(f'/proc/{pid}/status') as status:
    for line in status:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f'no VmRSS for pid {pid}')


def measure_long_run(rounds: int = 5000, clients_per_round: int = 20,
                     sample_every: int = 250, warm_up: int = 500
                     ) -> list[dict[str, object]]:
  """Rows `{round, rss_mb, growth_mb, within_bound}`: the driver's resident
  set at every `sample_every`-th round, and after the warm-up its growth
  over the value at round `warm_up` (module docstring)."""
  if warm_up >= rounds or warm_up % sample_every:
    raise ValueError('warm_up must be a multiple of sample_every below'
                     ' rounds')
  with tempfile.TemporaryDirectory() as root:
    command = [sys.executable, os.path.join(_REPO, 'run_experiment.py'),
               '--task=synthetic', f'--clients_per_round={clients_per_round}',
               f'--total_rounds={rounds}', f'--root_output_dir={root}',
               '--experiment_name=long_run']
    process = subprocess.Popen(command, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               cwd=_REPO)
    samples = {}
    try:
      for line in process.stdout:
        match = _ROUND.match(line)
        if match and int(match.group(1)) % sample_every == 0:
          samples[int(match.group(1))] = _rss_mb(process.pid)
    finally:
      process.stdout.close()
      if process.wait() != 0:
        raise RuntimeError(f'{" ".join(command)} exited {process.returncode}')
  base = samples[warm_up]
  rows = []
  for r, mb in sorted(samples.items()):
    row = {'round': r, 'rss_mb': mb}
    if r >= warm_up:
      row.update(growth_mb=mb - base,
                 within_bound='yes' if mb - base <= BOUND_MB else 'NO')
    rows.append(row)
  return rows
