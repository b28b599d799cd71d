"""Sampling completions with a KV cache, randomness keyed per row.

Each row has a key from (run seed, iteration, prompt slot, sample index), given by the caller, and each token is
drawn with `rollout.sampling.sample_with_logprobs` from a uniform that depends only on (key, token step), computed
on the model's device. A prompt therefore gets the same completions whichever process samples it and whatever
else is in its batch, which is what lets one process and two processes end with the same weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from training_wizard.core.masking import is_stop_token
from training_wizard.rollout.sampling import SamplingFilters, greedy_with_logprobs, sample_with_logprobs
from training_wizard.rollout.scoring import (
    distinct_rows, last_positions, plain_key_value_cache, position_ids_from_mask,
)


@dataclass
class GenerationParams:
    max_new_tokens: int
    temperature: float
    stop_token_ids: tuple[int, ...]  # a completion ends at the first of any of them; () = run to max_new_tokens
    pad_token_id: int
    filters: SamplingFilters | None = None  # top_k, top_p, min_p, repetition_penalty (rollout/sampling.py)


def default_stop_token_ids(tokenizer, model) -> tuple[int, ...]:
    """The tokens that end a completion by default, as TRL's: the tokenizer's EOS, then every id of the model's
    `generation_config.eos_token_id`. Chat models list several there (Llama-3 Instruct: <|eot_id|>, <|eom_id|>,
    <|end_of_text|>; Qwen2.5 Instruct: <|im_end|>, <|endoftext|>); a turn ended by any of them is complete, and
    what a model writes after it is never trained on."""
    ids: list[int] = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's own config
    listed = getattr(getattr(base, "generation_config", None), "eos_token_id", None)
    for token in [listed] if isinstance(listed, int) else list(listed or []):
        if int(token) not in ids:
            ids.append(int(token))
    return tuple(ids)


@dataclass(frozen=True)
class Generated:
    """tokens: (B, T) sampled ids (pad after a row's stop token); logprobs: (B, T) float32 log-probability of each
    token under the sampling distribution (softmax(logits / temperature); temperature 1 for greedy decoding)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: GenerationParams,
    row_seeds: list[int],
    all_finished: Callable[[bool], bool] | None = None,
) -> torch.Tensor:
    """The sampled tokens of `sample` (B, T): for callers that need no logprobs."""
    return sample(model, prompt_ids, prompt_mask, params, row_seeds, all_finished).tokens


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: GenerationParams,
    row_seeds: list[int],
    all_finished: Callable[[bool], bool] | None = None,
) -> Generated:
    """Sample up to `max_new_tokens` per row; rows that emitted the stop token continue with pad (logprob 0).

    prompt_ids, prompt_mask: (B, P), left-padded. T <= max_new_tokens (the loop ends early once every row has
    stopped). With sharded weights every forward pass is a collective, so processes must run the same number of
    steps: `all_finished(local_done)` then says whether every process is done. Rows holding the same prompt (the k
    samples of one prompt) share one prefill: it runs once per distinct prompt and its KV cache is repeated.
    The logprob of each sampled token comes from the logits that drew it, at no extra forward pass.

    Rows that stopped leave the forward pass (`_FINISHED_SHARE_TO_DROP`): their cache rows, mask and positions are
    dropped, so a completion that stopped early costs nothing more. Not with sharded weights (`all_finished`),
    where every process must keep running the same passes, even with none of its rows left.
    """
    keys = torch.tensor([int(seed) for seed in row_seeds], dtype=torch.long, device=prompt_ids.device)
    attention_mask = prompt_mask.long()
    capacity = prompt_ids.shape[1] + params.max_new_tokens
    past, logits, written_in_place, next_position = prefill(model, prompt_ids, attention_mask, capacity)
    start = DecodeStart(past, logits, attention_mask, next_position, capacity if written_in_place else None)
    seen = seen_tokens(prompt_ids, prompt_mask, logits.shape[-1], params.filters)
    return decode(model, start, params, keys, seen, all_finished)


