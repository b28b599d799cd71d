"""Response masks. One polarity everywhere: True marks a real response token."""

from __future__ import annotations

import torch


def first_true_index(flags: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim, or its length when there is none.

    flags: (B, T) bool -> (B,) long.
    """
    length = flags.shape[-1]
    positions = torch.arange(length, device=flags.device).expand_as(flags)
    return torch.where(flags, positions, torch.full_like(positions, length)).min(dim=-1).values


def is_stop_token(tokens: torch.Tensor, stop_token_ids: tuple[int, ...]) -> torch.Tensor:
    """Whether each token is one of the stop tokens. tokens: any shape -> bool of that shape."""
    return torch.isin(tokens, torch.tensor(stop_token_ids, dtype=tokens.dtype, device=tokens.device))


def truncate_after_stop(
    responses: torch.Tensor, stop_token_ids: tuple[int, ...], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep each response up to and including its first stop token (any of `stop_token_ids`: chat models end a
    turn with one of several, as Llama-3's <|eot_id|> or <|end_of_text|>); pad and mask what follows.

    responses: (B, T) token ids as sampled. Returns (responses (B, T) with pad after the stop token,
    mask (B, T) bool, True = real token, the stop token included; has_stop (B,) bool).
    With no stop token nothing is truncated, every token is real, and has_stop is all False.
    """
    if not stop_token_ids:
        mask = torch.ones_like(responses, dtype=torch.bool)
        return responses, mask, torch.zeros(responses.shape[0], dtype=torch.bool, device=responses.device)
    stop_at = first_true_index(is_stop_token(responses, stop_token_ids))
    positions = torch.arange(responses.shape[1], device=responses.device).unsqueeze(0)
    mask = positions <= stop_at.unsqueeze(1)
    truncated = torch.where(mask, responses, torch.full_like(responses, pad_token_id))
    return truncated, mask, stop_at < responses.shape[1]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over positions where mask is True; 0 where there are none (never NaN)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over positions where mask is True. values, mask: (B, T) -> (B,)."""
    return (values * mask.to(values.dtype)).sum(dim)


def truncation_mask(mask: torch.Tensor, has_stop: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering (TRL's `mask_truncated_completions`): a completion cut off by the length limit
    (no stop token) carries no loss. mask: (B, T) bool, has_stop: (B,) bool -> (B, T) bool."""
    return mask & has_stop.unsqueeze(-1)
