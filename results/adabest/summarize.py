"""Tables and figures of the FedDyn / AdaBest runs (AdaBest Figure 1/4 regime).

    .venv/bin/python results/adabest/summarize.py --root=/tmp/e2runs/adabest

Reads `<root>/<run>/metrics.csv` for every run named on `--runs`, and
`<root>/logs/<run>.memory.json` / `.stderr` (written by `run_evidence.sh`)
for the peak memory. Writes into this directory:

* `norms_and_accuracy.csv`: per run, at every `--every`-th evaluation round,
  the cloud model norm `‖x^t‖`, the deployed model norm `‖x̄^t‖`, `‖h^t‖`
  and test accuracy;
* `summary.csv`: per run, first/last/max `‖x^t‖`, the slope of `‖x^t‖` over
  the last half of its rounds and over the second half of the rounds all
  runs reached, final and best test accuracy, peak memory;
* `norm_and_accuracy_vs_rounds.png`: `‖x^t‖`, `‖h^t‖` and test accuracy
  against rounds, one line per run.
"""

import argparse
import json
import os
import re

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import pandas as pd

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
CLOUD_NORM = 'model_norms/global_model_norm'
DEPLOYED_NORM = 'model_norms/deployed_model_norm'
H_NORM = 'finalizer/oracle_gradient_estimate_norm'
TEST_ACCURACY = 'test/accuracy'
LABELS = {
    'feddyn': 'FedDyn (μ=0.02)',
    'adabest_beta0.9': 'AdaBest (μ=0.02, β=0.9)',
    'fedavg_reference': 'FedAvg (AdaBest with β=0, μ=0)',
}


def _peak_memory(root: str, run: str) -> dict:
  """Peak RSS (MiB) of the driver and its worker from the run's logs."""
  result = {}
  memory_path = os.path.join(root, 'logs', f'{run}.memory.json')
  if os.path.exists(memory_path):
    with open(memory_path) as f:
      memory = json.load(f)
    for process in memory['processes']:
      if process['name'].startswith('worker_binary'):
        result['worker_peak_rss_mib'] = process['peak_rss_mib']
      elif process['name'].startswith('python'):
        result['driver_peak_rss_mib_sampled'] = process['peak_rss_mib']
    result['peak_simultaneous_rss_mib'] = memory[
        'peak_simultaneous_tree_rss_mib']
  stderr_path = os.path.join(root, 'logs', f'{run}.stderr')
  if os.path.exists(stderr_path):
    with open(stderr_path, errors='replace') as f:
      text = f.read()
    found = re.search(r'Maximum resident set size \(kbytes\): (\d+)', text)
    if found:
      result['driver_max_rss_mib_time_v'] = int(found.group(1)) / 1024
    found = re.search(r'Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)',
                      text)
    if found:
      result['wall_time'] = found.group(1)
  states = os.path.join(root, run, 'client_states')
  if os.path.isdir(states):
    files = [n for n in os.listdir(states) if n.endswith('.npz')]
    result['client_state_files'] = len(files)
    result['distinct_clients_stored'] = len({n.split('@')[0] for n in files})
    result['client_states_mib'] = sum(
        os.path.getsize(os.path.join(states, n))
        for n in os.listdir(states)) / 2**20
  return result


