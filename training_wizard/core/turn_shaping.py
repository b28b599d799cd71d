"""The algorithms' use of credit per turn (core/turn_credit.py): RLOO's and GRPO's per-token advantages of the
turn modes, and where each turn ends for PPO's "gae". B = rows, K = the most turns of any row, T = completion
width; `turn_index` (B, T) long is -1 outside the model's replies (rollout/trajectory.py)."""

from __future__ import annotations

import torch

from training_wizard.core.advantages import Moments, rows_with_scored_sibling, whiten
from training_wizard.core.groups import from_grid, group_members, on_grid
from training_wizard.core.grpo import scored_group_moments
from training_wizard.core.turn_credit import token_advantages, turn_advantages, turn_tokens


def with_last_turn_added(turn_rewards: torch.Tensor, turn_counts: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """(B, K) turn rewards with `extra` (B,) added to each row's last turn (RLOO's KL part of the reward)."""
    rows = torch.arange(turn_rewards.shape[0], device=turn_rewards.device)
    added = turn_rewards.clone()
    added[rows, turn_counts - 1] += extra.to(turn_rewards.dtype)
    return added


def turn_last_tokens(turn_index: torch.Tensor, turns: int) -> torch.Tensor:
    """(B, K) long: the position of each turn's last model token; -1 for a turn with no token."""
    positions = torch.arange(turn_index.shape[1], device=turn_index.device)
    in_turn = turn_tokens(turn_index, turns)
    return torch.where(in_turn, positions, torch.full_like(positions, -1)).amax(-1)


def rloo_turn_advantages(mode: str, turn_rewards: torch.Tensor, turn_counts: torch.Tensor, turn_index: torch.Tensor,
                         group_ids: torch.Tensor, gamma: float, mask: torch.Tensor, normalize_advantage: bool,
                         moments: Moments, scored: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO's (B, T) advantages under a turn mode: leave-one-out turn advantages on each turn's tokens; rows
    without a scored sibling get 0 (as their episode-mode advantage); normalize_advantage whitens over the loss
    tokens of the other rows, as under token_level_kl."""
    per_turn = turn_advantages(mode, turn_rewards, turn_counts, group_ids, gamma, baseline="leave_one_out")
    advantages = token_advantages(per_turn, turn_index) * mask
    statistics_mask = mask
    if scored is not None and not bool(scored.all()):
        statistics_mask = mask & rows_with_scored_sibling(scored, group_ids).unsqueeze(-1)
        advantages = torch.where(statistics_mask, advantages, torch.zeros_like(advantages))
    if normalize_advantage:
        advantages = whiten(advantages, statistics_mask, moments=moments)
    return advantages


def group_reward_std(rewards: torch.Tensor, group_ids: torch.Tensor, scored: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """(B,): the unbiased standard deviation of each row's group rewards over its scored rows (every row when
    `scored` is None); NaN where the group has fewer than two."""
    members = group_members(group_ids)
    grid = on_grid(rewards, members)
    kept = torch.ones_like(grid, dtype=torch.bool) if scored is None else on_grid(scored.to(rewards.device), members)
    std = scored_group_moments(grid, kept)[1]
    return from_grid(std.expand_as(grid), members)


def grpo_turn_advantages(mode: str, turn_rewards: torch.Tensor, turn_counts: torch.Tensor, turn_index: torch.Tensor,
                         scores: torch.Tensor, group_ids: torch.Tensor, gamma: float, scale_rewards: str,
                         moments: Moments, scored: torch.Tensor | None, std_epsilon: float) -> torch.Tensor:
    """GRPO's (B, T) advantages under a turn mode: turn advantages against the group's mean (row included),
    divided as `core.grpo.group_advantages` divides (the standard deviation of the episode scores, the group's or
    the batch's, + std_epsilon; "none": not divided); rows no reward scored, or in a group with fewer than two
    scored rows, get 0."""
    per_turn = turn_advantages(mode, turn_rewards, turn_counts, group_ids, gamma, baseline="group_mean")
    if scale_rewards == "batch":
        std = moments(scores, scored)[1].clamp(min=0).sqrt().expand_as(scores)
    else:
        std = group_reward_std(scores, group_ids, scored)
    if scale_rewards != "none":
        per_turn = per_turn / (std + std_epsilon).unsqueeze(-1)
    if scored is not None and not bool(scored.all()):
        valid = rows_with_scored_sibling(scored.to(scores.device), group_ids)
        per_turn = torch.where(valid.unsqueeze(-1), per_turn, torch.zeros_like(per_turn))
    return token_advantages(per_turn, turn_index)
