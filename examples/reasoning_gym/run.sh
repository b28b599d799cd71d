#!/usr/bin/env bash
# The reasoning-gym example, offline, from the repository root: GRPO on chain_sum -> held-out evaluation.
#   OMP_NUM_THREADS=2 bash examples/reasoning_gym/run.sh
set -euo pipefail
TW=${TW:-training-wizard}
start=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
stage "GRPO on reasoning-gym's chain_sum"
$TW examples/reasoning_gym/config.toml
stage "held-out accuracy, trained model against the base model"
$TW eval examples/reasoning_gym/evaluate.toml
stage "done"
