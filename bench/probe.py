"""One measurement in a fresh process: `python -m bench.probe '<json>'`.

The benchmark starts this module as a subprocess where a measurement needs a
process of its own (a CPU affinity, a clean peak memory). The request is a
JSON object:

* `{"kind": "ratios", "workload": W, "clients": N, "repeats": R,
  "variants": [...], "max_clients_per_call": K}` —
  `bench.ratios.measure_ratios` on a local runtime;
* `{"kind": "memory", "algorithm": A, "workload": W, "clients": N,
  "rounds": R, "max_clients_per_call": K}` —
  `bench.memory.measure_peak_memory`.

`K` is the local runtime's cohort slice size, `null` for none.

The result is printed as JSON on the last line of stdout.
"""

import json
import sys


from absl import logging  # pylint: disable=g-import-not-at-top

from bench import memory
from bench import ratios
from bench import workloads
from fl_engine import runtime


def run(request: dict) -> object:
  """The result of one request (see the module docstring).

  Raises:
    ValueError: If the request's kind is unknown.
  """
  kind = request.get('kind')
  if kind == 'ratios':
    with runtime.worker_runtime(
        max_clients_per_call=request['max_clients_per_call'],
        keep_state_on_worker=True):
      return ratios.measure_ratios(
          workloads.get_workload(request['workload']), [request['clients']],
          request['repeats'], request['variants'])
  if kind == 'memory':
    return memory.measure_peak_memory(
        request['algorithm'], workloads.get_workload(request['workload']),
        request['clients'], request['rounds'],
        request['max_clients_per_call'])
  raise ValueError(f'Unknown probe kind {kind!r}; expected "ratios" or '
                   '"memory".')


def main(argv: list[str]) -> None:
  runtime.refuse_unmanaged_default_context()
  if len(argv) != 2:
    raise SystemExit(f'usage: python -m bench.probe \'<json request>\'; got '
                     f'{argv[1:]}')
  logging.set_verbosity(logging.ERROR)
  print(json.dumps(run(json.loads(argv[1]))))


if __name__ == '__main__':
  main(sys.argv)
