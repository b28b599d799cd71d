"""A multi-task GRPO run in TRL's documented form: each reward function scores only the rows of its own task and
returns None elsewhere; a row of a task no function knows is scored by none of them (TRL warns and goes on).

    python trl_rewards_multitask.py MODEL_DIR OUTPUT_DIR
"""

import re
import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def arithmetic_reward(completions, task, answer, **kwargs):
    """1.0 when the completion contains the expected number, 0.0 when not; None for rows of other tasks."""
    return [None if kind != "arithmetic" else float(expected in re.findall(r"-?\d+", text))
            for text, kind, expected in zip(completions, task, answer)]


def echo_reward(completions, task, answer, **kwargs):
    """The share of the expected word's letters the completion uses; None for rows of other tasks."""
    return [None if kind != "echo" else len(set(expected) & set(text)) / len(set(expected))
            for text, kind, expected in zip(completions, task, answer)]


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_list([
        {"prompt": "What is 2 + 3?", "task": "arithmetic", "answer": "5"},
        {"prompt": "Repeat the word: garden", "task": "echo", "answer": "garden"},
        {"prompt": "Write a haiku about rain.", "task": "poetry", "answer": ""},  # no function scores it
    ])
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=6, num_generations=2,
                      max_completion_length=8, num_sample_generations=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[arithmetic_reward, echo_reward], args=args,
                          train_dataset=dataset)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
