"""The RLOO recipe: `recipe_class = "rloo"` (or "training_wizard.recipes.rloo.RLOORecipe").

Start reading at `RLOORecipe.main`: it builds the tokenizer, data, reward and models from their specs, prints the
batch plan, and hands everything to `RLOOTrainer`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from rich.console import Console
from rich.table import Table

from training_wizard.errors import UserError
from training_wizard.recipes.base import Recipe
from training_wizard.spec import dump_toml, redact_secrets
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.specs.model import TransformerSpec
from training_wizard.specs.reward import RewardSpec
from training_wizard.trainers.config import BatchPlan, RLOORecipeConfig


class RLOORecipe(Recipe):
    """Model, prompt data, reward and training arguments of one RLOO run."""

    model: TransformerSpec = Field(description="The policy to train (hub id, local folder, or packaged model).")
    ref_model: TransformerSpec | None = Field(
        None, description="Reference model for the KL penalty. Default: the policy's starting weights."
    )
    dataset: DataSourceSpec = Field(description="Prompt-only training data.")
    eval_dataset: DataSourceSpec | None = Field(None, description="Prompts for evaluation every eval_steps.")
    reward: RewardSpec = Field(description="Scores each completion.")
    training: RLOORecipeConfig = Field(default_factory=RLOORecipeConfig, description="RLOOConfig options.")
    merge_lora: bool = Field(False, description="Save the final model with the LoRA adapter merged into it.")

    @model_validator(mode="after")
    def _single_source_of_run_keys(self):
        for key in ("output_dir", "seed"):
            if key in self.training.model_fields_set and getattr(self.training, key) != getattr(self, key):
                raise ValueError(f"set {key} at the top level of the recipe, not in [training]")
        return self

    def training_config(self) -> RLOORecipeConfig:
        return self.training.model_copy(update={"output_dir": self.output_dir, "seed": self.seed})

    def main(self, dry_run: bool = False) -> None:
        from accelerate import Accelerator

        config = self.training_config()
        accelerator = Accelerator(gradient_accumulation_steps=config.gradient_accumulation_steps)
        console = Console(quiet=not accelerator.is_main_process)
        tokenizer = self.model.load_tokenizer()
        train_rows = self._load_prompts(self.dataset, "dataset", tokenizer, console)
        plan = config.batch_plan(accelerator.num_processes, len(train_rows))
        console.print(batch_table(plan))
        if dry_run:
            self._show_prompts(train_rows, tokenizer, console)
            return
        eval_rows = self._load_prompts(self.eval_dataset, "eval_dataset", tokenizer, console) if self.eval_dataset else None
        if accelerator.is_main_process:
            self.write_resolved_config()
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        ref_policy = self.ref_model.load_causal_lm(config.dtype) if self.ref_model else None
        from training_wizard.trainers.rloo import RLOOTrainer

        trainer = RLOOTrainer(
            config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref_policy, reward_model=self.reward,
            train_dataset=train_rows, eval_dataset=eval_rows, accelerator=accelerator,
        )
        self._maybe_resume(trainer, console)
        from training_wizard.signals import TrainingInterrupted

        try:
            trainer.train()
        except TrainingInterrupted as stop:
            # Not an error: the work is saved. One line on stderr, exit 128 + signal (143 SIGTERM, 130 SIGINT).
            import sys

            print(f"training-wizard: {stop}", file=sys.stderr)
            raise SystemExit(stop.exit_code) from None
        save_final_model(trainer, Path(self.output_dir) / "model", merge_lora=self.merge_lora)
        console.print(f"final model saved to {Path(self.output_dir) / 'model'}")

    def _load_prompts(self, spec: DataSourceSpec, label: str, tokenizer, console: Console):
        from training_wizard.specs.dataset import filter_long_prompts, validate_prompts

        dataset = spec.load(label)
        validate_prompts(dataset, label)
        if getattr(spec, "filter_length", False):
            dataset, dropped = filter_long_prompts(dataset, tokenizer, self.training.response_length)
            console.print(f"{label}: filter_length dropped {dropped} prompt(s) longer than 0.9 x response_length")
            if len(dataset) == 0:
                raise UserError(f"{label}: filter_length dropped every prompt; raise training.response_length")
        return dataset

    def _show_prompts(self, rows, tokenizer, console: Console) -> None:
        from training_wizard.rollout.prompts import render_prompt

        for index in range(min(3, len(rows))):
            text = tokenizer.decode(render_prompt(tokenizer, rows[index]["prompt"]))
            console.rule(f"prompt {index}")
            console.print(text, markup=False, highlight=False)

    def write_resolved_config(self) -> Path:
        """output_dir/resolved_config.toml: every key with its value in effect, secrets redacted."""
        path = Path(self.output_dir) / "resolved_config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = redact_secrets(self.to_dict())
        data["recipe_class"] = data.pop("spec_class")
        for key in ("output_dir", "seed"):  # top-level keys; [training] must not repeat them
            data["training"].pop(key, None)
        path.write_text(dump_toml(data), encoding="utf-8")
        return path

    def _maybe_resume(self, trainer, console: Console) -> None:
        """Load the checkpoint `resume_from_checkpoint` names and drop log records of iterations that will be
        redone (metrics.jsonl, samples.jsonl), so every iteration is logged exactly once."""
        if not self.resume_from_checkpoint:
            return
        from training_wizard.checkpoint import (
            config_hash,
            load_checkpoint,
            remove_stale_staging,
            truncate_run_logs,
        )

        accelerator = trainer.accelerator
        if accelerator.distributed_type.name in ("DEEPSPEED", "FSDP"):
            raise UserError(
                "resume_from_checkpoint: resuming is not supported yet under DeepSpeed or FSDP (checkpoints hold "
                "the gathered weights but only the main process's optimizer shard); use plain data parallel"
            )
        folder = _resolve_on_main(accelerator, self.output_dir, self.resume_from_checkpoint)
        main_process = accelerator.is_main_process
        if folder is None:
            console.print("resume_from_checkpoint = latest: no checkpoint yet, starting fresh")
            if main_process:
                truncate_run_logs(self.output_dir, 0, 0)
            trainer.accelerator.wait_for_everyone()
            return
        manifest = load_checkpoint(trainer, folder)
        if main_process:
            remove_stale_staging(self.output_dir)
            truncate_run_logs(self.output_dir, trainer.state.iteration, trainer.state.episode)
        trainer.accelerator.wait_for_everyone()
        console.print(f"resumed from {folder} (iteration {trainer.state.iteration}, episode {trainer.state.episode})")
        if manifest.get("config_sha256") not in (None, config_hash(trainer.config)):
            console.print("note: the [training] settings differ from the checkpoint's; continuing with the new ones")
        if manifest.get("world_size") not in (None, trainer.accelerator.num_processes):
            console.print(f"note: the checkpoint was written by {manifest['world_size']} process(es), "
                          f"this run has {trainer.accelerator.num_processes}")


def _resolve_on_main(accelerator, output_dir: str, which: str):
    """The main process picks the checkpoint (verifying hashes once) and tells the others, so every process
    resumes from the same one; they then read it from the same (shared) output_dir."""
    from training_wizard.checkpoint import find_checkpoint

    if accelerator.num_processes == 1:
        return find_checkpoint(output_dir, which)
    from accelerate.utils import broadcast_object_list

    choice: list[tuple[str | None, str | None]] = [(None, None)]  # (folder, error message)
    if accelerator.is_main_process:
        try:
            found = find_checkpoint(output_dir, which)
            choice = [(str(found) if found is not None else None, None)]
        except UserError as exc:
            choice = [(None, str(exc))]
    broadcast_object_list(choice, from_process=0)
    found, error = choice[0]
    if error is not None:
        raise UserError(error)
    folder = Path(found) if found is not None else None
    if folder is not None and not (folder / "manifest.json").is_file():
        raise UserError(f"resume_from_checkpoint: {folder} is not visible from every process (output_dir must be shared)")
    return folder


def batch_table(plan: BatchPlan) -> Table:
    table = Table(title="batch plan (completions unless noted)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, value in plan.rows():
        table.add_row(name, str(value))
    return table


def save_final_model(trainer, folder: Path, merge_lora: bool = False) -> None:
    """Hugging Face folder (safetensors) with the tokenizer; a LoRA policy is merged on request."""
    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    from training_wizard.checkpoint import gathered_state_dict

    state_dict = gathered_state_dict(accelerator, trainer.policy)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.policy)
        if merge_lora and hasattr(model, "merge_and_unload"):
            if state_dict is not None:
                model.load_state_dict(state_dict)
                state_dict = None
            model = model.merge_and_unload()
        model.save_pretrained(folder, state_dict=state_dict, safe_serialization=True)
        trainer.tokenizer.save_pretrained(folder)
    accelerator.wait_for_everyone()
