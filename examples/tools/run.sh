#!/usr/bin/env bash
# The tools example, offline, from the repository root: SFT warm start -> GRPO on calculator episodes -> evaluation.
#   OMP_NUM_THREADS=2 bash examples/tools/run.sh
set -euo pipefail
TW=${TW:-training-wizard}
start=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
stage "SFT on 256 worked episodes"
$TW examples/tools/sft.toml
stage "GRPO on calculator episodes"
$TW examples/tools/config.toml
stage "held-out accuracy and tool use, trained model against the base model"
$TW eval examples/tools/evaluate.toml
stage "done"
