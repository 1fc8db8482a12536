"""GPU against CPU cores: the in-process runtime's rounds on each device.

    python -m bench.gpu                      # make bench-gpu
    python -m bench.gpu --cohorts=4 --rounds=1 --workloads=emnist_cnn  # CI

For each workload (the EMNIST CNN and the Stack Overflow LSTM of
`bench.workloads`) and cohort size, the driver's round on fused shards
(`bench.tff_rounds`' `fused` variant: the full round with the driver's
aggregator and diagnostics, shards as NumPy arrays, so no tf.data on the
device's critical path) runs in this process's TensorFlow
(`fl_engine.runtime.local_runtime`) on the CPU's cores and on each
visible GPU in turn, one device at a time, with one shard per client call
the device runs at once (`in_process.plan_devices`). Per device: the
fastest of `--rounds` timed rounds after a warm-up round, the speed-up over
the CPU, the ops each TensorFlow device ran in one traced round (proof of
where the round computed), and the GPUs' mean utilization while the timed
rounds ran (`nvidia-smi`, when it exists). With no GPU the first line says
so and only the CPU is timed.

`--output=DIR` writes `DIR/README.md` (default `results/bench/gpu`).
"""

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging

from bench import report
from bench import tff_rounds
from bench import workloads
from fl_engine import runtime
from fl_engine.runtime import in_process

_WORKLOADS = flags.DEFINE_list(
    'workloads', ['emnist_cnn', 'stackoverflow_lstm'], 'Workloads to time.')
_COHORTS = flags.DEFINE_list('cohorts', ['50', '200', '800'],
                             'Clients per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Timed rounds per device, after'
                               ' one warm-up round; the fastest counts.',
                               lower_bound=1)
_CPU_MAX_CLIENTS = flags.DEFINE_integer(
    'cpu_max_clients', 200,
    'The CPU is timed at cohorts up to this size, and its time per client'
    ' at the largest of them stands in above it (a CPU round grows linearly'
    ' with the cohort: `make bench`\'s scaling table); keeps the run within'
    ' minutes on a machine of few cores.', lower_bound=1)
_OUTPUT = flags.DEFINE_string('output', 'results/bench/gpu',
                              'Directory of the report (README.md).')

_COLUMNS = [('workload', 'workload', 's'), ('clients', 'clients', 'd'),
            ('device', 'device', 's'), ('calls', 'calls at once', 'd'),
            ('round_s', 'round s', '.3f'), ('basis', 'timed', 's'),
            ('speedup', 'vs CPU', '.2f'), ('gpu_util', 'GPU util %', 's'),
            ('ops', 'ops per device (one traced round)', 's')]


