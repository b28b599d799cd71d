"""TRL-style command line onto the RLOO recipe, for people coming from `trl/examples/scripts/rloo/rloo.py`.

    python examples/scripts/rloo.py \
        --dataset_name trl-internal-testing/descriptiveness-sentiment-trl-style --dataset_train_split descriptiveness \
        --model_name_or_path EleutherAI/pythia-14m --reward_model_path EleutherAI/pythia-14m \
        --output_dir models/minimal/rloo --per_device_train_batch_size 64 --total_episodes 10000 \
        --learning_rate 3e-6 --missing_eos_penalty 1.0

Flags and their mapping are in examples/scripts/trl_style.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a file: trl_style.py sits beside it

from trl_style import main as run  # noqa: E402

from training_wizard.recipes.rloo import RLOORecipe  # noqa: E402
from training_wizard.trl.configs import RLOOConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run(argv, "rloo", RLOORecipe, RLOOConfig, __doc__)


if __name__ == "__main__":
    sys.exit(main())
