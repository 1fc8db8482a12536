"""Evaluation: per-client against pooled scoring of the same test clients.

`measure_evaluation` runs the driver twice as GeL's Synthetic reproductions
do (`run_experiment.py --task=synthetic --algorithm=fedavgcm_gel`, every
round evaluated on all 1,000 test clients), once with `--per_client_eval`
(one loop step per client: per-client accuracy percentiles) and once with
`--noper_client_eval` (each split's examples pooled in large batches,
`fl_engine.shards.pooled`). Each row holds the median of the run's
`eval_time_sec` (the first, which also builds the evaluation, left out),
the final test accuracy and loss (pooled scoring must give the per-client
run's, as the same seed trains the same model), and the median's ratio to
the per-client run's.
"""

from typing import Any

import numpy as np

from bench import e2e

MODES = ('per_client_eval', 'noper_client_eval')


def measure_evaluation(rounds: int = 20, clients_per_round: int = 20,
                       seed: int = 0) -> list[dict[str, Any]]:
  """One row per mode of `MODES` (module docstring).

  Raises:
    RuntimeError: If a driver run fails.
  """
  rows = []
  for mode in MODES:
    metrics, _, _ = e2e.run_driver([
        '--algorithm=fedavgcm_gel', '--noclipping',
        f'--clients_per_round={clients_per_round}',
        f'--total_rounds={rounds}', '--rounds_per_eval=1',
        '--max_eval_clients=0', '--validation_fraction=0', f'--seed={seed}',
        f'--{mode}'])
    seconds = metrics['eval_time_sec'].dropna().to_numpy()
    last = metrics.dropna(subset=['test/accuracy']).iloc[-1]
    rows.append({
        'evaluation': 'per client' if mode == MODES[0] else 'pooled',
        'rounds': rounds,
        'eval_s': float(np.median(seconds[1:] if len(seconds) > 1
                                  else seconds)),
        'test_accuracy': float(last['test/accuracy']),
        'test_loss': float(last['test/loss']),
    })
  for row in rows:
    row['ratio'] = row['eval_s'] / rows[0]['eval_s']
  return rows
