"""An agent-style GRPO script in the form of TRL's tools documentation: a tool the model may call, Qwen3's
thinking turned off through chat_template_kwargs, and a few completions printed. Run as
`python trl_keys_grpo_agent.py MODEL OUTPUT_DIR`."""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of a and b.
    """
    return a * b


def correct_product(completions, answer, **kwargs):
    """1.0 where the last message names the expected product."""
    return [float(str(gold) in completion[-1]["content"]) for completion, gold in zip(completions, answer)]


dataset = Dataset.from_list([
    {"prompt": [{"role": "user", "content": f"What is {a} times {b}? Use the tool."}], "answer": a * b}
    for a, b in [(3, 4), (6, 7)]
])

training_args = GRPOConfig(
    output_dir=sys.argv[2],
    chat_template_kwargs={"enable_thinking": False},
    log_completions=True,
    num_completions_to_print=2,
    max_completion_length=8,
    num_generations=2,
    per_device_train_batch_size=2,
    max_tool_calling_iterations=1,
    max_steps=2,
)
trainer = GRPOTrainer(
    model=sys.argv[1],
    reward_funcs=correct_product,
    args=training_args,
    train_dataset=dataset,
    tools=[multiply],
)
trainer.train()
