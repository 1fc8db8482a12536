#!/bin/bash
# FedDyn vs AdaBest at 5 of 1,000 clients per round on partitioned Synthetic
# (Dirichlet 0.3), each run under measure_peak_memory.py and /usr/bin/time -v.
# Usage: results/adabest/run_evidence.sh NAME [extra driver flags...]
# What was run (see README.md):
#   results/adabest/run_evidence.sh feddyn --algorithm=feddyn
#   results/adabest/run_evidence.sh adabest_beta0.9 --algorithm=adabest --adabest_beta=0.9
#   ROUNDS=250 results/adabest/run_evidence.sh fedavg_reference \
#       --algorithm=adabest --adabest_beta=0 --adabest_mu=0
set -eu
cd "$(dirname "$0")/../.."
ROOT=${ROOT:-/tmp/e2runs/adabest}
ROUNDS=${ROUNDS:-500}
NAME=$1; shift
mkdir -p "$ROOT/logs"
nice -n 10 .venv/bin/python results/adabest/measure_peak_memory.py \
    --output="$ROOT/logs/$NAME.memory.json" -- \
  /usr/bin/time -v .venv/bin/python run_experiment.py \
    --task=synthetic_partitioned --num_clients=1000 --clients_per_round=5 \
    --dirichlet_alpha=0.3 --partition_seed=0 --seed=0 \
    --total_rounds="$ROUNDS" --rounds_per_eval=10 --max_eval_clients=20 \
    --rounds_per_checkpoint=50 \
    --root_output_dir="$ROOT" --experiment_name="$NAME" "$@" \
  > "$ROOT/logs/$NAME.stdout" 2> "$ROOT/logs/$NAME.stderr"
