"""An RLOO training script in the shape of TRL's (trl/scripts/rloo.py), read from command-line flags alone.

    python trl_script_rloo.py --model_name_or_path MODEL --dataset_name DATA --output_dir OUT --max_steps 2 ...
"""

from datasets import load_dataset

from training_wizard import ModelConfig, RLOOConfig, RLOOTrainer, ScriptArguments, TrlParser, get_peft_config


def reward_vowels(completions, **kwargs):
    """The share of vowels in each completion."""
    return [sum(c in "aeiou" for c in completion.lower()) / max(len(completion), 1) for completion in completions]


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, RLOOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()

    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    trainer = RLOOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_vowels,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
