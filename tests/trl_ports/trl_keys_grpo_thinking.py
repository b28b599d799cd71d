"""A GRPO config snippet from TRL's documentation with chat_template_kwargs, here read by the trainer that
renders conversational prompts. Run as `python trl_keys_grpo_thinking.py MODEL OUTPUT_DIR`."""

import sys

from datasets import Dataset

from training_wizard import GRPOConfig, GRPOTrainer


def brevity(completions, **kwargs):
    return [-float(len(completion[0]["content"])) for completion in completions]


dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Name a {thing}."}]}
                             for thing in ("color", "fruit")])
training_args = GRPOConfig(output_dir=sys.argv[2], chat_template_kwargs={"enable_thinking": False},
                           num_generations=2, per_device_train_batch_size=2, max_completion_length=6,
                           num_train_epochs=1, log_completions=False)
trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=brevity, args=training_args, train_dataset=dataset)
trainer.train()
