"""Micro-batches by tokens: rows grouped so that each forward pass holds at most a budget of tokens
(`max_tokens_per_micro_batch`; veRL's `ppo_max_token_len_per_gpu`, OpenRLHF's `max_tokens_per_gpu`, SkyRL's
`max_tokens_per_microbatch`, AReaL's `max_tokens_per_mb` name the same idea).

A padded chunk costs its rows times its width, and its width is the sum of the longest part of each kind (left-
padded prompts and right-padded responses are padded apart: `rollout/scoring.py: content_columns`). A packed
(padding-free) chunk costs its real tokens. The grouping depends on the lengths alone, so every run of the same
rows groups them alike.
"""

from __future__ import annotations

from typing import Sequence

import torch

# A row's length: its tokens, or its tokens per padded part (prompt, response).
RowLength = int | Sequence[int]


def _parts(length: RowLength) -> tuple[int, ...]:
    return (int(length),) if isinstance(length, int) else tuple(int(part) for part in length)


def chunk_tokens(lengths: Sequence[RowLength], padded: bool = True) -> int:
    """The tokens a forward pass over rows of these `lengths` holds: rows x the sum of each part's longest when
    `padded`, else the sum of every row's tokens."""
    parts = [_parts(length) for length in lengths]
    if not parts:
        return 0
    if padded:
        return len(parts) * sum(max(column) for column in zip(*parts))
    return sum(sum(row) for row in parts)


def micro_batches(lengths: Sequence[RowLength], budget: int, padded: bool = True) -> list[list[int]]:
    """Row positions grouped so that each group's `chunk_tokens` is at most `budget`.

    Rows are taken shortest first (by their total length; a stable sort, so equal lengths keep their order) and
    added to the current group while it stays within the budget; a row that alone exceeds the budget gets a group
    of its own. `padded`: see `chunk_tokens` (False for padding-free forward passes, which count real tokens).
    Every position appears in exactly one group; groups come shortest first.
    """
    if budget < 1:
        raise ValueError(f"a token budget must be at least 1, got {budget}")
    parts = [_parts(length) for length in lengths]
    order = sorted(range(len(parts)), key=lambda row: sum(parts[row]))
    groups: list[list[int]] = []
    current: list[int] = []
    longest: tuple[int, ...] = ()  # each part's longest in the current group (padded)
    tokens = 0  # the current group's real tokens (packed)
    for row in order:
        widest = tuple(map(max, longest, parts[row])) if current else parts[row]
        cost = (len(current) + 1) * sum(widest) if padded else tokens + sum(parts[row])
        if current and cost > budget:
            groups.append(current)
            current, widest, tokens = [], parts[row], 0
        current.append(row)
        longest, tokens = widest, tokens + sum(parts[row])
    if current:
        groups.append(current)
    return groups


def padded_row_lengths(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> list[tuple[int, int]]:
    """Each row's (prompt tokens, response columns up to its last real token, at least 1) of left-padded prompts
    and right-padded responses: what a padded chunk cut to its content (`content_columns`) spends on the row.
    prompt_mask (B, P), response_mask (B, T) bool -> B pairs."""
    prompt = prompt_mask.long().sum(-1)
    positions = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    response = (response_mask.long() * positions).amax(-1).clamp(min=1) if response_mask.shape[1] else \
        torch.ones_like(prompt)
    return list(zip(prompt.tolist(), response.tolist()))


def token_budget_chunks(prompt_mask: torch.Tensor, response_mask: torch.Tensor, budget: int,
                        padded: bool = True) -> list[torch.Tensor]:
    """The row indices of each chunk of a pass over left-padded prompts and right-padded responses under a token
    budget (`micro_batches` of `padded_row_lengths`; `padded` False: the chunk is packed, its real tokens count). prompt_mask (B, P), response_mask (B, T) -> long
    index tensors."""
    groups = micro_batches(padded_row_lengths(prompt_mask, response_mask), budget, padded=padded)
    return [torch.tensor(group, dtype=torch.long, device=prompt_mask.device) for group in groups]
