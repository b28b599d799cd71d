"""The trajectory batch: one record of what an iteration sampled and scored on one process, the one format every
trainer reads, whatever produced it (one reply per prompt today; episodes of several turns, and rows sampled by
older weights, are the same record with another loss mask and policy version)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from training_wizard.rollout.scoring import content_columns


class StopReason(enum.IntEnum):
    """Why a row's sampling ended, one code per row in `TrajectoryBatch.stop_reason`."""

    STOP_TOKEN = 0  # the model ended its reply with a stop token
    LENGTH = 1  # the token budget (response_length) ran out first: the row is truncated
    TURNS = 2  # an episode reached its turn limit
    ENVIRONMENT_DONE = 3  # the environment ended the episode
    TOOL_BUDGET = 4  # an episode used up its tool calls


@dataclass(frozen=True)
class TrajectoryBatch:
    """B = rows on this process (local_batch_size), P = prompt width, T = completion width.

    The completion is every token after the prompt: the model's replies and, in an episode of several turns, what
    the environment answered between them. Two masks tell them apart:
    - `completion_mask`: a real token (not padding), the model's or the environment's; every forward pass runs
      over these;
    - `loss_mask`: a token the policy sampled and is trained on. Every loss, KL, entropy, ratio, clip fraction,
      length metric, advantage whitening and guard reads this one. Single-turn rows: the same as completion_mask.
    Rows of one prompt share a group id (RLOO's and GRPO's baselines are taken within a group); the trainers lay
    them out as completion j of local prompt i at row j * local_prompts + i, but nothing relies on that order.
    Built once by a rollout source (rollout/collector.py); nothing fills it in later. The texts are for logs only.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded
    prompt_mask: torch.Tensor  # (B, P) bool, True = real prompt token
    completion_ids: torch.Tensor  # (B, T) long, pad after the last real token
    completion_mask: torch.Tensor  # (B, T) bool, True = real token (the stop token included)
    loss_mask: torch.Tensor  # (B, T) bool, True = sampled by the policy and trained on; a subset of completion_mask
    stop_reason: torch.Tensor  # (B,) long, a StopReason per row
    group_ids: torch.Tensor  # (B,) long: rows sampled from the same prompt share one
    policy_version: torch.Tensor  # (B,) long: the optimizer updates the sampling weights had seen
    logprobs: torch.Tensor  # (B, T) float32: policy ("old") logprobs at sampling temperature, no grad
    ref_logprobs: torch.Tensor  # (B, T) float32: reference logprobs, same temperature
    scores: torch.Tensor  # (B,) float32: reward after missing_eos_penalty, before any normalisation
    queries: list[str]  # (B,) the query text of each row, for logs
    completions: list[str]  # (B,) decoded completions (special tokens skipped), for logs and text rewards
    components: Mapping[str, list[float]] = field(default_factory=dict)  # reward components, (B,) each
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)  # per-token (B, T) passes, e.g. PPO "values"
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds: generation, logprobs, scoring
    # episodes of several turns: per-row counts (B,) float32 by name (tool calls, failures, malformed calls,
    # tokenization drift), which the episode metrics sum; empty for single replies
    episode_stats: Mapping[str, torch.Tensor] = field(default_factory=dict)
    # (B, T) float32, 0 outside the loss mask: the behaviour policy's logprobs as the sampling engine gave them,
    # when that engine is not the training model (vLLM); None: `logprobs` are the sampler's
    sampling_logprobs: torch.Tensor | None = None
    # what the reward's functions logged while scoring these rows (TRL 1.16's `log_extra` and `log_metric`,
    # specs/reward.py FunctionLogs): columns of the sample table, (B,) values each, and scalar metrics by name,
    # each value one call (the trainer logs their mean over every process)
    logged_columns: Mapping[str, list[Any]] = field(default_factory=dict)
    logged_metrics: Mapping[str, list[float]] = field(default_factory=dict)
    # credit per turn (core/turn_credit.py), filled by the collector for episodes and single replies alike (a single
    # reply is one turn); None only in batches built by hand. turn_index: (B, T) long, the model reply a token
    # belongs to, -1 outside the replies (the environment's tokens, padding); turn_rewards: (B, K) float32, each
    # turn's step reward, the last turn topped up so that a row's turn rewards sum to its score; turn_counts: (B,)
    # long, the replies of each row (K: the most of any row)
    turn_index: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    turn_counts: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def has_stop(self) -> torch.Tensor:
        """(B,) bool: the row was not cut off by the length budget (its last reply ended by itself)."""
        return self.stop_reason != StopReason.LENGTH

    def rows(self, index: torch.Tensor) -> dict[str, Any]:
        """The tensors an update micro-batch needs, for the rows `index`, cut to their content: prompt columns
        that are padding in every picked row and completion columns after the last real token of every picked row
        are left out (`scoring.content_columns`), so the update does no work on them. "width" is the number of
        completion columns kept (cut per-token tensors of the rows, e.g. token-level advantages, to it)."""
        prompt_mask, completion_mask = self.prompt_mask[index], self.completion_mask[index]
        first, width = content_columns(prompt_mask, completion_mask)
        picked = {
            "prompt_ids": self.prompt_ids[index, first:],
            "prompt_mask": prompt_mask[:, first:],
            "completion_ids": self.completion_ids[index, :width],
            "completion_mask": completion_mask[:, :width],
            "loss_mask": self.loss_mask[index, :width],
            "logprobs": self.logprobs[index, :width],
            "width": width,
        }
        picked.update({name: values[index, :width] for name, values in self.extras.items()})
        if self.sampling_logprobs is not None:
            picked["sampling_logprobs"] = self.sampling_logprobs[index, :width]
        return picked

