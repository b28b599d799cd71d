"""`training-wizard RECIPE.toml [key.path=value ...] [--dry-run]` (and `training-wizard grpo --config x.yaml`, TRL's
command form): the only reader of sys.argv."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from training_wizard.errors import USER_ERROR_EXIT_CODE, UserError

# TRL's `trl grpo --config x.yaml` form (training_wizard/trl/commands.py)
TRL_COMMANDS = ("grpo", "rloo", "sft", "reward")

USAGE_EPILOG = """\
examples:
  training-wizard examples/rloo/config.toml
  training-wizard examples/ppo/config.toml
  training-wizard examples/rloo/config.toml training.total_episodes=200 output_dir=runs/try --dry-run
  accelerate launch -m training_wizard examples/rloo/config.toml

Evaluate and look: `training-wizard eval EVAL.toml` (win rate of a model against another, docs/evaluation.md);
`training-wizard plot RUN_DIR [RUN_DIR ...] [-o OUT.png]` (metrics against episodes, runs overlaid).
TRL's command form: `training-wizard grpo|rloo|sft|reward --config x.yaml [--key value ...]` reads TRL's YAML keys and
flags (model_name_or_path, dataset_name, reward_funcs, output_dir, ...; docs/porting_from_trl.md).
`training-wizard vllm-serve --model NAME [--port 8000]` serves the policy with vLLM for vllm_mode = "server"
(docs/vllm.md).
A recipe written for training-wizard 1.0 runs as it is; `training-wizard migrate OLD.toml [-o NEW.toml]`
converts it once to today's shape (docs/migrating.md).

Overrides use the recipe's dotted key paths; values are read as TOML (numbers, booleans, "strings", [lists]).

Exit codes: 0 finished; 2 a recipe/data/reward mistake, a non-finite value or a checkpoint that cannot be
written or loaded (one line on stderr); 143 stopped by SIGTERM, 130 by SIGINT (Ctrl-C), after committing a
checkpoint. Continue any stopped or killed run with resume_from_checkpoint=latest (see RELIABILITY.md).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="training-wizard",
        description="Train a Hugging Face causal LM online with RLOO, PPO or GRPO from one TOML (or JSON) recipe.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", help="path to the recipe file (.toml or .json)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="override a recipe key")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the recipe, print the batch-size table, the memory plan and three rendered prompts, then exit",
    )
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="memory one process may use, e.g. 24GB or 80GiB: the memory plan says whether the run fits it and, if "
        "not, the key to change first (default: the device's memory; on-policy recipes)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["migrate"]:
        return migrate(argv[1:])
    if argv[:1] == ["plot"]:
        return plot(argv[1:])
    if argv[:1] == ["vllm-serve"]:
        from training_wizard.rollout.vllm_server import main as serve

        return serve(argv[1:])
    if argv[:1] == ["eval"]:  # the evaluation recipe, whatever the file's recipe_class says
        argv = [*argv[1:], "recipe_class=evaluate"]
    if argv[:1] and argv[0] in TRL_COMMANDS:
        return trl_command(argv[0], argv[1:])
    args = build_parser().parse_intermixed_args(argv)  # overrides may come before or after --dry-run
    _quiet_libraries()
    from training_wizard.memory_plan import parse_size
    from training_wizard.recipes.base import load_recipe
    from training_wizard.spec import recipe_directory

    try:
        budget = None if args.memory_budget is None else parse_size(args.memory_budget)
        recipe = load_recipe(args.recipe, args.overrides)
        planned = {} if budget is None else {"memory_budget": _on_policy(recipe, budget)}
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE

    def train() -> None:
        with recipe_directory(Path(args.recipe).resolve().parent):
            recipe.main(dry_run=args.dry_run, **planned)

    # Errors found while running name a key or row but not the file: say which recipe they belong to.
    return guarded(train, f"{args.recipe}: ")


def _on_policy(recipe, budget: int) -> int:
    """`budget`, for a recipe that plans its memory (RLOO, PPO, GRPO); else a UserError."""
    from training_wizard.recipes.on_policy import OnPolicyRecipe

    if not isinstance(recipe, OnPolicyRecipe):
        raise UserError(f"--memory-budget: the memory plan covers the on-policy recipes (rloo, ppo, grpo), not "
                        f"{type(recipe).__name__}")
    return budget


