"""Sampling completions with a KV cache, randomness keyed per row.

Each row draws its noise from its own `torch.Generator`, seeded from (run seed, iteration, prompt slot, sample
index) by the caller. A prompt therefore gets the same completions whichever process samples it and whatever
else is in its batch (DESIGN 5b), which is what lets one process and two processes end with the same weights.
Sampling uses the exponential-race form of the Gumbel-max trick: argmax(p_i / E_i), E_i ~ Exp(1), which picks
token i with probability p_i using one vector of noise per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class GenerationParams:
    max_new_tokens: int
    temperature: float
    stop_token_id: int | None
    pad_token_id: int


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. (B, L) -> (B, L) long."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sample_next_token(logits: torch.Tensor, temperature: float, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row from softmax(logits / temperature) with each row's own generator. (B, V) -> (B,)."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    noise = torch.stack(
        [torch.empty(logits.shape[-1], dtype=torch.float32).exponential_(generator=g) for g in generators]
    ).to(logits.device)
    return (log_probs - noise.log()).argmax(dim=-1)


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
    generators = [torch.Generator().manual_seed(int(seed)) for seed in row_seeds]
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
        token = sample_next_token(logits, params.temperature, generators)
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
