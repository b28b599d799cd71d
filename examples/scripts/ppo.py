"""TRL-style command line onto the PPO recipe, taking the flags of the PPOv2 docs' command.

    python examples/scripts/ppo.py \
        --dataset_name trl-internal-testing/descriptiveness-sentiment-trl-style --dataset_train_split descriptiveness \
        --learning_rate 3e-6 --num_ppo_epochs 1 --num_mini_batches 1 --per_device_train_batch_size 64 \
        --gradient_accumulation_steps 1 --total_episodes 10000 --model_name_or_path EleutherAI/pythia-1b-deduped \
        --sft_model_path EleutherAI/pythia-1b-deduped --reward_model_path EleutherAI/pythia-1b-deduped \
        --local_rollout_forward_batch_size 16 --non_eos_penalty --stop_token eos --output_dir models/minimal/ppo

The value model starts from the reward model unless --value_model_path names another. Flags and their mapping
are in examples/scripts/trl_style.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a file: trl_style.py sits beside it

from trl_style import main as run  # noqa: E402

from training_wizard.recipes.ppo import PPORecipe  # noqa: E402
from training_wizard.trl.configs import PPOConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run(argv, "ppo", PPORecipe, PPOConfig, __doc__)


if __name__ == "__main__":
    sys.exit(main())
