"""The shape of TRL's examples/scripts/rloo.py: the model loaded with model_init_kwargs naming a torch dtype, TRL's
default epochs deciding the length of the run. Run as `python trl_keys_rloo_dtype.py MODEL OUTPUT_DIR`."""

import sys

import torch
from datasets import Dataset

from training_wizard import RLOOConfig, RLOOTrainer


def reward_len(completions, **kwargs):
    """Prefers completions near 20 characters."""
    return [-abs(20 - len(completion)) / 20.0 for completion in completions]


dataset = Dataset.from_list([{"prompt": f"The {word} is"} for word in ("sky", "sea")])

training_args = RLOOConfig(
    output_dir=sys.argv[2],
    model_init_kwargs={"dtype": torch.float32},
    num_generations=2,
    per_device_train_batch_size=2,
    max_completion_length=6,
    log_completions=False,
)
trainer = RLOOTrainer(model=sys.argv[1], reward_funcs=reward_len, args=training_args, train_dataset=dataset)
trainer.train()
