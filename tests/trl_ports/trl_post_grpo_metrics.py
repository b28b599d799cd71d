"""GRPO with a KL term (beta > 0), then the per-step metrics a TRL user plots, read by TRL 1.16's names from
`trainer.state.log_history`: reward, kl, num_tokens, completions/mean_length.

    python trl_post_grpo_metrics.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def reward_x(completions, **kwargs):
    """The share of 'x' in each completion."""
    return [completion.count("x") / max(len(completion), 1) for completion in completions]


if __name__ == "__main__":
    model_name, output_dir = sys.argv[1], sys.argv[2]
    dataset = Dataset.from_list([{"prompt": f"Write x {i} times."} for i in range(2)])
    training_args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                               max_completion_length=8, beta=0.04, logging_steps=1)
    trainer = GRPOTrainer(model=model_name, reward_funcs=reward_x, args=training_args, train_dataset=dataset)
    trainer.train()

    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    steps = [entry["step"] for entry in history]
    rewards = [entry["reward"] for entry in history]
    kls = [entry["kl"] for entry in history]
    tokens = [entry["num_tokens"] for entry in history]
    lengths = [entry["completions/mean_length"] for entry in history]
    for row in zip(steps, rewards, kls, tokens, lengths):
        print("step {} reward {:.3f} kl {:.5f} tokens {:.0f} length {:.2f}".format(*row))
