"""TRL-style command line onto the RLOO recipe, for people coming from `trl/examples/scripts/rloo/rloo.py`.

    python examples/scripts/rloo.py \
        --dataset_name trl-internal-testing/descriptiveness-sentiment-trl-style --dataset_train_split descriptiveness \
        --model_name_or_path EleutherAI/pythia-14m --reward_model_path EleutherAI/pythia-14m \
        --output_dir models/minimal/rloo --per_device_train_batch_size 64 --total_episodes 10000 \
        --learning_rate 3e-6 --missing_eos_penalty 1.0

Every other `--name value` that is an RLOOConfig option (`--rloo_k`, `--kl_coef`, `--num_ppo_epochs`, ...) goes to
`[training]`. `--dataset_name` may also be a local file (json/jsonl/csv/parquet). Models must be local folders,
in the Hugging Face cache, or shipped by a package: nothing is downloaded. `--dry_run` validates and prints the
plan. `--print_recipe` prints the equivalent TOML recipe instead of running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training_wizard.errors import USER_ERROR_EXIT_CODE, UserError
from training_wizard.recipes.rloo import RLOORecipe
from training_wizard.spec import dump_toml
from training_wizard.trainers.config import RLOOConfig

LOCAL_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")


def parse(argv: list[str]) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset_name", required=True)
    parser.add_argument("--dataset_train_split", default="train")
    parser.add_argument("--dataset_test_split", default=None)
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--sft_model_path", default=None, help="policy start point (default: model_name_or_path)")
    parser.add_argument("--reward_model_path", required=True, help="a sequence-classification reward model")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default="runs/rloo")
    parser.add_argument("--dry_run", action="store_true")
    parser.add_argument("--print_recipe", action="store_true")
    args, rest = parser.parse_known_args(argv)
    return args, training_options(rest)


def training_options(rest: list[str]) -> dict:
    """`--name value` pairs for RLOOConfig fields; values are validated by the config itself."""
    known = set(RLOOConfig.model_fields)
    for field in RLOOConfig.model_fields.values():
        choices = getattr(field.validation_alias, "choices", None) or []
        known.update(c for c in choices if isinstance(c, str))
    options, index = {}, 0
    while index < len(rest):
        flag = rest[index]
        name = flag[2:] if flag.startswith("--") else None
        if name is None or name not in known:
            raise UserError(f"unknown argument '{flag}' (expected an RLOOConfig option such as --rloo_k)")
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
    return recipe


def main(argv: list[str] | None = None) -> int:
    try:
        args, training = parse(sys.argv[1:] if argv is None else argv)
        data = build_recipe(args, training)
        if args.print_recipe:
            print(dump_toml({"recipe_class": "rloo", **data}), end="")
            return 0
        RLOORecipe.model_validate(data).main(dry_run=args.dry_run)
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


if __name__ == "__main__":
    sys.exit(main())
