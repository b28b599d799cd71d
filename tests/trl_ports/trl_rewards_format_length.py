"""GRPO with the kinds of reward function TRL's GRPO documentation shows: a format reward (a regular expression
over the completion), a length reward against a target, and a reward reading a dataset column (`ground_truth`)
that TRL passes by keyword, weighted with `reward_weights`.

    python trl_rewards_format_length.py MODEL_DIR OUTPUT_DIR
"""

import re
import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def format_reward(completions, **kwargs):
    """1.0 for a completion shaped '<think>...</think><answer>...</answer>', else 0.0."""
    pattern = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL)
    return [1.0 if pattern.match(text) else 0.0 for text in completions]


def length_reward(completions, target_length, **kwargs):
    """Minus the distance in characters from the row's target length."""
    return [-abs(target - len(text)) / 10 for text, target in zip(completions, target_length)]


def reference_reward(completions, ground_truth, **kwargs):
    """1.0 when the completion contains the row's reference answer."""
    return [1.0 if truth in text else 0.0 for text, truth in zip(completions, ground_truth)]


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_list([
        {"prompt": "Name a primary colour.", "ground_truth": "red", "target_length": 12},
        {"prompt": "What is 3 times 3?", "ground_truth": "9", "target_length": 6},
    ])
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, num_sample_generations=0, reward_weights=[0.5, 1.0, 2.0])
    trainer = GRPOTrainer(model=model, reward_funcs=[format_reward, length_reward, reference_reward], args=args,
                          train_dataset=dataset)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