@dataclass
class DecodeStart:
    """The decode loop's state after a prefill: the cache, the logits (B, V) that draw the first token, the
    attention mask over the cache's positions (B, L), each row's next position (B, 1), and the capacity of a cache
    written in place (None for one that transformers grows)."""

    past: object
    logits: torch.Tensor
    attention_mask: torch.Tensor
    next_position: torch.Tensor
    capacity: int | None


# leaving(batch rows, their rows in the cache, cache, attention mask): called for rows about to leave the forward
# pass and, at the end, for those still in it; the cache and mask then hold every token the rows were fed.
Leaving = Callable[[torch.Tensor, torch.Tensor, object, torch.Tensor], None]


def decode(model, start: DecodeStart, params: GenerationParams, keys: torch.Tensor, seen: torch.Tensor | None,
           all_finished: Callable[[bool], bool] | None = None, leaving: Leaving | None = None) -> Generated:
    """The token steps of `sample` from a prefilled `start` (see there); `leaving` sees each row's cache before it
    is dropped (rollout/kept_cache.py keeps an episode's cache across its turns with it)."""
    past, logits, attention_mask, next_position = start.past, start.logits, start.attention_mask, start.next_position
    batch = logits.shape[0]
    finished = torch.zeros(batch, dtype=torch.bool, device=logits.device)
    running = torch.arange(batch, device=logits.device)  # the batch rows still in the forward pass, in order
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    for step in range(params.max_new_tokens):
        token, logprob = _draw(logits, params, keys, running, step, seen, finished)
        tokens.append(token)
        logprobs.append(logprob)
        if params.stop_token_ids:
            finished |= is_stop_token(token, params.stop_token_ids)
        done = bool(finished.all())
        if all_finished is not None:
            done = all_finished(done)
        if done or step == params.max_new_tokens - 1:
            break
        stopped = finished[running]
        if all_finished is None and int(stopped.sum()) >= _FINISHED_SHARE_TO_DROP * running.shape[0]:
            if leaving is not None:
                leaving(running[stopped], stopped.nonzero().squeeze(1), past, attention_mask)
            kept = (~stopped).nonzero().squeeze(1)
            running, attention_mask, next_position = running[kept], attention_mask[kept], next_position[kept]
            _keep_rows(past, kept, start.capacity)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(running.shape[0], 1)], dim=1)
        out = model(
            input_ids=token[running].unsqueeze(1),
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1, :]
        next_position = next_position + 1
    if leaving is not None:
        leaving(running, torch.arange(running.shape[0], device=running.device), past, attention_mask)
    return Generated(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1))


def prefill(model, prompt_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int):
    """The prompts' forward pass, once per distinct prompt, its KV cache repeated for the rows sharing it (in place
    when the cache allows, holding `capacity` positions). Returns (cache, last logits (B, V), whether the cache was
    written in place, each row's next position (B, 1))."""
    positions = position_ids_from_mask(attention_mask)
    distinct, copies = distinct_rows(prompt_ids, attention_mask)
    out = model(
        input_ids=prompt_ids[distinct], attention_mask=attention_mask[distinct], position_ids=positions[distinct],
        use_cache=True, logits_to_keep=last_positions(prompt_ids.shape[1], 1, prompt_ids.device),
    )
    past, logits = out.past_key_values, out.logits[copies, -1, :]
    written_in_place = _write_in_place(past, copies, capacity)
    if not written_in_place and distinct.shape[0] < prompt_ids.shape[0]:
        past.reorder_cache(copies)  # each row gets its prompt's cache (index_select repeats rows)
    return past, logits, written_in_place, positions[:, -1:] + 1


def _draw(logits, params: GenerationParams, keys, running, step: int, seen, finished):
    """One token per batch row and its logprob: drawn for the `running` rows from their logits, pad (logprob 0)
    for rows that left the forward pass or had stopped."""
    if params.temperature == 0:  # greedy (evaluation); training always samples
        drawn, drawn_logprob = greedy_with_logprobs(logits)
    else:
        drawn, drawn_logprob = sample_with_logprobs(logits, params.temperature, keys[running], step,
                                                    params.filters, seen[running] if seen is not None else None)
    if seen is not None:
        seen[running, drawn] = True
    batch = finished.shape[0]
    token = torch.full((batch,), params.pad_token_id, dtype=drawn.dtype, device=drawn.device)
    logprob = torch.zeros(batch, dtype=drawn_logprob.dtype, device=drawn_logprob.device)
    token[running], logprob[running] = drawn, drawn_logprob
    token = torch.where(finished, torch.full_like(token, params.pad_token_id), token)
    logprob = torch.where(finished, torch.zeros_like(logprob), logprob)
    return token, logprob


