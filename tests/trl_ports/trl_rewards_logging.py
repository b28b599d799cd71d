"""A GRPO reward that adds a column to the logged completions table (`log_extra`) and a scalar metric
(`log_metric`), the two callables TRL 1.16 passes every reward function.

    python trl_rewards_logging.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def vowel_share_reward(completions, log_extra=None, log_metric=None, **kwargs):
    """The share of vowels in each completion; logs each completion's vowel count and the batch's mean share."""
    counts = [sum(letter in "aeiou" for letter in text.lower()) for text in completions]
    shares = [count / max(len(text), 1) for count, text in zip(counts, completions)]
    if log_extra is not None:
        log_extra("vowels", counts)
    if log_metric is not None:
        log_metric("vowel_share", sum(shares) / len(shares))
    return shares


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_list([{"prompt": f"Say something about the number {i}."} for i in range(4)])
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, log_completions=True)
    trainer = GRPOTrainer(model=model, reward_funcs=vowel_share_reward, args=args, train_dataset=dataset)
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
