"""`training-wizard grpo|rloo|sft|reward --config x.yaml [--key value ...]`: TRL's `trl` commands of those names.

They read TRL's YAML keys and flags with TrlParser (ScriptArguments with the scripts' reward options, the config,
ModelConfig) and train as TRL's scripts (trl/scripts/grpo.py, rloo.py) do: the model named by
model_name_or_path with ModelConfig's loading options, the dataset opened by `datasets` from dataset_name (a
local dataset folder, a data file, or a cached Hub name: nothing is downloaded), reward functions by name or
import path. The trained model is saved into output_dir/model, where a recipe's run saves it.

`sft` and `reward` (TRL's trl/scripts/sft.py, reward.py) parse (ScriptArguments, SFTConfig or RewardConfig,
ModelConfig) the same way and run the equivalent recipe (recipe_class "sft" or "reward_model",
built of the parsed arguments), so output_dir's checks, resume and the final save into output_dir/model are the
recipe's. Paths (model, dataset, output_dir) are read from the working folder, as TRL's are. A key the recipe has
no counterpart for is one line naming it (exit code 2), never silently dropped.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from training_wizard.errors import UserError
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.trl.parser import TrlParser
from training_wizard.trl.script_arguments import (
    ModelConfig,
    ScriptArguments,
    get_peft_config,
    get_quantization_config,
)

COMMANDS = ("grpo", "rloo", "sft", "reward")
SUPERVISED = ("sft", "reward")
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


@dataclass
class ResumableScriptArguments(ScriptArguments):
    """ScriptArguments plus where to resume from (TRL reads it off the config, where this library refuses it)."""

    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'latest' or a checkpoint folder of this output_dir to continue from."})


@dataclass
class OnPolicyScriptArguments(ResumableScriptArguments):
    """ResumableScriptArguments plus the reward options of TRL's grpo and rloo scripts."""

    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A sequence-classification reward model (folder or cached Hub id)."})
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "accuracy_reward, reasoning_accuracy_reward, think_format_reward, "
                                        "get_soft_overlong_punishment, or an import path (pkg.module.function)."})


def run_command(command: str, argv: list[str]) -> None:
    """Parse `argv` as the command's flags and train; a mistake is a UserError (or the parser's one line)."""
    if command in SUPERVISED:
        run_supervised(command, argv)
        return
    from training_wizard.trl.configs import GRPOConfig, RLOOConfig
    from training_wizard.trl.trainers import GRPOTrainer, RLOOTrainer

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


# -- sft and reward: the equivalent recipe ------------------------------------------------------------------------
RECIPE_CLASSES = {"sft": "training_wizard.recipes.sft.SFTRecipe",
                  "reward": "training_wizard.recipes.reward_model.RewardModelRecipe"}
# ModelConfig's LoRA options the recipe's [model] lora has no key for, with the value that means "not used".
LORA_WITHOUT_COUNTERPART = {"lora_target_parameters": None, "lora_modules_to_save": None, "use_rslora": False,
                            "use_dora": False}
# peft task types that describe what each command trains anyway (TRL's reward script asks for SEQ_CLS).
LORA_TASK_TYPES = {"sft": ("CAUSAL_LM",), "reward": ("CAUSAL_LM", "SEQ_CLS")}


class SavedDatasetSpec(DataSourceSpec):
    """A dataset folder, opened as TRL's scripts open dataset_name (a save_to_disk folder or a folder of data
    files whose names give the splits), and one split of it."""

    folder: str = Field(description="The dataset folder (absolute).")
    split: str = Field("train", description="The split to read.")

    def load_raw(self, label: str = "dataset"):
        key = "dataset_test_split" if label == "eval_dataset" else "dataset_train_split"
        script_args = ScriptArguments(dataset_name=self.folder, dataset_train_split=self.split)
        return split_of(open_dataset(script_args), self.split, key, script_args)


def run_supervised(command: str, argv: list[str]) -> None:
    """Parse `argv` as TRL's sft or reward script does, then run the equivalent recipe."""
    from training_wizard.trainers.supervised.config import RewardConfig, SFTConfig
    from training_wizard.spec import recipe_directory

    config_class = {"sft": SFTConfig, "reward": RewardConfig}[command]
    parser = TrlParser((ResumableScriptArguments, config_class, ModelConfig), prog=f"training-wizard {command}")
    config_path, _ = parser._take_config_flag(list(argv))
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    recipe = build_recipe(command, script_args, training_args, model_args, config_path)
    with recipe_directory(Path.cwd()):
        recipe.main()