def _slope(rounds: pd.Series, values: pd.Series) -> float:
  return float(np.polyfit(rounds.to_numpy(float), values.to_numpy(float), 1)[0])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--root', default='/tmp/e2runs/adabest')
  parser.add_argument('--runs', default='feddyn,adabest_beta0.9,fedavg_reference')
  parser.add_argument('--every', type=int, default=50,
                      help='Rounds between rows of norms_and_accuracy.csv.')
  args = parser.parse_args()
  runs = {}
  for run in args.runs.split(','):
    path = os.path.join(args.root, run, 'metrics.csv')
    if os.path.exists(path):
      runs[run] = pd.read_csv(path).sort_values('round', ignore_index=True)
  if not runs:
    raise SystemExit(f'no metrics.csv of {args.runs} under {args.root}')

  common_rounds = min(int(frame['round'].max()) for frame in runs.values())
  table, summary = [], []
  for run, frame in runs.items():
    evaluated = frame[frame[TEST_ACCURACY].notna()]
    keep = evaluated[(evaluated['round'] % args.every == 0)
                     | (evaluated['round'] == frame['round'].max())]
    for _, row in keep.iterrows():
      table.append({'run': run, 'round': int(row['round']),
                    'cloud_norm': row[CLOUD_NORM],
                    'deployed_norm': row[DEPLOYED_NORM],
                    'h_norm': row[H_NORM],
                    'test_accuracy': row[TEST_ACCURACY]})
    last_half = frame[frame['round'] > frame['round'].max() / 2]
    common_half = frame[(frame['round'] > common_rounds / 2)
                        & (frame['round'] <= common_rounds)]
    summary.append({
        'run': run,
        'rounds': int(frame['round'].max()),
        'cloud_norm_round1': frame[CLOUD_NORM].iloc[0],
        'cloud_norm_final': frame[CLOUD_NORM].iloc[-1],
        'cloud_norm_max': frame[CLOUD_NORM].max(),
        'cloud_norm_slope_last_half_per_100_rounds':
            100 * _slope(last_half['round'], last_half[CLOUD_NORM]),
        f'cloud_norm_at_round_{common_rounds}': common_half[CLOUD_NORM].iloc[-1],
        f'cloud_norm_slope_rounds_{common_rounds // 2}_{common_rounds}'
        '_per_100_rounds':
            100 * _slope(common_half['round'], common_half[CLOUD_NORM]),
        f'test_accuracy_at_round_{common_rounds}': common_half[
            TEST_ACCURACY].dropna().iloc[-1],
        'h_norm_final': frame[H_NORM].iloc[-1],
        'h_norm_max': frame[H_NORM].max(),
        'test_accuracy_final': evaluated[TEST_ACCURACY].iloc[-1],
        'test_accuracy_best': evaluated[TEST_ACCURACY].max(),
        'round_of_best_test_accuracy':
            int(evaluated.loc[evaluated[TEST_ACCURACY].idxmax(), 'round']),
        'mean_train_accuracy_last_50_rounds':
            frame['train/accuracy'].iloc[-50:].mean(),
        **_peak_memory(args.root, run),
    })
  pd.DataFrame(table).to_csv(os.path.join(OUT_DIR, 'norms_and_accuracy.csv'),
                             index=False, float_format='%.4f')
  summary = pd.DataFrame(summary)
  summary.to_csv(os.path.join(OUT_DIR, 'summary.csv'), index=False,
                 float_format='%.4f')
  with pd.option_context('display.width', 250, 'display.max_columns', 30):
    print(summary.T)
    print(pd.DataFrame(table).pivot(index='round', columns='run'))

  fig, axes = plt.subplots(3, 1, figsize=(7, 9), sharex=True)
  for run, frame in runs.items():
    label = LABELS.get(run, run)
    line, = axes[0].plot(frame['round'], frame[CLOUD_NORM], label=label)
    axes[1].plot(frame['round'], frame[H_NORM], color=line.get_color())
    evaluated = frame[frame[TEST_ACCURACY].notna()]
    axes[2].plot(evaluated['round'], 100 * evaluated[TEST_ACCURACY],
                 color=line.get_color())
  axes[0].set_ylabel('‖x^t‖ (cloud model)')
  axes[1].set_ylabel('‖h^t‖ (server estimate)')
  axes[1].set_yscale('log')
  axes[2].set_ylabel('test accuracy (%)')
  axes[2].set_xlabel('communication round')
  axes[0].set_title('partitioned Synthetic, 5 of 1,000 clients per round,'
                    ' Dirichlet 0.3', fontsize='small')
  axes[0].legend(fontsize='small')
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.tight_layout()
  path = os.path.join(OUT_DIR, 'norm_and_accuracy_vs_rounds.png')
  fig.savefig(path, dpi=120)
  print('wrote', path)


if __name__ == '__main__':
  main()
