#!/usr/bin/env bash
# Creates .venv-trl-bench: TRL 1.16.0 with the same torch, transformers, accelerate, datasets and peft pins as
# requirements.txt, for bench/episodes_vs_trl.py's TRL side. training-wizard is not installed here: the bench runs
# TRL's worker in this environment and ours in .venv, as two processes of one driver. The offline SmolLM2 weights
# are the tools example's SFT stage (training-wizard examples/tools/sft.toml, run in .venv), a folder both sides
# load. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-trl-bench
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first and alone, so nothing later resolves a different (CUDA) build.
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q torch==2.13.0 trl==1.16.0 transformers==5.23.0 accelerate==1.15.0 \
    datasets==5.2.0 peft==0.21.2 safetensors==0.8.0 tokenizers==0.23.3 jinja2
"$VENV/bin/python" -c "import torch; assert '+cu' not in torch.__version__ and not torch.version.cuda, 'a CUDA torch was installed'"
"$VENV/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
