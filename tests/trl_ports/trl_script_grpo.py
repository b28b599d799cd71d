"""A GRPO training script in the shape of TRL's own (trl/scripts/grpo.py): TrlParser reads ScriptArguments,
GRPOConfig and ModelConfig from `--config x.yaml` and flags, the dataset comes from `load_dataset`.

    python trl_script_grpo.py --config grpo.yaml [--max_steps 2 ...]
"""

from datasets import load_dataset

from training_wizard import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser


def reward_brevity(completions, **kwargs):
    """Shorter completions score higher: minus the distance of each length from 10 characters."""
    return [-abs(10 - len(completion)) / 10 for completion in completions]


def main(script_args, training_args, model_args):
    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_brevity,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    main(script_args, training_args, model_args)
