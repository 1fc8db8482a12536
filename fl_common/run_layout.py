"""A run directory's layout: its file names, the metrics' round column, and
the two readers everyone uses.

The driver writes `<root_output_dir>/<experiment_name>/` (the writer, with
its lock, checkpoints and manifest, is `experiment_driver.outputs`); GeL's
accounting, the experiments' sweeps and analysis (`reproduce`) and the
benchmarks read it. All of them name its files and columns from here:

    hparams.json     the run's flags and the values derived from them
    manifest.json    what each checkpoint was saved with (`run_files`), and
                     the code that ran each stretch of rounds and the
                     environment it ran in (`code_revision`,
                     `environment`; `run_files.Manifest` reads them)
    metrics.csv      one row per round, `round` first, flat metric columns
                     ('test/accuracy', 'client_work/train/loss', ...)
    tensorboard/     the same scalars per round
    checkpoints/     program state, one directory per saved round
    client_states/   stateful clients' states (`client_state_store`)
    run.lock         the pid of the run holding the directory
"""

import functools
import importlib.metadata
import json
import os
import platform
import subprocess
from typing import Any, Optional

import pandas as pd

HPARAMS_FILE = 'hparams.json'
MANIFEST_FILE = 'manifest.json'
METRICS_FILE = 'metrics.csv'
TENSORBOARD_DIR = 'tensorboard'
CHECKPOINT_DIR = 'checkpoints'
CLIENT_STATES_DIR = 'client_states'
LOCK_FILE = 'run.lock'
ROUND_COLUMN = 'round'
# manifest.json's list of `{'revision': code_revision(), 'from_round': r,
# 'environment': environment()}`, one per start of the driver whose rounds
# the run kept.
MANIFEST_CODE_KEY = 'code'
# Besides the code, what decides a run's numbers (`environment`): each
# library's name and the distributions that may provide it.
_ENVIRONMENT_LIBRARIES = (('TensorFlow', ('tensorflow', 'tensorflow-cpu')),
                          ('TFF', ('tensorflow-federated',)),
                          ('NumPy', ('numpy',)))
# The package's distribution (setup.py), for an installed copy without git.
DISTRIBUTION = 'fl-papers-tff'
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# metrics.csv's wall-clock columns: they differ between identical runs.
TIMING_COLUMNS = ('round_time_sec', 'eval_time_sec', 'cohort_eval_time_sec')


def _require(path: str, run_dir: str) -> None:
  if not os.path.isfile(path):
    raise ValueError(f'{path} does not exist; is {run_dir!r} a run directory'
                     ' of run_experiment.py?')


def read_metrics(run_dir: str) -> pd.DataFrame:
  """A run's `metrics.csv`, one row per round, sorted by round.

  Raises:
    ValueError: The file is missing, empty or has no round column.
  """
  path = os.path.join(run_dir, METRICS_FILE)
  _require(path, run_dir)
  try:
    metrics = pd.read_csv(path)
  except pd.errors.EmptyDataError as e:
    raise ValueError(f'{path} is empty') from e
  if ROUND_COLUMN not in metrics.columns:
    raise ValueError(f'{path} has no {ROUND_COLUMN!r} column')
  return metrics.sort_values(ROUND_COLUMN, ignore_index=True)


def read_hparams(run_dir: str) -> dict[str, Any]:
  """A run's `hparams.json`.

  Raises:
    ValueError: The file is missing or is not a JSON object.
  """
  path = os.path.join(run_dir, HPARAMS_FILE)
  _require(path, run_dir)
  with open(path) as f:
    hparams = json.load(f)
  if not isinstance(hparams, dict):
    raise ValueError(f'{path} must hold a JSON object, got'
                     f' {type(hparams).__name__}')
  return hparams


# The package's folder of generated reports (`python -m reproduce`).
REPORTS_DIR = 'results'


@functools.lru_cache(maxsize=None)
def environment() -> str:
  """The environment a run is made in, as its manifest records it:
  `Python 3.13.0, TensorFlow 2.21.0, TFF 0.87.0, NumPy 2.4.6, CPU AMD EPYC
  (x86_64, avx512f)`.

  The same commit may give other numbers under another TensorFlow or on
  another CPU (TensorFlow's kernels are chosen by the widest vector
  instructions the CPU has, and sum floats in another order), so a report
  names the environments its runs were made in beside their code.
  """
  parts = [f'Python {platform.python_version()}']
  for name, distributions in _ENVIRONMENT_LIBRARIES:
    for distribution in distributions:
      try:
        parts.append(f'{name} {importlib.metadata.version(distribution)}')
        break
      except importlib.metadata.PackageNotFoundError:
        continue
    else:
      parts.append(f'{name} not installed')
  return ', '.join([*parts, _cpu()])


# The vector instruction sets that decide TensorFlow's CPU kernels, widest
# first (`/proc/cpuinfo`'s flag names).
_VECTOR_FLAGS = ('avx512f', 'avx2', 'avx', 'sse4_2')


def _cpu() -> str:
  """'CPU <model> (<machine>, <widest vector instructions>)', from
  `/proc/cpuinfo` where there is one (Linux), else the machine alone."""
  model, flags = platform.processor(), set()
  try:
    with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() == 'model name' and value.strip():
          model = value.strip()
        elif key.strip() == 'flags':
          flags = set(value.split())
        if model and flags:
          break
  except OSError:
    pass
  widest = next((flag for flag in _VECTOR_FLAGS if flag in flags), None)
  details = ', '.join(d for d in (platform.machine(), widest) if d)
  return f'CPU {model or "unknown"}' + (f' ({details})' if details else '')


@functools.lru_cache(maxsize=None)
def code_revision(root: Optional[str] = None) -> str:
  """The code a run is made with, as its manifest records it: `git <commit>`
  (12 hex digits; `+modified` when a tracked file outside `results/`
  differs from the commit)
  for a git checkout of the package at `root` (default: this package's),
  else `fl-papers-tff <version>` for an installed copy, else `unknown`.

  A report lists the revisions that made its runs, so that runs of older
  code are seen, not averaged in silently.
  """
  root = root or _PACKAGE_ROOT

  def git(*args: str) -> Optional[str]:
    try:
      result = subprocess.run(
          ['git', '--no-optional-locks', '-C', root, *args],
          capture_output=True, text=True, timeout=30, check=False,
          stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
      return None
    return result.stdout.strip() if result.returncode == 0 else None

  # Only the package's own repository: not one that merely encloses it.
  if os.path.exists(os.path.join(root, '.git')):
    commit = git('rev-parse', '--short=12', 'HEAD')
    if commit:
      # The reports under results/ are what runs make, not code: a run
      # started while `python -m reproduce` rewrites one is of the commit.
      changed = git('status', '--porcelain', '--untracked-files=no', '--',
                    '.', f':(exclude){REPORTS_DIR}')
      return f'git {commit}' + ('+modified' if changed else '')
  try:
    return f'{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}'
  except importlib.metadata.PackageNotFoundError:
    return 'unknown'