def seen_tokens(prompt_ids, prompt_mask, vocab: int, filters: SamplingFilters | None) -> torch.Tensor | None:
    """(B, V) bool: the tokens of each row's prompt, which the repetition penalty applies to (as transformers
    does) and to which each drawn token is added; None when there is no penalty."""
    if filters is None or filters.repetition_penalty == 1.0:
        return None
    seen = torch.zeros(prompt_ids.shape[0], vocab + 1, dtype=torch.bool, device=prompt_ids.device)
    seen.scatter_(1, torch.where(prompt_mask.bool(), prompt_ids, vocab), True)  # padding lands in the extra column
    return seen[:, :vocab].contiguous()


# Rows that stopped leave the decode's forward pass once they are this share of it: dropping them copies the
# kept rows' cache (a fraction of one step's time), so it waits until enough rows have stopped to pay for it.
_FINISHED_SHARE_TO_DROP = 1 / 8


def _keep_rows(cache, kept: torch.Tensor, capacity: int | None) -> None:
    """Keep only rows `kept` of the decode cache, in that order; `capacity` is that of a cache written in place
    (None for one that transformers grows)."""
    if capacity is None:
        cache.reorder_cache(kept)  # index_select on every layer's keys and values
        return
    for layer in cache.layers:
        _buffer_rows(layer, kept, capacity)


def _write_in_place(cache, copies: torch.Tensor, capacity: int) -> bool:
    """Give each layer of a plain key/value cache buffers for `capacity` positions, filled with row i's prompt
    `copies[i]`, that later steps write into. Returns False, changing nothing, for other caches (sliding-window,
    hybrid or quantised layers keep more state), which then grow as transformers grows them.

    A growing cache copies every layer's keys and values into a new, one-longer tensor at every token step: for
    the bench's 25M model, 64 rows of 64 tokens, that is about 2 GB of copies per completion batch. The layers'
    `keys` and `values` stay views of the filled positions, so attention reads exactly the values it read before.
    """
    if not plain_key_value_cache(cache) or not all(layer.is_initialized for layer in cache.layers):
        return False
    for layer in cache.layers:
        _buffer_rows(layer, copies, capacity)
    return True


def _buffer_rows(layer, rows: torch.Tensor, capacity: int) -> None:
    """Give `layer` new key and value buffers for `capacity` positions holding its filled positions of `rows`, in
    that order, and make its later updates write into them."""
    filled = layer.keys.shape[-2]
    buffers = []
    for stored in (layer.keys, layer.values):
        _, heads, _, width = stored.shape
        buffer = stored.new_empty(rows.shape[0], heads, capacity, width)
        buffer[:, :, :filled] = stored[rows]
        buffers.append(buffer)
    write_into(layer, buffers[0], buffers[1], filled)


def write_into(layer, key_buffer: torch.Tensor, value_buffer: torch.Tensor, filled: int) -> None:
    """Make `layer`'s keys and values the first `filled` positions of the buffers (B, heads, capacity, width), and
    its later updates write the next positions into them."""
    layer.keys, layer.values = key_buffer[:, :, :filled], value_buffer[:, :, :filled]
    layer.update = functools.partial(_write_next, layer, key_buffer, value_buffer)


def _write_next(layer, key_buffer, value_buffer, key_states, value_states, *args, **kwargs):
    start, end = layer.keys.shape[-2], layer.keys.shape[-2] + key_states.shape[-2]
    key_buffer[:, :, start:end] = key_states
    value_buffer[:, :, start:end] = value_states
    layer.keys, layer.values = key_buffer[:, :, :end], value_buffer[:, :, :end]
    return layer.keys, layer.values
