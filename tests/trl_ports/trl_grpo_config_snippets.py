"""The GRPOConfig settings TRL's GRPO documentation and paper index give for each variant (Dr. GRPO, DAPO, GSPO,
BNPO, CISPO, batch-scaled rewards, several passes over a generation, high-entropy tokens only), each trained for two
optimizer steps on the same rows with only the import line changed.

    python trl_grpo_config_snippets.py MODEL_DIR OUTPUT_DIR
"""

import sys
from pathlib import Path

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer

VARIANTS = {
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none"),  # "Understanding R1-Zero-Like Training"
    "dapo": dict(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True, beta=0.0),  # DAPO
    "gspo": dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.0, epsilon=3e-4, epsilon_high=4e-4,
                 gradient_accumulation_steps=1, steps_per_generation=4),  # GSPO, section 5.1
    "bnpo": dict(loss_type="bnpo"),
    "cispo": dict(loss_type="cispo", epsilon_high=5.0),  # MiniMax-M1
    "batch_scaled": dict(scale_rewards="batch"),  # "Tricks or Traps?" (Lite PPO)
    "two_passes": dict(num_iterations=2),  # GRPO's mu
    "high_entropy_tokens": dict(top_entropy_quantile=0.2),  # "Beyond the 80/20 Rule"
}


def distinct_letters(completions, **kwargs):
    return [len(set(text)) / 10 for text in completions]


def main(model: str, output_dir: str) -> dict:
    dataset = Dataset.from_list([{"prompt": "Write a word."}, {"prompt": "Write a name."}])
    trainers = {}
    for name, settings in VARIANTS.items():
        settings = {"per_device_train_batch_size": 4, **settings}
        args = GRPOConfig(output_dir=str(Path(output_dir) / name), max_steps=2, num_generations=4,
                          max_completion_length=8, num_sample_generations=0, **settings)
        trainers[name] = GRPOTrainer(model=model, reward_funcs=distinct_letters, args=args, train_dataset=dataset)
        trainers[name].train()
    return trainers


if __name__ == "__main__":
    TRAINERS = main(*sys.argv[1:3])
