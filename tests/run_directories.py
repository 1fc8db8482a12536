"""Run directories written as the driver writes them, for the tests.

Not a test module: test modules import it (`from tests import
run_directories`).
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, Optional

import pandas as pd

from experiment_driver import prestart
from fl_common import run_layout


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


# --- The driver as a user runs it ---

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Columns that measure the machine, not the computation.
TIMING_COLUMNS = run_layout.TIMING_COLUMNS


def driver_command(*args: str) -> list[str]:
  """The command line of `run_experiment.py` with `args`."""
  return [sys.executable, os.path.join(REPO, 'run_experiment.py'), *args]


# Driver runs fork from a Python that imported the driver already, as the
# sweeps' do (`experiment_driver.prestart`); a test that needs a process of
# its own making (its pid, signals, a kill) starts `driver_command` itself.
_PRESTARTER = prestart.Prestarter()


def run_driver(*args: str, check: bool = True,
               env: Optional[Mapping[str, str]] = None
               ) -> subprocess.CompletedProcess:
  """Runs the driver to its end; with `check`, a non-zero exit fails."""
  command = driver_command(*args)
  with tempfile.TemporaryDirectory() as logs:
    out, err = os.path.join(logs, 'stdout'), os.path.join(logs, 'stderr')
    code = _PRESTARTER.run(command, out, err, cwd=REPO, env=env, timeout=600)
    with open(out) as f_out, open(err) as f_err:
      result = subprocess.CompletedProcess(command, code, f_out.read(),
                                           f_err.read())
  if check and result.returncode != 0:
    raise AssertionError(f'exit {result.returncode}:\n{result.stderr[-3000:]}')
  return result


def read_metrics(run_dir: str) -> pd.DataFrame:
  """A run's metrics.csv without the timing columns."""
  frame = pd.read_csv(os.path.join(run_dir, 'metrics.csv'))
  return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])
