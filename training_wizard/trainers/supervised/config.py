"""Configs of the supervised stages: SFT, reward models and sequence classification (TRL's SFTConfig and
RewardConfig names), and their batch plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from training_wizard.trainers.config.run import RunConfig, aliases

# Supervised stages: SFT and reward models (TRL's SFTConfig and RewardConfig names)


class SupervisedConfig(RunConfig):
    """Options of the supervised loop (trainers/supervised/loop.py). One iteration is one optimizer step over
    `per_device_train_batch_size x gradient_accumulation_steps x processes` examples of a shared seeded order,
    epoch after epoch."""

    per_device_train_batch_size: PositiveInt = Field(
        8, description="Examples per forward/backward pass: sequences (packed rows with packing) or preference pairs."
    )
    per_device_eval_batch_size: PositiveInt = Field(8, description="Examples per forward pass in evaluation.")
    num_train_epochs: PositiveFloat = Field(3.0, description="Passes over the training rows (unless max_steps is set).")
    max_steps: PositiveInt | None = Field(
        None, description="Optimizer steps in all; overrides num_train_epochs when set."
    )
    max_length: PositiveInt | None = Field(
        1024, description="Keep at most this many tokens of each example (the end is cut off); null keeps all."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward: less memory, "
                                         "about a third more compute.")
    extra_roles: list[str] = Field(
        default_factory=list, description="Roles besides system, user and assistant that conversational rows may use "
        "(e.g. 'tool'), for a chat template that renders them."
    )

    def supervised_plan(self, world_size: int, rows: int) -> SupervisedPlan:
        """Examples per step and the number of steps, derived once."""
        batch = self.per_device_train_batch_size * self.gradient_accumulation_steps * world_size
        steps = self.max_steps or max(1, math.ceil(self.num_train_epochs * rows / batch))
        return SupervisedPlan(world_size=world_size, rows=rows, batch_size=batch,
                              micro_batch_size=self.per_device_train_batch_size, num_steps=steps)


class SFTConfig(SupervisedConfig):
    """Supervised fine-tuning (TRL's SFTConfig names): next-token cross-entropy on the completion tokens."""

    learning_rate: PositiveFloat = Field(2e-5, description="Peak AdamW learning rate (TRL's SFTConfig default).")
    completion_only_loss: bool = Field(
        True,
        description="Train on the completion tokens only: the `completion` of prompt/completion rows, the assistant "
        "turns of `messages` rows (TRL's assistant_only_loss, accepted as an alias). false: every token. Rows of "
        "plain `text` always train on every token.",
        validation_alias=aliases("completion_only_loss", "assistant_only_loss"),
    )
    packing: bool = Field(
        False,
        description="Pack several examples into each row of max_length tokens (first fit, longest first). Position "
        "ids restart at each example, so no token attends to another example (transformers builds the block-diagonal "
        "mask from them on eager, sdpa and flash attention); the loss equals the unpacked one.",
    )
    add_eos_token: bool = Field(
        True, description="End each plain-text row (a `text` row, or a string completion) with the EOS token if it "
        "lacks one, as TRL's SFTTrainer does; conversational rows end as their chat template ends them."
    )
    chat_template_path: str | None = Field(
        None, description="The chat template conversational rows are rendered with, instead of the tokenizer's (TRL's "
        "name): a template name (\"hermes\": ChatML with Hermes tool calls), a Jinja file, or the template text. It "
        "is saved with model/, so a later recipe renders prompts the same way (e.g. an episode recipe's tools)."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables for the chat template when conversational rows are rendered (TRL's "
        "GRPOConfig name), e.g. {enable_thinking = false} for Qwen3's template."
    )


class RewardConfig(SupervisedConfig):
    """Reward-model training (TRL's RewardConfig names): the Bradley-Terry loss on chosen/rejected pairs."""

    learning_rate: PositiveFloat = Field(5e-5, description="Peak AdamW learning rate.")
    max_length: PositiveInt | None = Field(
        1024, description="Pairs whose chosen or rejected text is longer than this many tokens are left out (as "
        "TRL's RewardTrainer filters them), and counted in a note; null keeps all."
    )
    center_rewards_coefficient: NonNegativeFloat | None = Field(
        None, description="Weight of the term mean((r_chosen + r_rejected)^2), which keeps rewards centred on zero "
        "(Eisenstein et al. 2023; TRL's RewardConfig). null or 0: off."
    )
    disable_dropout: bool = Field(True, description="Turn dropout off in the model (as TRL's RewardConfig does).")


class SequenceClassificationConfig(SupervisedConfig):
    """Sequence classification (training-wizard 1.0's sequence_classification recipe): a classifier with
    `num_labels` outputs trained on text rows with an integer label."""

    learning_rate: PositiveFloat = Field(5e-5, description="Peak AdamW learning rate.")
    loss_type: Literal["cross_entropy", "binary_cross_entropy"] = Field(
        "cross_entropy", description="cross_entropy: softmax over num_labels classes; binary_cross_entropy: one "
        "output, labels 0/1, sigmoid."
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="Label smoothing of the loss.")
    num_labels: PositiveInt = Field(2, description="Outputs of the classifier (1 for binary_cross_entropy).")
    text_column: str = Field("text", description="The column with the text to classify.")
    label_column: str = Field("labels", description="The column with the integer label.")

    @model_validator(mode="after")
    def _binary_has_one_output(self) -> SequenceClassificationConfig:
        if self.loss_type == "binary_cross_entropy" and self.num_labels != 1:
            raise ValueError("loss_type = binary_cross_entropy needs num_labels = 1")
        return self


@dataclass(frozen=True)
class SupervisedPlan:
    world_size: int
    rows: int
    batch_size: int
    micro_batch_size: int
    num_steps: int

    def rows_table(self) -> list[tuple[str, int]]:
        return [("training rows", self.rows), ("examples per step (batch_size)", self.batch_size),
                ("examples per forward pass", self.micro_batch_size), ("processes", self.world_size),
                ("optimizer steps", self.num_steps)]