def trl_command(command: str, argv: list[str]) -> int:
    """`training-wizard grpo|rloo|sft|reward --config x.yaml [--key value ...]`, as TRL's `trl` command."""
    _quiet_libraries()
    from training_wizard.trl.commands import run_command

    try:
        return guarded(lambda: run_command(command, argv), "")
    except SystemExit as exit_:  # the parser's one line (or --help) is printed already
        return exit_.code if isinstance(exit_.code, int) else USER_ERROR_EXIT_CODE


def guarded(work, where: str) -> int:
    """Run a training `work()`: 0 when it finishes, 2 after one line for a user error, 128 + signal after a stop
    by signal (the work is saved)."""
    from training_wizard.signals import TrainingInterrupted

    try:
        work()
    except UserError as exc:
        print(f"error: {where}{exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except TrainingInterrupted as stop:
        # Not an error: the work is saved. One line on stderr, exit 128 + signal (143 SIGTERM, 130 SIGINT).
        print(f"training-wizard: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        # A second Ctrl-C (the first only asks for a stop at the next safe point): leave now, without a traceback.
        # Checkpoints are committed by a rename, so the newest committed one is whole.
        print("training-wizard: stopped by a second SIGINT (Ctrl-C) before a checkpoint of this point was "
              "committed; run again with resume_from_checkpoint=latest to continue from the newest one",
              file=sys.stderr)
        return 128 + signal.SIGINT
    return 0


def plot(argv: list[str]) -> int:
    """`training-wizard plot RUN_DIR [RUN_DIR ...] [-o OUT.png]`: the metric panel of one or several runs."""
    parser = argparse.ArgumentParser(prog="training-wizard plot", description="Plot runs' metrics against episodes.")
    parser.add_argument("runs", nargs="+", help="output_dir folders holding metrics.jsonl")
    parser.add_argument("-o", "--output", default="metrics.png", help="the PNG to write (default: metrics.png)")
    args = parser.parse_args(argv)
    missing = [run for run in args.runs if not (Path(run) / "metrics.jsonl").is_file()]
    if missing:
        print(f"error: {missing[0]}: no metrics.jsonl (expected a run's output_dir)", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    from training_wizard.tracking.plots import plot_runs

    print(plot_runs([Path(run) for run in args.runs], Path(args.output)))
    return 0


def migrate(argv: list[str]) -> int:
    """`training-wizard migrate OLD.toml [-o NEW.toml]`: a training-wizard 1.0 recipe in today's shape, with a
    comment for every key that was translated or dropped. Without -o the result goes to stdout."""
    parser = argparse.ArgumentParser(prog="training-wizard migrate",
                                     description="Convert a training-wizard 1.0 recipe to today's shape.")
    parser.add_argument("recipe", help="the 1.0 recipe (.toml or .json)")
    parser.add_argument("-o", "--output", help="where to write the new recipe (default: stdout)")
    args = parser.parse_args(argv)
    from training_wizard.legacy import is_legacy_recipe, migrated_text, translate_legacy_recipe
    from training_wizard.spec import add_import_roots, read_recipe_file

    try:
        data = read_recipe_file(Path(args.recipe))
        if not is_legacy_recipe(data):
            raise UserError(f"{args.recipe}: not a training-wizard 1.0 recipe (it has recipe_class, or no "
                            "top-level spec_class)")
        add_import_roots(Path(args.recipe))
        text = migrated_text(translate_legacy_recipe(data, args.recipe), args.recipe)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except OSError as exc:
        print(f"error: {args.output}: cannot write ({exc.strerror})", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    return 0


def _quiet_libraries() -> None:
    """Keep stderr for our own messages: library chatter would bury the one-line error contract."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import logging
    import warnings

    # peft asks transformers 5 for a renamed attribute on every LoRA model: harmless, and not the user's to fix.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars would go to stderr
        import datasets

        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


STOPPED_BY_SIGNAL_EXIT_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT)


def run(argv: list[str] | None = None) -> NoReturn:
    """The process entry point (the `training-wizard` script and `python -m training_wizard`): exit with `main`'s
    code.

    After a stop by signal the checkpoint is committed and every output closed; the process then leaves with
    `os._exit`, skipping the interpreter's teardown. In that teardown a native thread that torch left running
    (torch.compile's workers, the process group's) was seen to abort the process ("terminate called without an
    active exception", SIGABRT), so a scheduler read a crash instead of 143 or 130."""
    code = main(argv)
    if code in STOPPED_BY_SIGNAL_EXIT_CODES:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
