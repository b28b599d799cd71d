"""Leave-one-out advantages, whitening and reward normalisation."""

from __future__ import annotations

import torch


def rloo_advantages(rewards: torch.Tensor, rloo_k: int) -> torch.Tensor:
    """REINFORCE Leave-One-Out: each completion's reward minus the mean reward of the other k-1 of its prompt.

    rewards: (rloo_k * P,) laid out as in seed 000, completion j of prompt p at index j * P + p (the prompts are
    repeated k times, `queries.repeat(k, 1)`), or already (rloo_k, P). Returns the same layout as the input.
    Vectorised as in the seed: baseline = (sum over k - own) / (k - 1). Advantages sum to zero per prompt.
    """
    if rloo_k < 2:
        raise ValueError(f"rloo_k must be at least 2 for a leave-one-out baseline, got {rloo_k}")
    grid = rewards.reshape(rloo_k, -1)
    baseline = (grid.sum(0, keepdim=True) - grid) / (rloo_k - 1)
    return (grid - baseline).reshape(rewards.shape)


def whiten(values: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / std over the (masked) batch; the mean is added back when shift_mean is False.

    Any shape; mask (same shape, bool) selects the entries used for the statistics. A batch with zero variance
    returns values minus the mean (no division by ~0, no NaN).
    """
    selected = values[mask] if mask is not None else values.reshape(-1)
    if selected.numel() == 0:
        return values
    mean = selected.mean()
    var = selected.var(unbiased=selected.numel() > 1) if selected.numel() > 1 else selected.new_zeros(())
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    if mask is not None:
        whitened = torch.where(mask, whitened, torch.zeros_like(whitened))
    return whitened


def normalize_and_clip(scores: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Reinforce++ reward normalisation: standardise over the batch, then clamp to [-clip_range, clip_range]."""
    return whiten(scores).clamp(-clip_range, clip_range)


def reward_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted return from each token to the end of its completion. (B, T) -> (B, T), zero where masked."""
    rewards = token_rewards * mask.to(token_rewards.dtype)
    return rewards.flip(-1).cumsum(-1).flip(-1) * mask.to(token_rewards.dtype)
