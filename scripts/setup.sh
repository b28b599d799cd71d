#!/usr/bin/env bash
# Creates .venv and installs the pinned dependency set and training-wizard itself (editable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and alone, so nothing later resolves a different (CUDA) build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -r requirements.txt
# reasoning-gym and OpenEnv (training_wizard/envs/): optional for users, installed and tested here.
.venv/bin/python -m pip install -q -r requirements-envs.txt
.venv/bin/python -m pip install -q --no-build-isolation -r requirements-deepspeed.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv/bin/python -m pip install -q --no-deps -e .
.venv/bin/python -c "import torch; assert '+cu' not in torch.__version__ and not torch.version.cuda, 'a CUDA torch was installed'"