def build_recipe(command: str, script_args: Any, training_args: Any, model_args: ModelConfig,
                 config_path: str | None) -> Any:
    """The recipe TRL's script amounts to, validated as a recipe file is (errors name `config_path`)."""
    from training_wizard.recipes.base import Recipe
    from training_wizard.spec import import_spec_class, load_spec

    label = Path(config_path or f"training-wizard {command}")
    training = training_args.model_dump(exclude_unset=True)
    top = {key: training.pop(key) for key in ("output_dir", "seed", "overwrite_output_dir") if key in training}
    top.setdefault("output_dir", training_args.output_dir)
    data = {**top, "model": model_table(command, model_args),
            "dataset": dataset_table(script_args, script_args.dataset_train_split), "training": training}
    if script_args.resume_from_checkpoint is not None:
        data["resume_from_checkpoint"] = script_args.resume_from_checkpoint
    if training_args.eval_steps is not None:  # TRL evaluates on the test split when evaluation is on
        data["eval_dataset"] = dataset_table(script_args, script_args.dataset_test_split)
    return load_spec(import_spec_class(RECIPE_CLASSES[command], Recipe), label, data=data)


def model_table(command: str, model_args: ModelConfig) -> dict[str, Any]:
    """The recipe's [model] table of ModelConfig (dtype goes to the config, which declares it too)."""
    get_quantization_config(model_args)  # quantized loading: one line
    name = model_args.model_name_or_path
    if not name:
        raise UserError("model_name_or_path: required (a model folder or a cached Hub id)")
    table: dict[str, Any] = {"pretrained_name": local_or_name(name), "trust_remote_code": model_args.trust_remote_code}
    if model_args.model_revision != "main":
        table["revision"] = model_args.model_revision
    if model_args.attn_implementation is not None:
        table["attn_implementation"] = model_args.attn_implementation
    if model_args.use_peft:
        table["lora"] = lora_table(command, model_args)
    return table


def lora_table(command: str, model_args: ModelConfig) -> dict[str, Any]:
    """[model] lora of ModelConfig's lora_* options; one the recipe has no key for is refused, naming it."""
    for key, unused in LORA_WITHOUT_COUNTERPART.items():
        if getattr(model_args, key) != unused:
            raise UserError(f"ModelConfig.{key}: not supported by training-wizard {command} (the recipe's [model] "
                            f"lora has r, alpha, dropout and target_modules); remove it")
    if model_args.lora_task_type not in LORA_TASK_TYPES[command]:
        raise UserError(f"ModelConfig.lora_task_type: training-wizard {command} trains a "
                        f"{' or '.join(LORA_TASK_TYPES[command])} adapter, got {model_args.lora_task_type!r}")
    table: dict[str, Any] = {"r": model_args.lora_r, "alpha": model_args.lora_alpha,
                             "dropout": model_args.lora_dropout}
    if model_args.lora_target_modules is not None:  # unset: the recipe's all-linear
        table["target_modules"] = model_args.lora_target_modules
    return table


def dataset_table(script_args: Any, split: str) -> dict[str, Any]:
    """A data source of dataset_name as TRL's scripts open it: a data file (its rows the split asked for), a
    dataset folder, or a cached Hub name."""
    name = script_args.dataset_name
    if not name:
        raise UserError("dataset_name: required (a dataset folder, a data file, or a cached Hub name)")
    if script_args.dataset_streaming:
        raise UserError("dataset_streaming: not supported by the sft and reward commands (the rows are encoded "
                        "before training); remove it")
    path = Path(name)
    if path.is_file():
        if split != script_args.dataset_train_split:
            raise UserError(f"dataset_test_split: {name} is one data file, its rows the split "
                            f"{script_args.dataset_train_split!r}; there is no {split!r} split to evaluate on")
        return {"data_files": str(path.resolve())}
    if path.is_dir():
        return {"spec_class": f"{__name__}.SavedDatasetSpec", "folder": str(path.resolve()), "split": split}
    table = {"name": name, "split": split}
    if script_args.dataset_config is not None:
        table["subset"] = script_args.dataset_config
    return table


def local_or_name(name: str) -> str:
    """A model folder of the working folder as an absolute path (the recipe reads paths from its own folder)."""
    return str(Path(name).resolve()) if Path(name).exists() else name
