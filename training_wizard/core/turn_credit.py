"""Credit per turn in multi-turn episodes: each model reply (turn) gets its own advantage instead of the whole
episode's one.

Row i of a batch is an episode of n_i turns (a single-turn completion has n_i = 1) with per-turn rewards
r_{i,0..n_i-1}: the environment's step reward after each reply, the last turn also carrying the rest of the row's
score, so the turn rewards of a row sum to its score. Shapes: B rows, K = the most turns of any row (columns
k >= n_i are padding), T = the response width. Group ids are the prompts' (`core/groups.py`), so the baselines
are taken over the completions of one prompt whatever the row order.

The modes (`turn_credit` in [training]; docs/algorithms.md, "Credit per turn", has the derivations):
- "discounted_return": A_{i,k} = G_{i,k} - mean_j G_{j,0}, the return from turn k against the group's episode
  returns;
- "turn_baseline": A_{i,k} = G_{i,k} - mean_j G_{j,min(k, n_j - 1)}, against the group's returns from the same
  turn index (an episode that ended before turn k enters with its last turn's return).
"episode" (today's one advantage per row) and "gae" (PPO's value model over `turn_end_rewards`) belong to the
algorithms themselves.
"""

from __future__ import annotations

import torch

from training_wizard.core.groups import from_grid, group_members, on_grid

BASELINES = ("leave_one_out", "group_mean")


def turn_mask(turn_counts: torch.Tensor, turns: int) -> torch.Tensor:
    """(B, K) bool: True at the turns a row has, k < n_i. turn_counts: (B,) long; turns: K."""
    return torch.arange(turns, device=turn_counts.device) < turn_counts[:, None]


def turn_tokens(turn_index: torch.Tensor, turns: int) -> torch.Tensor:
    """(B, K, T) bool: True where token t belongs to reply k. turn_index: (B, T) long, -1 outside the replies."""
    wanted = torch.arange(turns, device=turn_index.device).view(1, -1, 1)
    return turn_index.unsqueeze(1) == wanted


def turn_returns(turn_rewards: torch.Tensor, turn_counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, K) discounted return from each turn to the end of its episode: G_{i,k} = sum_{j=k}^{n_i-1}
    gamma^(j-k) r_{i,j}, and 0 where k >= n_i.

    turn_rewards: (B, K) float (entries at k >= n_i are ignored); turn_counts: (B,) long n_i; gamma in [0, 1].
    """
    turns = turn_rewards.shape[-1]
    valid = turn_mask(turn_counts, turns)
    rewards = torch.where(valid, turn_rewards, torch.zeros_like(turn_rewards))
    index = torch.arange(turns, device=turn_rewards.device)
    lag = index[:, None] - index[None, :]  # lag[j, k] = j - k: reward j discounted back to turn k
    # gamma ** 0 is 1 also for gamma = 0 (torch.pow), so a turn always keeps its own reward
    discount = torch.where(lag >= 0, torch.tensor(gamma, dtype=rewards.dtype).pow(lag.clamp(min=0)), 0.0)
    returns = rewards @ discount.to(rewards.device, rewards.dtype)
    return torch.where(valid, returns, torch.zeros_like(returns))


def group_baseline(values: torch.Tensor, group_ids: torch.Tensor, baseline: str) -> torch.Tensor:
    """(B, ...) the mean of `values` (B, ...) over each row's group: over the other rows j != i
    ("leave_one_out", RLOO; groups of at least two rows) or over all of them, i included ("group_mean", GRPO)."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    members = group_members(group_ids)
    size = members.shape[0]
    grid = on_grid(values, members)  # (group_size, G, ...)
    total = grid.sum(0, keepdim=True)
    if baseline == "group_mean":
        means = total.expand_as(grid) / size
    elif size < 2:
        raise ValueError(f"a leave-one-out baseline needs groups of at least 2 rows, got {size}")
    else:
        means = (total - grid) / (size - 1)
    # from_grid maps one value per row; the position of each row on the grid carries the trailing dimensions along
    slot = from_grid(torch.arange(members.numel(), device=members.device).reshape(members.shape), members)
    return means.reshape(members.numel(), *grid.shape[2:])[slot.to(means.device)]


def turn_advantages(
    mode: str,
    turn_rewards: torch.Tensor,
    turn_counts: torch.Tensor,
    group_ids: torch.Tensor,
    gamma: float,
    baseline: str = "leave_one_out",
) -> torch.Tensor:
    """(B, K) advantage of each turn, 0 where k >= n_i.

    "discounted_return": A_{i,k} = G_{i,k} - mean_j G_{j,0}. "turn_baseline": A_{i,k} = G_{i,k} -
    mean_j G_{j,min(k, n_j - 1)}. The mean is over the other rows of the group with `baseline` = "leave_one_out"
    (which keeps the estimate unbiased when the policy decides how many turns an episode lasts) and over the whole
    group with "group_mean" (GRPO, whose std scaling the trainer applies afterwards). G = `turn_returns`.
    turn_rewards: (B, K) float; turn_counts: (B,) long; group_ids: (B,) long. Another mode is a ValueError.
    """
    returns = turn_returns(turn_rewards, turn_counts, gamma)
    valid = turn_mask(turn_counts, returns.shape[-1])
    if mode == "discounted_return":
        compared = group_baseline(returns[:, 0], group_ids, baseline)[:, None]
    elif mode == "turn_baseline":
        # a row that ended before turn k stands in with the return of its last turn
        last = (turn_counts - 1).clamp(min=0)[:, None]
        reached = torch.minimum(torch.arange(returns.shape[-1], device=returns.device)[None, :], last)
        compared = group_baseline(returns.gather(1, reached), group_ids, baseline)
    else:
        raise ValueError(f"turn_advantages computes 'discounted_return' and 'turn_baseline', got {mode!r} "
                         "('episode' and 'gae' are the algorithms' own)")
    return torch.where(valid, returns - compared, torch.zeros_like(returns))


def token_advantages(per_turn: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """(B, T): every token gets the advantage of its turn. per_turn: (B, K); turn_index: (B, T) long, the turn
    of each response token, -1 outside the model's replies (environment tokens, padding), which get 0."""
    inside = turn_index >= 0
    spread = per_turn.gather(1, turn_index.clamp(min=0).to(per_turn.device))
    return torch.where(inside.to(spread.device), spread, torch.zeros_like(spread))


def turn_end_rewards(
    turn_rewards: torch.Tensor, turn_last_token: torch.Tensor, turn_counts: torch.Tensor, width: int
) -> torch.Tensor:
    """(B, width): each turn's reward at the position of its last model token, 0 elsewhere (PPO's per-token
    rewards under "gae", in place of the whole score at the end).

    turn_rewards: (B, K) float; turn_last_token: (B, K) long, a position in [0, width) for k < n_i (ignored
    beyond; -1, a reply of no token, puts its reward at position 0 so that a row's rewards still sum to its
    score); turn_counts: (B,) long.
    """
    valid = turn_mask(turn_counts, turn_rewards.shape[-1])
    rewards = torch.where(valid, turn_rewards, torch.zeros_like(turn_rewards))
    positions = torch.where(valid, turn_last_token.clamp(min=0), torch.zeros_like(turn_last_token)).to(rewards.device)
    placed = torch.zeros(turn_rewards.shape[0], width, dtype=rewards.dtype, device=rewards.device)
    return placed.scatter_add(1, positions, rewards)
