"""The Rollout record: everything one iteration sampled and scored on one process, complete and immutable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from training_wizard.rollout.scoring import content_columns


@dataclass(frozen=True)
class Rollout:
    """B = completions on this process (local_batch_size), P = prompt width, T = response width.

    Completion j of local prompt i sits at row j * local_prompts + i (TRL's (rloo_k, prompts) layout).
    Built once by `RolloutCollector.collect`; nothing fills it in later.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded
    prompt_mask: torch.Tensor  # (B, P) bool, True = real prompt token
    responses: torch.Tensor  # (B, T) long, pad after the stop token
    response_mask: torch.Tensor  # (B, T) bool, True = real response token (the stop token included)
    has_stop: torch.Tensor  # (B,) bool: the completion ended with the stop token
    logprobs: torch.Tensor  # (B, T) float32: policy ("old") logprobs at sampling temperature, no grad
    ref_logprobs: torch.Tensor  # (B, T) float32: reference logprobs, same temperature
    scores: torch.Tensor  # (B,) float32: reward after missing_eos_penalty, before any normalisation
    queries: list[str]  # (B,) the query text of each row
    completions: list[str]  # (B,) decoded completions (special tokens skipped)
    components: Mapping[str, list[float]] = field(default_factory=dict)  # reward components, (B,) each
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)  # per-token (B, T) passes, e.g. PPO "values"
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds: generation, logprobs, scoring
    # (B, T) float32: logprobs as the sampling engine gave them, when it is not the training model (vLLM), else None
    sampling_logprobs: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.responses.shape[0]

    def rows(self, index: torch.Tensor) -> dict[str, Any]:
        """The tensors an update micro-batch needs, for the rows `index`, cut to their content: prompt columns
        that are padding in every picked row and response columns after the last real token of every picked row
        are left out (`scoring.content_columns`), so the update does no work on them. "width" is the number of
        response columns kept (cut per-token tensors of the rows, e.g. token-level advantages, to it)."""
        prompt_mask, response_mask = self.prompt_mask[index], self.response_mask[index]
        first, width = content_columns(prompt_mask, response_mask)
        picked = {
            "prompt_ids": self.prompt_ids[index, first:],
            "prompt_mask": prompt_mask[:, first:],
            "responses": self.responses[index, :width],
            "response_mask": response_mask[:, :width],
            "logprobs": self.logprobs[index, :width],
            "width": width,
        }
        picked.update({name: values[index, :width] for name, values in self.extras.items()})
        if self.sampling_logprobs is not None:
            picked["sampling_logprobs"] = self.sampling_logprobs[index, :width]
        return picked
