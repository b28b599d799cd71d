"""A run's lifecycle in its output_dir, written once: open (take output_dir as a new run, or resume the run it
holds: run_start.py), train, save the final model (a LoRA adapter merged on request), finish (the caller's
outputs: summary, report, upload); a new run that stops before it trained anything removes the files it wrote.

Every trainer has one (`trainer.lifecycle`), which alone knows whether the run holds output_dir yet. A recipe runs
the whole sequence (`RunLifecycle.run`, from `Recipe.train_and_save`); a trainer used from Python takes the folder
at its first `train(resume_from_checkpoint=...)` (TRL's argument). Every process calls it; the main process
decides. `say` prints one plain line (no markup) on the main process.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable

from training_wizard.checkpoint import save_options
from training_wizard.errors import UserError
from training_wizard.run_folder import (
    RUN_IDENTITY_FILE, claim_new_run, continues_the_run_in, refuse_user_files, run_identity, write_run_identity,
    written_by_a_run,
)
from training_wizard.run_start import resume
from training_wizard.sharding import deepspeed_lookup_skipped, unwrap_model


class RunLifecycle:
    """The run of one trainer (its `config.output_dir`, `collectives`, `accelerator`, `state`, `last_saved_step`,
    `policy`, `tokenizer` and `train()`)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.output_dir_taken = False  # set by `open`; train() takes the folder only once
        self.started_as_a_new_run = False

    @property
    def model_dir(self) -> Path:
        """Where the final model is saved: output_dir/model."""
        return Path(self.trainer.config.output_dir) / "model"

    def run(self, resume_from: str | None, say: Callable[[str], None], merge_lora: bool,
            started: Callable[[], None], finish: Callable[[], None]) -> None:
        """The whole run, as a recipe runs it: `open`; `started()` (the recipe writes resolved_config.toml); train
        (a stop signal leaves as TrainingInterrupted after its checkpoint: the CLI's exit code), undone if it
        stops before training; save the final model into output_dir/model; `finish()` (summary, report, upload)."""
        self.open(resume_from, say)
        started()
        with self.undone_if_it_stops_before_training():
            self.trainer.train()
        save_final_model(self.trainer, self.model_dir, merge_lora=merge_lora)
        finish()

    def open(self, resume_from: str | None, say: Callable[[str], None]) -> None:
        """Take output_dir for this run: resume from `resume_from` ("latest" or a folder) after checking the
        checkpoint was written by the same trainer and model, or, as a new run, refuse a folder holding another
        run's files unless `config.overwrite_output_dir` (then they are deleted). Either way a user's file of a
        run-file name stops it first (it would be written over). Records the run's identity in run.json."""
        trainer = self.trainer
        collectives, config = trainer.collectives, trainer.config
        output_dir, identity = config.output_dir, run_identity(trainer)
        collectives.decide_on_main(lambda: refuse_user_files(output_dir))
        if not continues_the_run_in(output_dir, resume_from):  # a new run here (perhaps from another folder's weights)
            deleted = collectives.decide_on_main(lambda: claim_new_run(output_dir, config.overwrite_output_dir))
            if deleted:
                say(f"overwrite_output_dir: deleted the earlier run's {', '.join(deleted)} in {output_dir}")
        if resume_from:
            resume(trainer, resume_from, identity, say)
        if collectives.is_main:
            write_run_identity(output_dir, identity)
        collectives.barrier()
        self.output_dir_taken = True
        self.started_as_a_new_run = not continues_the_run_in(output_dir, resume_from)

    def take_output_dir(self, resume_from: str | None = None) -> None:
        """At `train(resume_from_checkpoint=...)` from Python: open the run, unless it holds output_dir already (a
        recipe opened it, or an earlier train() did). A trainer that loaded a checkpoint itself
        (checkpoint.load_checkpoint sets `last_saved_step`) continues that run in its folder: nothing to take."""
        if not self.output_dir_taken and self.trainer.last_saved_step is None:
            self.open(resume_from, self.trainer.accelerator.print)

    @contextlib.contextmanager
    def undone_if_it_stops_before_training(self):
        """Around `train()`: a new run that stops with a user error before it finished an iteration or saved a
        checkpoint (a broken environment, reward or server found in the first episodes) removes the run files it
        wrote (run.json, resolved_config.toml, empty logs), so the corrected recipe starts in the same output_dir
        without `resume_from_checkpoint`. The trainer's own counters decide, not the files: with logging_steps > 1
        a trained iteration may not be logged yet. Anything that holds a trained iteration is kept."""
        trainer = self.trainer
        iteration, saved = trainer.state.iteration, trainer.last_saved_step
        try:
            yield
        except UserError:
            trained = trainer.state.iteration != iteration or trainer.last_saved_step != saved
            if self.started_as_a_new_run and trainer.accelerator.is_main_process and not trained:
                _remove_run_files(Path(trainer.config.output_dir))
            raise


def _remove_run_files(output_dir: Path) -> None:
    """Delete the files this run wrote, run.json last: a deletion that fails (an OSError) stops there and leaves
    run.json, so what is left still reads as a run's files (never as a user's), and the run's own error line is
    the one shown."""
    names = sorted(written_by_a_run(output_dir), key=lambda name: name == RUN_IDENTITY_FILE)
    for name in names:
        path = output_dir / name
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError:
            return


def save_final_model(trainer, folder: Path, merge_lora: bool = False) -> None:
    """The trained model in Hugging Face format (safetensors) beside its tokenizer; a LoRA policy is merged on
    request."""
    collectives = trainer.collectives
    collectives.barrier()
    state_dict: dict[str, Any] | None = collectives.full_state_dict(trainer.policy)
    if collectives.is_main:
        model = unwrap_model(trainer.accelerator, trainer.policy)
        if merge_lora and hasattr(model, "merge_and_unload"):
            if state_dict is not None:
                model.load_state_dict(state_dict)
                state_dict = None
            model = model.merge_and_unload()
        with deepspeed_lookup_skipped(trainer.accelerator):  # save_pretrained unwraps through accelerate
            model.save_pretrained(folder, state_dict=state_dict, safe_serialization=True, **save_options(model))
        trainer.tokenizer.save_pretrained(folder)
    collectives.barrier()
