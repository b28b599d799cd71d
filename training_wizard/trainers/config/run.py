"""The options every trainer shares (RunConfig): the run's folder and seed, AdamW, logging, checkpoints.

The on-policy configs (trainers/config/on_policy.py) and the supervised ones (trainers/supervised/config.py) extend it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from training_wizard.spec import Spec


def aliases(*names: str) -> AliasChoices:
    """The names a field accepts on input: its own, then the TRL spellings of it."""
    return AliasChoices(*names)


# The run's folder and seed are defined here once; a recipe sets them at its top level (recipes/base.py reads
# these descriptions), and its [training] table refuses them.
OUTPUT_DIR_DESCRIPTION = "Folder for metrics, samples, checkpoints and the final model."
SEED_DESCRIPTION = "Seed of every random choice: data order, sampling, initialisation. A run is reproducible."
OVERWRITE_OUTPUT_DIR_DESCRIPTION = (
    "A new run into an output_dir that holds another run's files (metrics, checkpoints, model, ...) deletes those "
    "files first; without it the run stops with one line. Only files a run wrote are deleted (run.json lists them, "
    "or their content shows it); a user's file of a run-file name (a prompt dataset named prompts.jsonl) stops "
    "the run in one line instead, and other files are never touched."
)
DEFAULT_SEED = 42
SEED_RANGE = {"ge": 0, "le": 2**32 - 1}  # what numpy's and torch's seeding accept


class RunConfig(Spec):
    """Options every trainer shares, on-policy (RLOO, PPO) and supervised (SFT, reward model): the run's folder
    and seed, the AdamW settings, logging, checkpoints and trackers. An "iteration" is one rollout and its update
    on-policy, and one optimizer step in the supervised trainers."""

    model_config = Spec.model_config | {"populate_by_name": True}

    # -- run ---------------------------------------------------------------------------------------------------
    output_dir: str = Field("runs/training-wizard", description=OUTPUT_DIR_DESCRIPTION)
    seed: int = Field(DEFAULT_SEED, description=SEED_DESCRIPTION, **SEED_RANGE)
    overwrite_output_dir: bool = Field(False, description=OVERWRITE_OUTPUT_DIR_DESCRIPTION)
    gradient_accumulation_steps: PositiveInt = Field(1, description="Micro-batches accumulated per optimizer step.")
    # -- optimisation --------------------------------------------------------------------------------------------
    lr_scheduler_type: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "linear", description="Learning-rate schedule over the iterations (stepped once per iteration)."
    )
    warmup_steps: int = Field(0, ge=0, description="Iterations of linear warmup (overrides warmup_ratio if > 0).")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Share of iterations used for warmup.")
    weight_decay: NonNegativeFloat = Field(0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, gt=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, gt=0.0, lt=1.0, description="AdamW beta2.")
    adam_epsilon: PositiveFloat = Field(1e-8, description="AdamW epsilon.")
    max_grad_norm: PositiveFloat | None = Field(1.0, description="Clip the global gradient norm; null disables.")
    skip_nonfinite_batches: bool = Field(
        False,
        description="On a NaN/inf in logits, loss or gradient, skip that optimizer step (counted in "
        "guards/skipped_batches; in RL a non-finite rollout skips the whole update) instead of stopping the run.",
    )
    # -- logging, saving ---------------------------------------------------------------------------------------
    logging_steps: PositiveInt = Field(1, description="Log metrics every N iterations.")
    eval_steps: PositiveInt | None = Field(None, description="Evaluate on eval_dataset every N iterations.")
    save_steps: PositiveInt | None = Field(None, description="Write a checkpoint every N iterations.")
    save_total_limit: PositiveInt | None = Field(None, description="Keep at most this many checkpoints.")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list, description="Extra trackers; metrics.jsonl is always written. TRL's forms are read "
        'too: one name, "none" (no extra tracker).'
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_in_trls_forms(cls, value):
        """TRL's TrainingArguments take one tracker's name or "none" where ours is the list of extra trackers."""
        if value in (None, "none", ["none"]):
            return []
        return [value] if isinstance(value, str) else value

    run_name: str | None = Field(None, description="The run's name in wandb and trackio (TRL's run_name); default: "
                                 "the tracker's own.")
    project: str = Field("training-wizard", description="The wandb/trackio project the run is logged under (TRL's "
                         'project, whose default is "huggingface").')
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weight dtype the recipe loads models in (float32 on CPU)."
    )
    # TRL's TrainingArguments names for what the launch otherwise decides (accelerate_options); off by default,
    # where TRL turns bf16 on: float32 is the exact, portable default (docs/trl_options.md)
    bf16: bool = Field(False, description="Mixed precision in bfloat16 (accelerate's autocast; the weights and "
                       "optimizer stay in dtype), as TRL's bf16. Overrides accelerate launch --mixed_precision.")
    fp16: bool = Field(False, description="Mixed precision in float16, as TRL's fp16; not with bf16.")
    use_cpu: bool = Field(False, description="Train on the CPU even where a GPU is present (TRL's use_cpu).")

    @model_validator(mode="after")
    def _one_mixed_precision(self):
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 are both true: choose one mixed precision")
        return self

    def accelerate_options(self) -> dict:
        """Accelerator keywords of a run of this config: its gradient accumulation, and TRL's bf16 / fp16 /
        use_cpu where set (else the launch's own settings stand)."""
        options: dict = {"gradient_accumulation_steps": self.gradient_accumulation_steps}
        if self.bf16 or self.fp16:
            options["mixed_precision"] = "bf16" if self.bf16 else "fp16"
        if self.use_cpu:
            options["cpu"] = True
        return options
