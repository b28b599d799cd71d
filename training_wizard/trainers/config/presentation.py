"""The on-policy configs' options for how conversations are rendered and where a run shows its samples: chat
template variables, the sample rows printed, trackio's Space. They carry TRL's names, which are ours too."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveInt

from training_wizard.trainers.config.run import RunConfig


class PresentationOptions(RunConfig):
    """Mixed into OnPolicyConfig (trainers/config/on_policy.py)."""

    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables for the chat template, passed to every rendering of a conversation "
        "(prompts, episode turns, evaluation), e.g. {enable_thinking = false} for Qwen3's template.")
    num_completions_to_print: PositiveInt | None = Field(
        None, description="Rows of the sample table printed at each sample event (TRL's name); unset: 4. "
        "samples.jsonl receives the same rows.")
    trackio_space_id: str | None = Field(
        None, description="The Hugging Face Space trackio sends the run to (report_to = [\"trackio\"]); unset: "
        "trackio logs locally. Without trackio installed it is only recorded in the run's config.")
