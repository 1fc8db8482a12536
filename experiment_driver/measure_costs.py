"""Prints AdaBest's, FedDyn's, SCAFFOLD's and FedAvg's counted arithmetic as CSV.

    python -m experiment_driver.measure_costs --digits_model=wide_mlp

Counts, per model parameter, the additions and multiplications of each
algorithm's local step, client conclusion and server update
(`adabest_tff.cost.count_model_costs`: Varno et al. 2022, Supplementary
Tables 4-5) on the digits task's model; the output has the columns
`algorithm`, `phase`, `parameters`, `additions`, `multiplications`. This is
how `python -m reproduce adabest table_cost` counts them: as a subprocess,
like every run it makes, so that its own process imports no algorithm.
"""

import argparse
import csv
import sys
from collections.abc import Sequence
from typing import Optional

from adabest_tff import cost
from fl_engine import runtime
from tasks import partitioned_task


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m experiment_driver.measure_costs',
      description=__doc__.split('\n\n')[2].replace('\n', ' '))
  models = sorted(partitioned_task.DATASET_SETTINGS['digits'].other_models)
  parser.add_argument('--digits_model', choices=models, default=None,
                      help='The digits model (default: the paper\'s MLP).')
  args = parser.parse_args(argv)
  runtime.refuse_unmanaged_default_context()
  task = partitioned_task.create_partitioned_task(
      'digits', model=args.digits_model)
  rows = cost.count_model_costs(task.model_fn)
  writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]),
                          lineterminator='\n')
  writer.writeheader()
  writer.writerows(rows)
  return 0


if __name__ == '__main__':
  sys.exit(main())
