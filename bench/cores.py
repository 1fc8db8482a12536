"""Speed-up of a round from one core to all cores.

"One core" is measured honestly, not by configuration: the measurement runs
in a fresh Python process whose CPU affinity is set to a single core before it
starts (`taskset --cpu-list`, which sets it before `exec`); its `worker_binary`
inherits the affinity, and TensorFlow sizes its thread pools from it in both
processes. "All cores" is the same process with the benchmark's own affinity
(every core it may use). Both processes measure the limit and the driver's
full FedAvg round (`package`) side by side (`bench.ratios`), so the table
shows how each one scales. The two settings alternate for `trials` rounds of
processes (1 core, all cores, 1 core, ...), and each keeps its fastest time,
so that a burst of load from other jobs does not fall on one setting only.
"""

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Optional

from bench import ratios

_KINDS = (ratios.LIMIT, 'package')


def _measure_with_cpus(cpus: Sequence[int], workload_name: str,
                       num_clients: int, repeats: int,
                       max_clients_per_call: Optional[int]) -> dict[str, Any]:
  request = {'kind': 'ratios', 'workload': workload_name,
             'clients': num_clients, 'repeats': repeats,
             'variants': ['package'],
             'max_clients_per_call': max_clients_per_call}
  completed = subprocess.run(
      ['taskset', '--cpu-list', ','.join(map(str, cpus)),
       sys.executable, '-m', 'bench.probe', json.dumps(request)],
      capture_output=True, text=True, check=False,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if completed.returncode:
    raise RuntimeError(f'probe {request} on cpus {list(cpus)} failed:\n'
                       f'{completed.stderr[-3000:]}')
  return json.loads(completed.stdout.strip().splitlines()[-1])[0]


def measure_speedup(
    workload_name: str, num_clients: int, repeats: int, trials: int = 2,
    max_clients_per_call: Optional[int] = None) -> list[dict[str, Any]]:
  """Rows `{kind, one_core_s, all_cores_s, cores, speedup}` for the limit and
  the full TFF round (on a local runtime with `max_clients_per_call`).

  Raises:
    ValueError: If this process may use only one core, or `trials` is not
      positive.
  """
  all_cpus = sorted(os.sched_getaffinity(0))
  if len(all_cpus) < 2:
    raise ValueError(f'Only CPU {all_cpus} is available; a speed-up from 1 '
                     'core needs at least 2.')
  if trials < 1:
    raise ValueError(f'trials must be positive, got {trials}.')
  settings = {'one_core_s': all_cpus[:1], 'all_cores_s': all_cpus}
  fastest = {(setting, kind): float('inf') for setting in settings
             for kind in _KINDS}
  for _ in range(trials):
    for setting, cpus in settings.items():
      row = _measure_with_cpus(cpus, workload_name, num_clients, repeats,
                               max_clients_per_call)
      for kind in _KINDS:
        fastest[setting, kind] = min(fastest[setting, kind], row[f'{kind}_s'])
  return [{
      'workload': workload_name,
      'clients': num_clients,
      'kind': kind,
      'cores': len(all_cpus),
      'one_core_s': fastest['one_core_s', kind],
      'all_cores_s': fastest['all_cores_s', kind],
      'speedup': fastest['one_core_s', kind] / fastest['all_cores_s', kind],
  } for kind in _KINDS]
