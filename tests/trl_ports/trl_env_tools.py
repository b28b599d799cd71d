"""Tools as plain functions with typed arguments and a Google-style docstring, passed as `tools=` (TRL 1.16's
tools page); the reward reads the conversation, tool calls and results included.

    python trl_env_tools.py MODEL_DIR OUTPUT_DIR
"""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product.
    """
    return a * b


def used_the_tool(completions, **kwargs):
    return [float(any(message["role"] == "tool" for message in completion)) for completion in completions]


def main(model: str, output_dir: str) -> None:
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} times 7?"}]}
                                 for i in range(2, 6)])
    args = GRPOConfig(output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16, max_tool_calling_iterations=2)
    trainer = GRPOTrainer(model=model, reward_funcs=used_the_tool, args=args, train_dataset=dataset,
                          tools=[multiply])
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
