"""The TRL-style command line shared by examples/scripts/rloo.py and examples/scripts/ppo.py.

Every `--name value` that is an option of the trainer's config (`--rloo_k`, `--kl_coef`, `--num_ppo_epochs`,
`--vf_coef`, ...) goes to `[training]`; a flag given without a value (`--non_eos_penalty`) means true.
`--dataset_name` may also be a local file (json/jsonl/csv/parquet). Models must be local folders, in the Hugging
Face cache, or shipped by a package: nothing is downloaded. `--dry_run` validates and prints the plan.
`--print_recipe` prints the equivalent TOML recipe instead of running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training_wizard.errors import USER_ERROR_EXIT_CODE, UserError
from training_wizard.spec import dump_toml

LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")


def parse(argv: list[str], config_class, usage: str) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(description=usage + "\n" + __doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset_name", required=True)
    parser.add_argument("--dataset_train_split", default="train")
    parser.add_argument("--dataset_test_split", default=None)
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--sft_model_path", default=None, help="policy start point (default: model_name_or_path)")
    parser.add_argument("--reward_model_path", required=True, help="a sequence-classification reward model")
    parser.add_argument("--value_model_path", default=None, help="PPO: the value model (default: the reward model)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default="runs/trl-style")
    parser.add_argument("--dry_run", action="store_true")
    parser.add_argument("--print_recipe", action="store_true")
    args, rest = parser.parse_known_args(argv)
    return args, training_options(rest, config_class)


def training_options(rest: list[str], config_class) -> dict:
    """`--name value` pairs for the config's fields; values are validated by the config itself."""
    known = set(config_class.model_fields)
    for field in config_class.model_fields.values():
        choices = getattr(field.validation_alias, "choices", None) or []
        known.update(c for c in choices if isinstance(c, str))
    options, index = {}, 0
    while index < len(rest):
        flag = rest[index]
        name = flag[2:] if flag.startswith("--") else None
        if name is None or name not in known:
            raise UserError(f"unknown argument '{flag}' (expected a {config_class.__name__} option such as --kl_coef)")
        if index + 1 >= len(rest) or rest[index + 1].startswith("--"):
            options[name], index = True, index + 1
        else:
            options[name], index = rest[index + 1], index + 2
    return options


def data_source(name: str, split: str) -> dict:
    if name.endswith(LOCAL_SUFFIXES) or Path(name).exists():
        return {"data_files": name}
    return {"name": name, "split": split}


def build_recipe(args: argparse.Namespace, training: dict) -> dict:
    recipe = {
        "output_dir": args.output_dir,
        "seed": args.seed,
        "model": {"pretrained_name": args.sft_model_path or args.model_name_or_path},
        "dataset": data_source(args.dataset_name, args.dataset_train_split),
        "reward": {
            "spec_class": "training_wizard.specs.reward.ModelRewardSpec",
            "pretrained_name": args.reward_model_path,
        },
        "training": training,
    }
    if args.dataset_test_split:
        recipe["eval_dataset"] = data_source(args.dataset_name, args.dataset_test_split)
    if args.value_model_path:
        recipe["value_model"] = {"pretrained_name": args.value_model_path}
    return recipe


def main(argv: list[str] | None, alias: str, recipe_class, config_class, usage: str) -> int:
    """Parse TRL-style flags, build the recipe for `recipe_class` (named `alias` in TOML) and run it."""
    try:
        args, training = parse(sys.argv[1:] if argv is None else argv, config_class, usage)
        data = build_recipe(args, training)
        if "value_model" in data and "value_model" not in recipe_class.model_fields:
            raise UserError(f"--value_model_path: the {alias} recipe has no value model")
        if args.print_recipe:
            print(dump_toml({"recipe_class": alias, **data}), end="")
            return 0
        recipe_class.model_validate(data).main(dry_run=args.dry_run)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except Exception as exc:  # pydantic ValidationError: same one-line contract as the CLI
        from pydantic import ValidationError

        if not isinstance(exc, ValidationError):
            raise
        from training_wizard.spec import format_validation_error

        print(f"error: {format_validation_error(exc, Path('<command line>'))}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    return 0
