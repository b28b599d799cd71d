"""Sampling completions with a KV cache, randomness keyed per row.

Each row has a key from (run seed, iteration, prompt slot, sample index), given by the caller, and each token is
drawn with `rollout.sampling.sample_from_logits` from a uniform that depends only on (key, token step), computed
on the model's device. A prompt therefore gets the same completions whichever process samples it and whatever
else is in its batch (DESIGN 5b), which is what lets one process and two processes end with the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from training_wizard.rollout.sampling import sample_from_logits


@dataclass
class GenerationParams:
    max_new_tokens: int
    temperature: float
    stop_token_id: int | None
    pad_token_id: int


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. (B, L) -> (B, L) long."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: GenerationParams,
    row_seeds: list[int],
    all_finished: Callable[[bool], bool] | None = None,
) -> torch.Tensor:
    """Sample up to `max_new_tokens` per row; rows that emitted the stop token continue with pad.

    prompt_ids, prompt_mask: (B, P), left-padded. Returns responses (B, T) with T <= max_new_tokens (the loop ends
    early once every row has stopped). With sharded weights every forward pass is a collective, so processes must
    run the same number of steps: `all_finished(local_done)` then says whether every process is done.
    """
    keys = torch.tensor([int(seed) for seed in row_seeds], dtype=torch.long, device=prompt_ids.device)
    batch = prompt_ids.shape[0]
    attention_mask = prompt_mask.long()
    positions = position_ids_from_mask(attention_mask)
    out = model(
        input_ids=prompt_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    past, logits = out.past_key_values, out.logits[:, -1, :]
    next_position = positions[:, -1:] + 1
    finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
    tokens: list[torch.Tensor] = []
    for step in range(params.max_new_tokens):
        if params.temperature == 0:  # greedy (evaluation); training always samples
            token = logits.argmax(dim=-1)
        else:
            token = sample_from_logits(logits, params.temperature, keys, step)
        token = torch.where(finished, torch.full_like(token, params.pad_token_id), token)
        tokens.append(token)
        if params.stop_token_id is not None:
            finished |= token == params.stop_token_id
        done = bool(finished.all())
        if all_finished is not None:
            done = all_finished(done)
        if done or step == params.max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1, :]
        next_position = next_position + 1
    return torch.stack(tokens, dim=1)
