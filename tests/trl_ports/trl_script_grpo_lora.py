"""A GRPO script training a LoRA adapter as TRL's example scripts set one up: the model's loading options and
the adapter come from ModelConfig through get_quantization_config, get_kbit_device_map and get_peft_config.

    python trl_script_grpo_lora.py --model_name_or_path MODEL --dataset_name DATA --output_dir OUT --use_peft ...
"""

import torch
from datasets import load_dataset

from training_wizard import (
    GRPOConfig,
    GRPOTrainer,
    ModelConfig,
    ScriptArguments,
    TrlParser,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
)


def reward_letters(completions, **kwargs):
    """The number of distinct letters in each completion, over 10."""
    return [len({c for c in completion if c.isalpha()}) / 10 for completion in completions]


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()

    dtype = model_args.dtype if model_args.dtype in ["auto", None] else getattr(torch, model_args.dtype)
    quantization_config = get_quantization_config(model_args)
    training_args.model_init_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=dtype,
        device_map=get_kbit_device_map() if quantization_config is not None else None,
        quantization_config=quantization_config,
    )

    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=[reward_letters],
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
