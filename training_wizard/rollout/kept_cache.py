"""An episode's KV cache kept across its turns by the built-in decode loop (`[environment] keep_kv_cache`).

Without it every turn of an episode is a fresh `sample` over the prompt and every earlier turn, so a turn re-reads
the whole context. With it, when a row leaves the decode loop its keys and values (every real position: the
context and the tokens it was fed) are copied out of the batch's cache into `KeptCaches`, with the token ids they
belong to. At the row's next turn its new context is compared with those ids: the cached part of their common
prefix is copied into the turn's cache and only the rest, the reply's last token (drawn, never fed) and the
environment's answer, runs through the model in one prefill. The keys and values of a position depend only on the
tokens up to it and its position id, so the common prefix is exactly what a re-encoding would compute, up to float
rounding: the matmuls have other shapes (one prefill of everything against a prefill per turn and one token per
step), so logits differ by a few float32 ulps. Tokens are drawn with the same keyed uniforms (row key, token
step), hence the same tokens unless a uniform falls within that rounding of a token's boundary.

A turn's rows are laid out as [gap][kept prefix][gap][new tokens]: the gaps are masked out (zeros in the cache,
0 in the attention mask, so they add exact zeros to attention), and position ids count real tokens only, as the
decode loop's left padding already does. Rows finish at different turns and the chunks of rows
(local_rollout_forward_batch_size) change from turn to turn; each row's cache is its own, so any rows form a chunk.
A cache that is not plain keys and values (sliding-window, hybrid or quantised layers) cannot be copied this way:
its episodes re-encode each turn, as without the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from training_wizard.rollout.generation import (
    DecodeStart, GenerationParams, Generated, decode, prefill, seen_tokens, write_into,
)
from training_wizard.rollout.scoring import last_positions


@dataclass
class KeptRow:
    """One row's cache: kv (layers, 2, heads, L, head width), the keys and values of `tokens` (L ids)."""

    kv: torch.Tensor
    tokens: list[int]


@dataclass
class KeptCaches:
    """The kept caches of one set of episodes, by episode index; `plain` turns False once the model's cache is not
    plain keys and values (then nothing is kept)."""

    rows: dict[int, KeptRow] = field(default_factory=dict)
    plain: bool = True

    def keep_only(self, episodes: list[int]) -> None:
        """Forget the caches of the episodes not in `episodes` (those that ended)."""
        for episode in set(self.rows) - set(episodes):
            del self.rows[episode]


@torch.no_grad()
def sample_keeping_cache(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: GenerationParams,
                         row_seeds: list[int], kept: KeptCaches, episodes: list[int]) -> Generated:
    """`rollout.generation.sample` for one chunk of episode turns: row i is episode `episodes[i]`, its whole context
    left-padded in prompt_ids/prompt_mask; its kept cache, if any, replaces the re-encoding of the common prefix,
    and its cache after the turn is kept for the next."""
    keys = torch.tensor([int(seed) for seed in row_seeds], dtype=torch.long, device=prompt_ids.device)
    contexts = [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask)]
    entries = [kept.rows.pop(episode, None) for episode in episodes]
    prefixes = [_common_prefix(entry.tokens, context) if entry is not None else 0
                for entry, context in zip(entries, contexts)]
    if not kept.plain or max(prefixes) == 0:  # a first turn: the prompts' prefill, shared by rows holding one prompt
        attention_mask = prompt_mask.long()
        capacity = prompt_ids.shape[1] + params.max_new_tokens
        past, logits, written_in_place, next_position = prefill(model, prompt_ids, attention_mask, capacity)
        start = DecodeStart(past, logits, attention_mask, next_position, capacity if written_in_place else None)
        kept.plain = kept.plain and written_in_place
    else:
        start = _continued(model, entries, prefixes, contexts, params, prompt_ids.device)
    seen = seen_tokens(prompt_ids, prompt_mask, start.logits.shape[-1], params.filters)
    if not kept.plain:
        return decode(model, start, params, keys, seen)
    fed: dict[int, torch.Tensor] = {}

    def leaving(rows: torch.Tensor, in_cache: torch.Tensor, past, attention_mask: torch.Tensor) -> None:
        for row, index in zip(rows.tolist(), in_cache.tolist()):
            real = attention_mask[index].nonzero().squeeze(1)
            fed[row] = torch.stack([torch.stack([layer.keys[index][:, real], layer.values[index][:, real]])
                                    for layer in past.layers])

    generated = decode(model, start, params, keys, seen, leaving=leaving)
    for row, kv in fed.items():
        tokens = contexts[row] + generated.tokens[row, : kv.shape[-2] - len(contexts[row])].tolist()
        kept.rows[episodes[row]] = KeptRow(kv, tokens)
    return generated


def _common_prefix(cached: list[int], context: list[int]) -> int:
    """How many leading ids `cached` and `context` share, leaving at least the context's last id to run (its logits
    draw the turn's first token)."""
    limit = min(len(cached), len(context) - 1)
    for position in range(limit):
        if cached[position] != context[position]:
            return position
    return limit


def _continued(model, entries: list[KeptRow | None], prefixes: list[int], contexts: list[list[int]],
               params: GenerationParams, device) -> DecodeStart:
    """The turn's cache from the kept prefixes, and one prefill of each row's remaining context into it."""
    rows, kept_width = len(contexts), max(prefixes)
    new = [context[prefix:] for context, prefix in zip(contexts, prefixes)]
    new_width = max(len(ids) for ids in new)
    capacity = kept_width + new_width + params.max_new_tokens
    layers, _, heads, _, width = next(entry.kv.shape for entry in entries if entry is not None)
    template = next(entry.kv for entry in entries if entry is not None)
    # zeros, not empty memory: a masked position still multiplies its value by an attention weight of 0
    buffer = template.new_zeros(layers, 2, rows, heads, capacity, width)
    attention_mask = torch.zeros(rows, kept_width + new_width, dtype=torch.long, device=device)
    input_ids = torch.full((rows, new_width), params.pad_token_id, dtype=torch.long, device=device)
    position_ids = torch.zeros(rows, new_width, dtype=torch.long, device=device)
    for row, (entry, prefix, ids) in enumerate(zip(entries, prefixes, new)):
        if prefix:
            buffer[:, :, row, :, kept_width - prefix : kept_width] = entry.kv[:, :, :, :prefix]
        attention_mask[row, kept_width - prefix : kept_width] = 1
        attention_mask[row, kept_width + new_width - len(ids):] = 1
        input_ids[row, new_width - len(ids):] = torch.tensor(ids, dtype=torch.long, device=device)
        position_ids[row, new_width - len(ids):] = torch.arange(prefix, prefix + len(ids), device=device)
    from transformers import DynamicCache

    empty = buffer[:, :, :, :, :0]
    cache = DynamicCache(ddp_cache_data=[(empty[layer, 0], empty[layer, 1]) for layer in range(layers)])
    for index, layer in enumerate(cache.layers):
        write_into(layer, buffer[index, 0], buffer[index, 1], kept_width)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache,
                use_cache=True, logits_to_keep=last_positions(new_width, 1, device))
    next_position = torch.tensor([[len(context)] for context in contexts], dtype=torch.long, device=device)
    return DecodeStart(out.past_key_values, out.logits[:, -1, :], attention_mask, next_position, capacity)
