#!/usr/bin/env bash
# The GPU measurements, in one run on a CUDA machine without network access:
#   0. our decode loop against transformers' generate at the same batch, and a profile of one call of ours
#      (bench/gpu_decode.py): where a token step's time goes;
#   1. the `--dry-run` memory plan against the CUDA allocator's measured peak (bench/memory_plan.py --device cuda),
#      with each run's first-iteration metrics (KL 0 and ratio 1 before any update, finite losses);
#   2. GRPO at real lengths against TRL 1.16 (bench/long_completions.py --device cuda), ours with padding_free and
#      max_tokens_per_micro_batch (LONG_DEFAULTS=1: a second pair with our defaults).
# Python packages the machine lacks travel as wheels in $WHEELS (default .whl: pydantic and pydantic_core,
# annotated_types, typing_inspection, datasets, dill, multiprocess, peft, trl; `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl NAME==VERSION` fetches each for
# the machine's Python), installed into /tmp/site. $SHAPE is a SmolLM2-135M-Instruct folder without its weights
# (the folder scripts/prepare_smollm2.py makes, model.safetensors left out): every model here gets random weights of
# a public shape. Everything goes to $OUT (default ./gpu-out).
#   WHEELS=.whl SHAPE=.gpu/smollm2-shape scripts/gpu_check.sh
# Each part has its own time limit (seconds, $DECODE_S, $MEMORY_S and $LONG_S) so that one stuck part leaves the
# others' output. On an H200 the first memory run took 86 s and one TRL run of part 2 about 110 s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
WHEELS=${WHEELS:-.whl}
SHAPE=${SHAPE:-.gpu/smollm2-shape}
DECODE_S=${DECODE_S:-90}
MEMORY_S=${MEMORY_S:-200}
LONG_S=${LONG_S:-220}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 \
    TRL_EXPERIMENTAL_SILENCE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
{
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
    python3 -c "import sys, torch, transformers, accelerate, peft, datasets, pyarrow, pydantic; import trl
print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate',
      accelerate.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__, 'pyarrow',
      pyarrow.__version__, 'trl', trl.__version__)"
} 2>&1 | tee "$OUT/machine.txt"

timeout "$DECODE_S" python3 bench/gpu_decode.py --model "$SHAPE" 2>&1 | tee "$OUT/decode.txt"
timeout "$MEMORY_S" python3 bench/memory_plan.py --device cuda --shape-folder "$SHAPE" --cache /tmp/gpu-models \
    2>&1 | tee "$OUT/memory_plan.txt"
LONG=(python3 bench/long_completions.py --device cuda --model "$SHAPE" --random-weights --trl-python python3
      --pairs 1 --warmup 1 --iterations 1 --prompts 8 --generations 8 --threads 4)
timeout "$LONG_S" "${LONG[@]}" --ours-option padding_free=true --ours-option max_tokens_per_micro_batch=16384 \
    --json "$OUT/long_packed.json" 2>&1 | tee "$OUT/long_packed.txt"
if [ "${LONG_DEFAULTS:-0}" = 1 ]; then
    timeout "$LONG_S" "${LONG[@]}" --json "$OUT/long_defaults.json" 2>&1 | tee "$OUT/long_defaults.txt"
fi
