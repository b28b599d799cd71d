#!/usr/bin/env bash
# Distillation against GRPO from the same start for the same wall time: the distillation recipe and the GRPO
# example's recipe start together, one thread each, and the GRPO run is stopped (SIGTERM: it finishes its
# iteration and writes a checkpoint) the moment the distillation run ends. The GRPO model at that point is then
# evaluated like the student (README.md, "Against GRPO"). Needs the teacher: run examples/grpo/config.toml first.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
training-wizard examples/distill/config.toml "$@" &
distill=$!
training-wizard examples/grpo/config.toml output_dir='"runs/grpo-same-time"' &  # its 3,200 episodes take longer
grpo=$!
wait "$distill"
kill -TERM "$grpo"
wait "$grpo" || true  # 143: stopped by SIGTERM after its checkpoint
# The checkpoint's adapter, with the tokenizer files the evaluation reads (the student's: the same tokenizer).
step=$(cat runs/grpo-same-time/checkpoints/latest)  # the newest checkpoint's folder name
rm -rf runs/grpo-same-time/model
cp -r "runs/grpo-same-time/checkpoints/$step/model" runs/grpo-same-time/model
cp runs/arithmetic-distill/model/{tokenizer.json,tokenizer_config.json,chat_template.jinja} runs/grpo-same-time/model/
echo "GRPO stopped at $step"
