"""Credit per turn in episodes of several turns: per-turn returns, their group baselines and the per-token
advantages they give (docs/algorithms.md). B = episodes, K = the most turns of any, T = completion width.
An episode of n_i turns has rewards r_{i,0..n_i-1}; entries at k >= n_i are padding."""

from __future__ import annotations

import torch

from training_wizard.core.groups import group_members


def turn_returns(turn_rewards: torch.Tensor, turn_counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_{i,k} = sum_{j=k}^{n_i-1} gamma^(j-k) r_{i,j}; 0 where k >= n_i. (B, K), (B,) -> (B, K)."""
    width = turn_rewards.shape[1]
    reached = torch.arange(width, device=turn_rewards.device).unsqueeze(0) < turn_counts.unsqueeze(-1)
    rewards = torch.where(reached, turn_rewards, torch.zeros_like(turn_rewards))
    returns = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])
    for k in reversed(range(width)):
        following = rewards[:, k] + gamma * following
        returns[:, k] = following
    return torch.where(reached, returns, torch.zeros_like(returns))


def turn_advantages(mode: str, turn_rewards: torch.Tensor, turn_counts: torch.Tensor, group_ids: torch.Tensor,
                    gamma: float, baseline: str = "leave_one_out") -> torch.Tensor:
    """Each turn's return minus a group baseline (see docs/algorithms.md), (B, K); 0 where k >= n_i.
    "discounted_return": the baseline is the group's mean first-turn return; "turn_baseline": the group's mean
    return at turn k, an episode that ended before k counted with its last turn's. `baseline`: "leave_one_out"
    (the other rows of the group) or "group_mean" (every row of the group)."""
    if mode not in ("discounted_return", "turn_baseline"):
        raise ValueError(f"unknown turn credit mode {mode!r}; expected 'discounted_return' or 'turn_baseline'")
    if baseline not in ("leave_one_out", "group_mean"):
        raise ValueError(f"unknown baseline {baseline!r}; expected 'leave_one_out' or 'group_mean'")
    returns = turn_returns(turn_rewards, turn_counts, gamma)
    width = returns.shape[1]
    turns = torch.arange(width, device=returns.device).unsqueeze(0)
    if mode == "discounted_return":
        compared = returns[:, :1].expand_as(returns)
    else:
        last = (turn_counts.unsqueeze(-1) - 1).clamp(min=0)
        compared = returns.gather(1, torch.minimum(turns, last))
    advantages = torch.zeros_like(returns)
    for members in group_members(group_ids).to(returns.device).t():
        values = compared[members]  # (k, K)
        total = values.sum(0, keepdim=True)
        size = values.shape[0]
        if baseline == "leave_one_out":
            mean = (total - values) / max(size - 1, 1)
        else:
            mean = (total / size).expand_as(values)
        advantages[members] = returns[members] - mean
    reached = turns < turn_counts.unsqueeze(-1)
    return torch.where(reached, advantages, torch.zeros_like(advantages))


def token_advantages(per_turn: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """(B, K) per-turn values spread over each turn's tokens, (B, T); tokens with turn_index -1 get 0."""
    picked = per_turn.gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, picked, torch.zeros_like(picked))


def turn_end_rewards(turn_rewards: torch.Tensor, turn_last_token: torch.Tensor, turn_counts: torch.Tensor,
                     width: int) -> torch.Tensor:
    """Each turn's reward at its last model token, (B, T) of width `width`; turns k >= n_i place nothing."""
    rewards = turn_rewards.new_zeros((turn_rewards.shape[0], width))
    reached = torch.arange(turn_rewards.shape[1], device=turn_rewards.device).unsqueeze(0) < turn_counts.unsqueeze(-1)
    placed = torch.where(reached, turn_rewards, torch.zeros_like(turn_rewards))
    return rewards.scatter_add(1, turn_last_token.clamp(min=0, max=width - 1), placed)
