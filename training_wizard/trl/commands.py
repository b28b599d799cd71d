"""`training-wizard grpo|rloo --config x.yaml [--key value ...]`: TRL's `trl grpo` / `trl rloo` commands.

They read TRL's YAML keys and flags with TrlParser (ScriptArguments with the scripts' reward options, the config,
ModelConfig) and train as TRL's scripts (trl/scripts/grpo.py, rloo.py) do: the model named by
model_name_or_path with ModelConfig's loading options, the dataset opened by `datasets` from dataset_name (a
local dataset folder, a data file, or a cached Hub name: nothing is downloaded), reward functions by name or
import path. The trained model is saved into output_dir/model, where a recipe's run saves it.

`sft` and `reward` are refused in one line: SFTTrainer and RewardModelTrainer do not take TRL's constructor form,
and a recipe (recipe_class "sft" or "reward_model") runs them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.trl.parser import TrlParser
from training_wizard.trl.script_arguments import (
    ModelConfig,
    ScriptArguments,
    get_peft_config,
    get_quantization_config,
)

COMMANDS = ("grpo", "rloo", "sft", "reward")
SUPERVISED = {"sft": "sft", "reward": "reward_model"}
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


@dataclass
class OnPolicyScriptArguments(ScriptArguments):
    """ScriptArguments plus the reward options of TRL's grpo and rloo scripts, and where to resume from."""

    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A sequence-classification reward model (folder or cached Hub id)."})
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "accuracy_reward, reasoning_accuracy_reward, think_format_reward, "
                                        "get_soft_overlong_punishment, or an import path (pkg.module.function)."})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'latest' or a checkpoint folder of this output_dir to continue from."})


def run_command(command: str, argv: list[str]) -> None:
    """Parse `argv` as the command's flags and train; a mistake is a UserError (or the parser's one line)."""
    if command in SUPERVISED:
        raise UserError(f"training-wizard {command} --config: not supported (this library's {command.upper()} "
                        f"trainer does not take TRL's arguments); write a recipe with recipe_class = "
                        f"\"{SUPERVISED[command]}\" and run training-wizard recipe.toml (docs/configuration.md)")
    from training_wizard import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    trainer_class, config_class = {"grpo": (GRPOTrainer, GRPOConfig), "rloo": (RLOOTrainer, RLOOConfig)}[command]
    parser = TrlParser((OnPolicyScriptArguments, config_class, ModelConfig), prog=f"training-wizard {command}")
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    train(trainer_class, script_args, training_args, model_args)


def train(trainer_class: type, script_args: OnPolicyScriptArguments, training_args: Any,
          model_args: ModelConfig) -> None:
    """What TRL's grpo and rloo scripts do with their parsed arguments."""
    if not model_args.model_name_or_path:
        raise UserError("model_name_or_path: required (a model folder or a cached Hub id)")
    training_args.model_init_kwargs = {**model_loading(model_args), **(training_args.model_init_kwargs or {})}
    reward_funcs = reward_functions(script_args)
    dataset = open_dataset(script_args)
    evaluated = training_args.eval_steps is not None
    trainer = trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs or None,
        args=training_args,
        train_dataset=split_of(dataset, script_args.dataset_train_split, "dataset_train_split", script_args),
        eval_dataset=split_of(dataset, script_args.dataset_test_split, "dataset_test_split", script_args)
        if evaluated else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=script_args.resume_from_checkpoint)
    trainer.save_model(str(Path(training_args.output_dir) / "model"))
    print(f"model saved to {Path(training_args.output_dir) / 'model'}")


def model_loading(model_args: ModelConfig) -> dict[str, Any]:
    """ModelConfig's loading options as model_init_kwargs (those left at their defaults left out)."""
    kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation,
              "trust_remote_code": model_args.trust_remote_code or None,
              "revision": None if model_args.model_revision == "main" else model_args.model_revision}
    return {key: value for key, value in kwargs.items() if value is not None}


def reward_functions(script_args: OnPolicyScriptArguments) -> list[Any]:
    """The reward model (first) and functions the script arguments name, as TRL's scripts read them."""
    from training_wizard import rewards
    from training_wizard.spec import import_object

    named = {"accuracy_reward": lambda: rewards.accuracy_reward,
             "reasoning_accuracy_reward": lambda: rewards.reasoning_accuracy_reward,
             "think_format_reward": lambda: rewards.think_format_reward,
             "get_soft_overlong_punishment": lambda: rewards.get_soft_overlong_punishment(
                 max_completion_len=1280, soft_punish_cache=256)}  # TRL's scripts use these values
    functions: list[Any] = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    for name in script_args.reward_funcs or []:
        if name in named:
            functions.append(named[name]())
            continue
        if "." not in name and ":" not in name:
            raise UserError(f"reward_funcs: {name!r} is neither one of {', '.join(named)} nor an import path "
                            "(pkg.module.function)")
        if os.getcwd() not in sys.path:  # TRL's scripts import reward modules from the working folder
            sys.path.insert(0, os.getcwd())
        try:
            function = import_object(name)
        except (ImportError, AttributeError) as exc:
            raise UserError(f"reward_funcs: cannot import {name!r} ({exc})") from None
        if not callable(function):
            raise UserError(f"reward_funcs: {name!r} is a {type(function).__name__}, not a function")
        functions.append(function)
    return functions


def open_dataset(script_args: ScriptArguments) -> Any:
    """dataset_name opened as TRL's scripts open it (datasets.load_dataset), plus a folder written by
    save_to_disk and a single data file (its rows the train split)."""
    import datasets

    name = script_args.dataset_name
    if not name:
        raise UserError("dataset_name: required (a dataset folder, a data file, or a cached Hub name)")
    path = Path(name)
    try:
        if path.is_dir() and any((path / marker).exists() for marker in ("dataset_dict.json", "state.json")):
            loaded = datasets.load_from_disk(str(path))
            return loaded if isinstance(loaded, datasets.DatasetDict) else {script_args.dataset_train_split: loaded}
        if path.is_file():
            builder = DATA_FILE_BUILDERS.get(path.suffix)
            if builder is None:
                raise UserError(f"dataset_name: {name}: a data file must be one of {', '.join(DATA_FILE_BUILDERS)}")
            return datasets.load_dataset(builder, data_files={script_args.dataset_train_split: str(path)})
        return datasets.load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    except (OSError, ValueError) as exc:  # datasets' not-found, offline and format errors
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"dataset_name: cannot open {name!r} as a dataset folder, data file or cached Hub "
                        f"dataset ({reason})") from None


def split_of(dataset: Any, split: str, key: str, script_args: ScriptArguments) -> Any:
    if split not in dataset:
        raise UserError(f"{key}: {split!r} is not a split of {script_args.dataset_name} (it has "
                        f"{', '.join(map(str, dataset)) or 'none'})")
    return dataset[split]
