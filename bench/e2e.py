"""End to end: a driver run of Synthetic at a large cohort, from the
command line, against the limit's time for the same client work.

`measure_e2e` runs `run_experiment.py --task=synthetic
--clients_per_round=M --total_rounds=R --rounds_per_eval=E` as a user would
(start-up, fused rounds, evaluation, checkpoints, outputs), then times the
limit (`bench.limit.ShardLimitRound`: plain TensorFlow, one thread, the
faster of oneDNN on and off: `bench.limit`) on the
client work of the run's first rounds: the same sampled clients (the
driver's sampler and seed), batched by the task's own recipe. The row holds
the run's wall time, its start-up (wall time not spent in rounds or
evaluations: imports, building, writing outputs), the time from the
command to the start of round 1 (imports, reading the task, building the
process: what a user waits for before the first round), the first evaluation of
the validation and test clients (`eval_time_sec`: it also builds the
evaluation on the worker) and the mean of the later ones (the first if
there is only one), the mean round, the projection to `PROJECTED_ROUNDS`
rounds (the
run's wall time plus the remaining rounds at the mean round: further
evaluations are not projected), and the ratio of the mean round to the
limit's.
"""

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf
import tensorflow_federated as tff

from bench import limit
import tasks
from fl_common import run_layout
from fl_engine import shards

PROJECTED_ROUNDS = 1_500
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIMIT_ROUNDS = 3


def measure_e2e(clients_per_round: int = 800, rounds: int = 100,
                rounds_per_eval: int = 50, seed: int = 0) -> dict[str, Any]:
  """One end-to-end row (module docstring).

  Raises:
    RuntimeError: If the driver run fails (its last lines of stderr).
  """
  metrics, wall, first_round_done = run_driver(
      [f'--clients_per_round={clients_per_round}', f'--total_rounds={rounds}',
       f'--rounds_per_eval={rounds_per_eval}', f'--seed={seed}'])
  round_seconds = metrics['round_time_sec'].to_numpy()
  eval_seconds = metrics['eval_time_sec'].dropna().to_numpy()
  limit_seconds, setting = fastest_limit_round_seconds(clients_per_round,
                                                      seed)
  mean_round = float(np.mean(round_seconds))
  return {
      'clients': clients_per_round, 'rounds': rounds,
      'wall_s': wall,
      'startup_s': wall - float(np.sum(round_seconds) + np.sum(eval_seconds)),
      # From the command to the start of round 1 (its line printed, less
      # its time and any evaluation after it).
      'first_round_s': first_round_done - float(
          round_seconds[0] + np.nan_to_num(
              metrics['eval_time_sec'].to_numpy()[0])),
      'first_eval_s': float(eval_seconds[0]),
      'eval_s': float(np.mean(eval_seconds[1:] if len(eval_seconds) > 1
                              else eval_seconds)),
      'round_s': mean_round,
      'projected_s': wall + (PROJECTED_ROUNDS - rounds) * mean_round,
      'limit_round_s': limit_seconds,
      'limit_onednn': setting,
      'ratio': mean_round / limit_seconds,
  }


def run_driver(flags: Sequence[str]) -> tuple[pd.DataFrame, float, float]:
  """Runs `run_experiment.py --task=synthetic` with `flags` into a temporary
  directory as a user would: its metrics, its wall time and the time from
  the command to round 1's line.

  Raises:
    RuntimeError: If the driver run fails (its last lines of stderr).
  """
  with tempfile.TemporaryDirectory() as root:
    command = [sys.executable, os.path.join(_REPO, 'run_experiment.py'),
               '--task=synthetic', *flags, f'--root_output_dir={root}',
               '--experiment_name=e2e']
    first_round_done = None
    with tempfile.TemporaryFile('w+') as stderr:
      started = time.perf_counter()
      with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                            text=True, cwd=_REPO,
                            stdin=subprocess.DEVNULL) as driver:
        for line in driver.stdout:  # The driver flushes each round's line.
          if first_round_done is None and line.startswith('round 1/'):
            first_round_done = time.perf_counter() - started
      wall = time.perf_counter() - started
      if driver.returncode != 0 or first_round_done is None:
        stderr.seek(0)
        raise RuntimeError(
            f'the driver run failed: {stderr.read()[-2000:]}')
    return (run_layout.read_metrics(os.path.join(root, 'e2e')), wall,
            first_round_done)


def fastest_limit_round_seconds(clients_per_round: int,
                                seed: int) -> tuple[float, str]:
  """`limit_round_seconds` here and, with oneDNN off, in a child process
  (`bench.limit`'s module docstring): the faster, and its oneDNN setting."""
  here = limit.onednn_setting()
  seconds = {here: limit_round_seconds(clients_per_round, seed)}
  if here != 'off':
    with limit.environment(limit.ONEDNN_OFF), \
        concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context('spawn')) as pool:
      seconds['off'] = pool.submit(limit_round_seconds, clients_per_round,
                                   seed).result()
  setting = min(seconds, key=seconds.get)
  return seconds[setting], setting


def limit_round_seconds(clients_per_round: int, seed: int) -> float:
  """The limit's mean time for the client work of the run's first rounds."""
  task = tasks.create_task('synthetic')
  train = task.datasets.train_data
  recipe = shards.BatchRecipe(**task.datasets.train_preprocess_fn.batch_recipe)
  sample = tff.simulation.build_uniform_sampling_fn(
      train.client_ids, replace=False, random_seed=seed)
  model_fn = lambda: tf.keras.Sequential([  # pylint: disable=g-long-lambda
      tf.keras.layers.Dense(5, activation='softmax', input_shape=(60,))])
  times = []
  for round_num in range(1, _LIMIT_ROUNDS + 1):
    ids = sample(round_num, clients_per_round)
    [shard] = shards.shards_from_arrays(
        train.arrays, [train.client_rows(i) for i in ids], recipe,
        len(ids), np.random.default_rng([seed, round_num]))
    round_fn = limit.ShardLimitRound(
        model_fn, tf.keras.losses.SparseCategoricalCrossentropy, 0.1, shard)
    round_fn()  # warm-up: tracing
    started = time.perf_counter()
    round_fn()
    times.append(time.perf_counter() - started)
  return float(np.mean(times))
