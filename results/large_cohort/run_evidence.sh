#!/bin/bash
# FedAvg (server SGD, tuned lrs) on Synthetic at M = 10, 50, 200, with the
# driver's example weighting and/or --uniform_weighting (WEIGHTINGS); adaptive
# clipping off so that ||Delta|| is not capped. The uniform runs of README.md
# (the example-weighted ones are from an earlier version; command there):
#   ROOT=/tmp/e2runs/large_cohort_uniform COHORTS=10,50,200 ROUNDS=200 \
#       WEIGHTINGS=true results/large_cohort/run_evidence.sh
#   .venv/bin/python results/large_cohort/summarize.py \
#       --root=/tmp/e2runs/large_cohort_uniform
# Rerunning skips finished runs and resumes unfinished ones from their last
# checkpoint; a larger ROUNDS extends them.
set -eu
cd "$(dirname "$0")/../.."
ROOT=${ROOT:-/tmp/e2runs/large_cohort}
ROUNDS=${ROUNDS:-300}
COHORTS=${COHORTS:-10,50,200}
WEIGHTINGS=${WEIGHTINGS:-false,true}  # values of --uniform_weighting
PARALLEL=${PARALLEL:-1}
nice -n 10 .venv/bin/python -m large_cohort.sweep --parallel="$PARALLEL" \
    --axis=clients_per_round:"$COHORTS" --axis=uniform_weighting:"$WEIGHTINGS" \
    --total_rounds="$ROUNDS" --root_output_dir="$ROOT" \
    --name_prefix=fedavg_noclip -- \
    --task=synthetic --synthetic_num_classes=10 --algorithm=fedopt --server_optimizer=sgd --noclipping \
    --seed=0 --rounds_per_eval=5 --max_eval_clients=200 \
    --rounds_per_checkpoint=25
