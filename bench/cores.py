"""Speed-up of a round from one core to all cores.

"One core" is measured honestly, not by configuration: the measurement runs
in a fresh Python process whose CPU affinity is set to a single core before it
starts (`sched_setaffinity`, as `taskset -c 0` does); its `worker_binary`
inherits the affinity, and TensorFlow sizes its thread pools from it in both
processes. "All cores" is the same process with the benchmark's own affinity
(every core it may use). Both processes measure the limit and the driver's
full FedAvg round (`package`) side by side (`bench.ratios`), so the table
shows how each one scales.
"""

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from bench import ratios

_KINDS = (ratios.LIMIT, 'package')


def _measure_with_cpus(cpus: Sequence[int], workload_name: str,
                       num_clients: int, repeats: int) -> dict[str, Any]:
  request = {'kind': 'ratios', 'workload': workload_name,
             'clients': num_clients, 'repeats': repeats,
             'variants': ['package']}
  completed = subprocess.run(
      [sys.executable, '-m', 'bench.probe', json.dumps(request)],
      capture_output=True, text=True, check=False,
      preexec_fn=lambda: os.sched_setaffinity(0, cpus),
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if completed.returncode:
    raise RuntimeError(f'probe {request} on cpus {list(cpus)} failed:\n'
                       f'{completed.stderr[-3000:]}')
  return json.loads(completed.stdout.strip().splitlines()[-1])[0]


def measure_speedup(workload_name: str, num_clients: int,
                    repeats: int) -> list[dict[str, Any]]:
  """Rows `{kind, one_core_s, all_cores_s, cores, speedup}` for the limit and
  the full TFF round.

  Raises:
    ValueError: If this process may use only one core.
  """
  all_cpus = sorted(os.sched_getaffinity(0))
  if len(all_cpus) < 2:
    raise ValueError(f'Only CPU {all_cpus} is available; a speed-up from 1 '
                     'core needs at least 2.')
  one = _measure_with_cpus(all_cpus[:1], workload_name, num_clients, repeats)
  every = _measure_with_cpus(all_cpus, workload_name, num_clients, repeats)
  return [{
      'workload': workload_name,
      'clients': num_clients,
      'kind': kind,
      'cores': len(all_cpus),
      'one_core_s': one[f'{kind}_s'],
      'all_cores_s': every[f'{kind}_s'],
      'speedup': one[f'{kind}_s'] / every[f'{kind}_s'],
  } for kind in _KINDS]
