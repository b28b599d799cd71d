"""The recipe base class and `load_recipe`, which picks the recipe class a file names in `recipe_class`."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from training_wizard.errors import UserError
from training_wizard.legacy import is_legacy_recipe, translate_legacy_recipe
from training_wizard.spec import Spec, add_import_roots, import_spec_class, load_spec, read_recipe_file
from training_wizard.trainers.config.run import (
    DEFAULT_SEED, OUTPUT_DIR_DESCRIPTION, OVERWRITE_OUTPUT_DIR_DESCRIPTION, SEED_DESCRIPTION, SEED_RANGE,
)

RECIPE_ALIASES = {
    "rloo": "training_wizard.recipes.rloo.RLOORecipe",
    "ppo": "training_wizard.recipes.ppo.PPORecipe",
    "grpo": "training_wizard.recipes.grpo.GRPORecipe",
    "distill": "training_wizard.recipes.distill.DistillRecipe",
    "sft": "training_wizard.recipes.sft.SFTRecipe",
    "reward_model": "training_wizard.recipes.reward_model.RewardModelRecipe",
    "sequence_classification": "training_wizard.recipes.classification.SequenceClassificationRecipe",
    "evaluate": "training_wizard.recipes.evaluate.EvaluateRecipe",
}


class Recipe(Spec):
    """Top-level keys shared by every recipe."""

    output_dir: str = Field(description=OUTPUT_DIR_DESCRIPTION)
    seed: int = Field(DEFAULT_SEED, description=SEED_DESCRIPTION, **SEED_RANGE)
    resume_from_checkpoint: str | None = Field(
        None, description='"latest" (start fresh if there is none yet) or a checkpoint folder to resume from. The '
        "checkpoint must have been written by the same recipe class and model (checked before anything is written)."
    )
    overwrite_output_dir: bool = Field(False, description=OVERWRITE_OUTPUT_DIR_DESCRIPTION)

    @model_validator(mode="after")
    def _run_keys_at_the_top_level(self):
        training = getattr(self, "training", None)
        for key in ("output_dir", "seed", "overwrite_output_dir"):
            if training is not None and key in training.model_fields_set:
                raise ValueError(f"set {key} at the top level of the recipe, not in [training]")
        return self

    def training_config(self):
        """The [training] table with the run's output_dir and seed (set at the top level) filled in."""
        return self.training.model_copy(update={"output_dir": self.output_dir, "seed": self.seed,
                                                "overwrite_output_dir": self.overwrite_output_dir})

    def main(self, dry_run: bool = False, memory_budget: int | None = None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------------------ the run lifecycle, written once
    # A training recipe's main(): open_run -> (load, plan; stop on --dry-run) -> prepare_output -> build the
    # trainer -> train_and_save (the trainer's RunLifecycle, lifecycle.py: take output_dir or resume, write
    # resolved_config.toml; train; save; finish). Used by the on-policy recipes (recipes/on_policy.py) and the
    # supervised ones (recipes/sft.py, recipes/reward_model.py).

    def open_run(self, config):
        """Seed everything, make the Accelerator (`config`'s accumulation, mixed precision and device) and check
        the launch came up as asked; (accelerator, console)."""
        from accelerate.utils import set_seed
        from rich.console import Console

        from training_wizard.sharding import wait_for_each_zero3_gather
        from training_wizard.trainers.loop.step import make_accelerator

        # Before anything draws from the global generators (a LoRA adapter's initial weights do): without it
        # torch starts each process from a random seed and two runs of one recipe differ.
        set_seed(self.seed)
        try:
            accelerator = make_accelerator(config)
        except ImportError as exc:  # the launch asks for an engine that is not installed (e.g. DeepSpeed)
            raise UserError(f"accelerate config: {str(exc).splitlines()[0]}") from None
        check_launch(accelerator)
        wait_for_each_zero3_gather(accelerator)  # before a model loads: ZeRO-3 partitions it as it loads
        return accelerator, Console(quiet=not accelerator.is_main_process)

    def check_can_start(self, config, accelerator, console) -> None:  # noqa: ARG002 - subclasses use them
        """What a run checks before it loads any model, and `--dry-run` with it (the same call, so a dry run that
        passes does not leave a real run to fail at start), writing nothing: output_dir can be a folder this
        process writes, holds none of the recipe's data files and no user's file a run would write over; the
        trackers report_to names are installed."""
        from training_wizard.run_folder import refuse_user_files
        from training_wizard.tracking.metrics import check_trackers_installed

        check_output_dir_usable(self.output_dir)
        check_data_outside(self, self.output_dir)
        refuse_user_files(self.output_dir)
        check_trackers_installed(config.report_to)
        check_hub_reachable(config)
        self.check_output_dir_can_be_taken(accelerator)

    def check_output_dir_can_be_taken(self, accelerator) -> None:
        """What the lifecycle's `open` (lifecycle.py) checks before it takes output_dir, read-only: a new run without
        overwrite_output_dir finds no other run's files there; a resume finds a checkpoint that verifies (hashed on
        the main process, which `open` does not repeat), or with "latest" and none yet, no finished run's files.
        Whether the checkpoint's trainer and model are this run's needs the built trainer: `open` checks that before
        it loads anything."""
        from training_wizard.checkpoint import find_checkpoint
        from training_wizard.run_folder import continues_the_run_in, refuse_finished_run, refuse_used_folder

        resume = self.resume_from_checkpoint
        if not continues_the_run_in(self.output_dir, resume) and not self.overwrite_output_dir:
            refuse_used_folder(self.output_dir)
        if resume and accelerator.is_main_process and find_checkpoint(self.output_dir, resume) is None:
            refuse_finished_run(self.output_dir)

    def prepare_output(self, accelerator) -> None:
        """Before any model loads (main process): output_dir is writable, and a new run does not find another run's
        files there (unless overwrite_output_dir: the lifecycle's `open` deletes them). Nothing is written there
        yet."""
        if accelerator.is_main_process:
            check_writable(self.output_dir)
            from training_wizard.run_folder import continues_the_run_in, refuse_used_folder

            new_run = not continues_the_run_in(self.output_dir, self.resume_from_checkpoint)
            if new_run and not self.overwrite_output_dir:
                refuse_used_folder(self.output_dir)

    def train_and_save(self, trainer, console, merge_lora: bool = False) -> None:
        """The run's lifecycle (lifecycle.py): take output_dir and resume if asked (run_start.py), then write
        resolved_config.toml; train (a stop signal leaves as TrainingInterrupted, the CLI's exit code); save the
        final model into output_dir/model; then this recipe's outputs (`finish`)."""

        def say(line: str) -> None:  # plain text: "[training]" in a note is not rich markup
            console.print(line, markup=False, highlight=False, soft_wrap=True)

        def write_resolved_config() -> None:
            if trainer.accelerator.is_main_process:
                self.write_resolved_config()

        # trainer.config carries overwrite_output_dir
        trainer.lifecycle.run(self.resume_from_checkpoint, say, merge_lora, started=write_resolved_config,
                              finish=lambda: self.finish(trainer, console))

    def finish(self, trainer, console) -> None:
        """After the final save: the plots and report (main process), and the upload with push_to_hub."""
        console.print(f"final model saved to {Path(self.output_dir) / 'model'}")
        if trainer.accelerator.is_main_process:
            from training_wizard.tracking.report import write_run_outputs

            report = write_run_outputs(self.output_dir)
            console.print(f"plots and report: {report}")
            self.push_final_model(trainer.config, console)

    def push_final_model(self, config, console) -> None:
        """With push_to_hub (main process, after the final save and its model card): upload output_dir/model to
        hub_model_id. A failed upload is one line (exit 2); the saved model stays."""
        if not getattr(config, "push_to_hub", False):
            return
        from training_wizard.trainers.config import hub

        folder = Path(self.output_dir) / "model"
        repo, _ = hub.upload_to_hub(folder, hub.hub_repository(config), "training.push_to_hub",
                                    commit_message="End of training")
        console.print(f"final model pushed to the Hub: https://huggingface.co/{repo}", markup=False,
                      highlight=False, soft_wrap=True)

    def write_resolved_config(self) -> Path:
        """output_dir/resolved_config.toml: every key with its value in effect, secrets redacted."""
        from training_wizard.spec import dump_toml, redact_secrets

        path = Path(self.output_dir) / "resolved_config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = redact_secrets(self.to_dict())
        data["recipe_class"] = data.pop("spec_class")
        for key in ("output_dir", "seed", "overwrite_output_dir"):  # top-level keys; [training] must not repeat them
            if isinstance(data.get("training"), dict):
                data["training"].pop(key, None)
        path.write_text(dump_toml(data), encoding="utf-8")
        return path


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load a recipe file, apply `key.path=value` overrides, and validate it as the class `recipe_class` names."""
    path = Path(path)
    data = read_recipe_file(path)
    if is_legacy_recipe(data):  # written for training-wizard 1.0: read through the translation (docs/migrating.md)
        add_import_roots(path)  # its reward classes live next to it
        translation = translate_legacy_recipe(data, path)
        for warning in translation.warnings:
            print(f"warning: {path}: {warning}", file=sys.stderr)
        data = translation.recipe
    for text in overrides or []:
        if text.split("=", 1)[0].strip() == "recipe_class":
            data["recipe_class"] = text.split("=", 1)[1].strip().strip("\"'")
    recipe_class = _recipe_class(data.pop("recipe_class", None), path)
    overrides = [o for o in overrides or [] if o.split("=", 1)[0].strip() != "recipe_class"]
    return load_spec(recipe_class, path, overrides, data=data)


def _recipe_class(name: Any, path: Path) -> type[Recipe]:
    if name is None:
        raise UserError(f"{path}: recipe_class: required key is missing (expected 'rloo', 'ppo', 'sft', "
                        "'reward_model', 'sequence_classification' or 'pkg.mod.Class')")
    if not isinstance(name, str):
        raise UserError(f"{path}: recipe_class: expected a string such as 'rloo', got {type(name).__name__}")
    add_import_roots(path)
    try:
        return import_spec_class(RECIPE_ALIASES.get(name, name), Recipe)
    except ValueError as exc:
        raise UserError(f"{path}: recipe_class: {exc}") from None


def check_launch(accelerator, environ=None) -> None:
    """Refuse the silent fallbacks of a launch that did not come up as asked: accelerate turns an FSDP or
    DeepSpeed config into plain data parallel where it cannot shard (a CPU), and processes launched together can
    each come up alone (then they all write into one output_dir)."""
    import os

    environ = os.environ if environ is None else environ
    kind = accelerator.distributed_type.name
    for variable, engine, name in (("ACCELERATE_USE_FSDP", "FSDP", "FSDP"),
                                   ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED", "DeepSpeed")):
        if environ.get(variable, "").lower() in ("1", "true") and kind != engine:
            raise UserError(f"accelerate config: it asks for {name} but this run came up as {kind} (not sharded; "
                            "on CPU processes accelerate falls back silently); fix the launch or drop the option")
    launched = int(environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and accelerator.num_processes != launched:
        raise UserError(f"launch: the environment says {launched} processes (WORLD_SIZE) but this process sees "
                        f"{accelerator.num_processes}; each would train alone into the same output_dir")


def check_hub_reachable(config) -> None:
    """With push_to_hub, the end of the run uploads the final model: refuse at start (no model loaded, nothing
    written) a run whose upload could not happen, rather than finding out after training."""
    if not getattr(config, "push_to_hub", False):
        return
    from training_wizard.trainers.config.hub import hub_unavailable

    reason = hub_unavailable(None)
    if reason is not None:
        raise UserError(f"training.push_to_hub: {reason}, so the final model could not be uploaded; fix that, or "
                        "set push_to_hub = false and upload output_dir/model later (hf upload)")


def check_writable(output_dir: str) -> None:
    """Create output_dir and write a probe file there, so an unusable folder is one line before any model loads."""
    folder = Path(output_dir)
    probe = folder / f".write-check-{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"output_dir: cannot create or write '{output_dir}' ({reason}); choose a writable folder") from None


def check_output_dir_usable(output_dir: str) -> None:
    """Without writing anything (a dry run writes nothing): output_dir is not a file, and its nearest existing
    folder is one this process may write into."""
    folder = existing = Path(output_dir)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        reason = "it is a file" if existing == folder else f"'{existing}' is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = f"permission denied on '{existing}'"
    else:
        return
    raise UserError(f"output_dir: cannot create or write '{output_dir}' ({reason}); choose a writable folder")


def check_data_outside(recipe: BaseModel, output_dir: str) -> None:
    """A run writes and deletes files in output_dir (prompts.jsonl is also the usual name of a prompt dataset):
    refuse a recipe whose data files (any `data_files` of its specs, at any depth) lie inside it."""
    root = Path(output_dir).resolve()
    for key, spec in _data_specs(recipe, ""):
        for path in _data_paths(spec, key):
            if path.resolve().is_relative_to(root):
                raise UserError(f"{key}: '{path}' is inside output_dir '{output_dir}', where a run writes, "
                                "overwrites and deletes its own files; choose an output_dir outside the data's folder")


def _data_specs(value: Any, key: str):
    """(dotted key of data_files, spec) for every spec under `value` that names local data files."""
    if isinstance(value, BaseModel):
        if isinstance(getattr(value, "data_files", None), (str, list)):
            yield f"{key}.data_files" if key else "data_files", value
        for name in type(value).model_fields:
            yield from _data_specs(getattr(value, name, None), f"{key}.{name}" if key else name)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _data_specs(item, f"{key}.{index}")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _data_specs(item, f"{key}.{name}")


def _data_paths(spec: BaseModel, key: str) -> list[Path]:
    """The files `spec.data_files` names, resolved as its load resolves them (globs expanded); a name that
    matches nothing yet is kept as written (its load reports it)."""
    from training_wizard.spec import current_recipe_directory, recipe_directory, resolve_path
    from training_wizard.specs.data_files import expand_data_files

    patterns = [spec.data_files] if isinstance(spec.data_files, str) else list(spec.data_files)
    with recipe_directory(getattr(spec, "_base_dir", None) or current_recipe_directory()):
        try:
            return [Path(path) for path in expand_data_files(patterns, key)]
        except UserError:
            return [resolve_path(pattern) for pattern in patterns]