class _GpuUtilization:
  """Mean GPU utilization sampled by `nvidia-smi` while the block runs."""

  def __init__(self):
    self._samples = []
    self._stop = threading.Event()
    self._thread = None

  def __enter__(self):
    if shutil.which('nvidia-smi'):
      self._thread = threading.Thread(target=self._sample, daemon=True)
      self._thread.start()
    return self

  def _sample(self):
    while not self._stop.wait(0.2):
      try:
        out = subprocess.run(
            ['nvidia-smi', '--query-gpu=utilization.gpu',
             '--format=csv,noheader,nounits'], capture_output=True,
            text=True, timeout=5, check=True).stdout
        self._samples.append([float(x) for x in out.split()])
      except (subprocess.SubprocessError, ValueError, OSError):
        return

  def __exit__(self, *exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()

  def mean(self) -> str:
    if not self._samples:
      return 'n/a'
    per_gpu = zip(*self._samples)
    return '/'.join(f'{sum(s) / len(s):.0f}' for s in per_gpu)


def _ops(placement: in_process.Placement) -> str:
  counts = {}
  for role in placement.ops.values():
    for device, n in role.items():
      counts[device] = counts.get(device, 0) + n
  return ', '.join(f'{d.rpartition("device:")[2]}: {n}'
                   for d, n in sorted(counts.items()))


def time_device(workload: workloads.Workload, num_clients: int,
                device: str, rounds: int) -> dict[str, Any]:
  """The fused round of `workload` at `num_clients` on `device` alone."""
  arrays = workload.client_arrays(num_clients)
  with runtime.local_runtime([device], record_placement=True) as planned:
    calls = planned[0].lanes
    process = tff_rounds.build_process(workload, 'fused')
    round_fn = tff_rounds.round_for(process, workload, arrays, 'fused',
                                    calls_at_once=calls)
    round_fn()  # Warm-up, traced: where each op ran.
    placement = planned[0].placement
    ops = _ops(placement)
    placement.recording = False  # The timed rounds are not traced.
    times = []
    with _GpuUtilization() as utilization:
      for _ in range(rounds):
        start = time.perf_counter()
        round_fn()
        times.append(time.perf_counter() - start)
  return dict(workload=workload.name, clients=num_clients, device=device,
              calls=calls, round_s=min(times), basis='measured',
              gpu_util=utilization.mean() if 'GPU' in device else '',
              ops=ops)


def run(workload_names: Sequence[str], cohorts: Sequence[int], rounds: int,
        cpu_max_clients: int, print_fn=print) -> tuple[str, list[dict]]:
  """Times every workload and cohort on the CPU and each visible GPU.

  Returns:
    The first line (which devices), and one row per workload, cohort and
    device.
  """
  gpus = [d for d in runtime.visible_devices() if '/device:GPU:' in d]
  cores = len(os.sched_getaffinity(0))
  if gpus:
    head = (f'{len(gpus)} GPU(s) visible ({", ".join(gpus)}), against '
            f'{cores} CPU cores.')
  else:
    head = (f'no GPU visible to TensorFlow: timing the CPU ({cores} cores)'
            ' only.')
  print_fn(head)
  rows = []
  for name in workload_names:
    workload = workloads.get_workload(name)
    cpu_per_client = None
    for num_clients in cohorts:
      if num_clients <= cpu_max_clients or cpu_per_client is None:
        cpu = time_device(workload, num_clients, '/device:CPU:0', rounds)
        cpu_per_client = cpu['round_s'] / num_clients
      else:
        cpu = dict(workload=name, clients=num_clients,
                   device='/device:CPU:0', round_s=cpu_per_client * num_clients,
                   basis=f'per client of {cpu_max_clients}', ops='',
                   gpu_util='')
      cpu['speedup'] = 1.0
      rows.append(cpu)
      print_fn(report.format_table('', [cpu], _COLUMNS).splitlines()[-1])
      for gpu in gpus:
        row = time_device(workload, num_clients, gpu, rounds)
        row['speedup'] = cpu['round_s'] / row['round_s']
        rows.append(row)
        print_fn(report.format_table('', [row], _COLUMNS).splitlines()[-1])
  return head, rows


def write_report(directory: str, command: str, head: str,
                 rows: Sequence[dict]) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, 'README.md')
  table = report.format_table(
      'Round time per device (fused shards, in-process runtime; fastest of'
      ' the timed rounds after a warm-up)', rows, _COLUMNS)
  text = '\n'.join([
      '# GPU benchmark', '',
      'Regenerated by `make bench-gpu` (`bench/gpu.py` says what is timed).',
      'Each row runs the round on one device alone; "ops per device" counts',
      'the TensorFlow ops each device ran in one traced round of it.', '',
      '```', f'$ {command}', head, '', table, '```', ''])
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)
  return path


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.ERROR)
  argv_flags = [a for a in sys.argv[1:] if not a.startswith('--output')]
  cohorts = report.positive_ints(_COHORTS.value, 'cohorts')
  try:
    for name in _WORKLOADS.value:
      workloads.get_workload(name)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  head, rows = run(_WORKLOADS.value, cohorts, _ROUNDS.value,
                   _CPU_MAX_CLIENTS.value)
  command = ' '.join(['python -m bench.gpu'] + argv_flags)
  path = write_report(_OUTPUT.value, command, head, rows)
  print(f'wrote {path}')


if __name__ == '__main__':
  runtime.refuse_unmanaged_default_context()
  app.run(main)
