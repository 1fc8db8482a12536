"""Run directories written as the driver writes them, for the tests.

Not a test module: test modules import it (`from tests import
run_directories`).
"""

import json
import os
from typing import Any

import pandas as pd


def write_run(root: str, name: str, hparams: dict[str, Any],
              metrics: dict[str, Any]) -> str:
  """Writes `<root>/<name>/{hparams.json,metrics.csv}`; returns the run dir.

  Args:
    root: The directory holding the runs.
    name: The run directory's name.
    hparams: The run's flags, written as `hparams.json`.
    metrics: Column name to per-round values, written as `metrics.csv`.
  """
  run_dir = os.path.join(root, name)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, 'hparams.json'), 'w') as f:
    json.dump(hparams, f)
  pd.DataFrame(metrics).to_csv(os.path.join(run_dir, 'metrics.csv'),
                               index=False)
  return run_dir
