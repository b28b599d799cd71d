#!/usr/bin/env bash
# The whole pipeline example, offline, from the repository root: pairs -> reward model -> RLOO -> evaluation.
#   OMP_NUM_THREADS=2 bash examples/pipeline/run.sh
set -euo pipefail
TW=${TW:-training-wizard}
PY=${PY:-python}
start=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
stage "pairs from the base policy, ranked by the handcrafted reward"
$PY examples/pipeline/make_pairs.py --out runs/pipeline/pairs.jsonl
stage "reward model"
$TW examples/pipeline/reward_model.toml
stage "RLOO on the learned reward"
$TW examples/pipeline/rloo.toml
stage "win rate against the base policy, judged by the handcrafted reward"
$TW eval examples/pipeline/evaluate.toml
stage "done"
