#!/bin/bash
# FedAvg (server SGD, tuned lrs) on Synthetic, adaptive clipping off so that
# ||Delta|| is not capped. Usage (what was run; see README.md):
#   COHORTS=10     ROUNDS=300 results/large_cohort/run_evidence.sh
#   COHORTS=50,200 ROUNDS=150 results/large_cohort/run_evidence.sh
# Rerunning with a larger ROUNDS resumes a run from its last checkpoint.
set -eu
cd "$(dirname "$0")/../.."
ROOT=${ROOT:-/tmp/e2runs/large_cohort}
ROUNDS=${ROUNDS:-300}
COHORTS=${COHORTS:-10,50,200}
nice -n 10 .venv/bin/python -m large_cohort.sweep \
    --axis=clients_per_round:"$COHORTS" --total_rounds="$ROUNDS" \
    --root_output_dir="$ROOT" --name_prefix=fedavg_noclip -- \
    --task=synthetic --algorithm=fedopt --server_optimizer=sgd --noclipping \
    --seed=0 --rounds_per_eval=5 --max_eval_clients=100 \
    --rounds_per_checkpoint=25
