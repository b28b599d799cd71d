"""Passes over prompt + response: logprobs of policy or reference (no-grad in the rollout, with gradient in the
update), and sequence-classifier scores.

The helpers that lay out such a pass (positions that skip left padding, `logits_to_keep` as indices, the rows
holding the same prompt, whether a KV cache is plain keys and values) live here too; the sampler
(rollout/generation.py) lays out its prefill with the same ones.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from training_wizard.core.logprobs import TokenLogprobs, head_logprobs, logprobs_and_entropy, selective_logprobs
from training_wizard.core.micro_batches import token_budget_chunks
from training_wizard.rollout.packing import (
    completion_prefix, last_token_positions, pack_rows, packed_forward, score_layer, unpack,
)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. (B, L) -> (B, L) long."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_positions(end: int, count: int, device) -> torch.Tensor:
    """`logits_to_keep` for the `count` positions before `end`, as position indices rather than a count.

    Given a count, transformers slices the hidden states, and the vocabulary projection of that strided slice
    falls back to a batched matmul over a copy of the whole output matrix per row: measured on CPU with a
    49,152-token vocabulary, 64 rows x 33 positions took 5.5 s in bfloat16 (1.8 s in float32) against 0.39 s
    (1.3 s) from the contiguous gather that indices give.
    """
    return torch.arange(end - count, end, device=device)


def response_logits(model: torch.nn.Module, prompt_ids, prompt_mask, responses) -> torch.Tensor:
    """Training-style forward pass; returns the logits that predict each response token. -> (B, T, V).

    The attention mask covers the prompt's real tokens and every response position, exactly as during
    generation, so positions and attention match the sampling pass (tokens after the stop token are masked
    out of every loss and never influence earlier positions).
    """
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask.long(), torch.ones_like(responses)], dim=1)
    width, length = responses.shape[1], ids.shape[1]
    return model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
        logits_to_keep=last_positions(length - 1, width, ids.device),  # the T positions predicting the response
        use_cache=False,  # one pass, no decoding after it (and no warning under activation checkpointing)
    ).logits


# Model types whose causal-LM forward is the output layer alone on the final hidden states (no soft-capping or
# scaling of the logits after it), so `head_logprobs` may take that layer's place.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def plain_output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """`model`'s output layer (through a data-parallel wrapper) when its logits are that layer's output alone and
    it is a plain `torch.nn.Linear` running its own forward (not an adapter layer, no hook in its place or on it);
    else None."""
    inner = getattr(model, "module", model)
    if getattr(getattr(inner, "config", None), "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    head = inner.get_output_embeddings()
    if type(head) is not torch.nn.Linear or "forward" in vars(head) or _has_hooks(head):
        return None  # an adapter layer, a forward already replaced (accelerate's offloading hooks do that), or hooks
    return head                   # that would see the hidden states in place of the logits


def _has_hooks(module: torch.nn.Module) -> bool:
    from torch.nn.modules import module as module_globals

    own = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    shared = (module_globals._global_forward_hooks, module_globals._global_forward_pre_hooks,
              module_globals._global_backward_hooks, module_globals._global_backward_pre_hooks)
    return any(map(len, own + shared))


class _SkippedOutputLayer:
    """The identity in the output layer's place, noting the autocast state the model's forward ran it under.

    accelerate's mixed precision autocasts inside the prepared model's forward only, and hands its outputs back
    in float32; `head_logprobs` must then apply the output layer under that same autocast (products in bf16, as
    the layer's own forward would have made them)."""

    def __init__(self):
        self.autocast: tuple[str, torch.dtype] | None = None  # (device type, dtype) when autocast was on

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        kind = hidden.device.type
        self.autocast = (kind, torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else None
        return hidden

    def same_precision(self):
        """A context with the autocast state the skipped layer would have run under."""
        if self.autocast is None:
            return contextlib.nullcontext()
        kind, dtype = self.autocast
        return torch.autocast(kind, dtype=dtype)


@contextlib.contextmanager
def _output_layer_skipped(head: torch.nn.Linear | None):
    """Within the context the model's `.logits` are the final hidden states of the same positions (the output
    layer's forward is shadowed by the identity; its parameters are untouched). Yields the `_SkippedOutputLayer`
    (None without a head)."""
    if head is None:
        yield None
        return
    if "forward" in vars(head):  # nested, or replaced since `plain_output_head` looked: the restore would undo it
        raise RuntimeError("the output layer's forward is already replaced; its logits cannot be skipped")
    head.forward = skipped = _SkippedOutputLayer()
    try:
        yield skipped
    finally:
        del head.forward  # the class's forward again


def response_token_logprobs(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, temperature: float, *, share_prompts: bool,
    from_hidden_states: bool, prompt_model: torch.nn.Module | None = None, packed_by: torch.Tensor | None = None,
) -> TokenLogprobs:
    """Logprobs and entropy of each response token under `model`: `shared_prompt_logits` (with `share_prompts`)
    or `response_logits`, then `logprobs_and_entropy`. With `from_hidden_states`, and a model whose output layer
    is plain (`plain_output_head`), the forward pass stops at the final hidden states and `head_logprobs` applies
    the output layer a chunk at a time, so no (B, T, V) logits are ever held. Callers pass False for both flags
    where the model is sharded or compiled (trainers/loop/setup.py): a sharded output layer holds its weight only
    inside the model's forward, and the number of passes must not depend on the data. `packed_by`: the (B, T)
    completion mask of a padding-free pass (`packed_token_logprobs`, which shares no prompts).
    """
    head = plain_output_head(model) if from_hidden_states else None
    if packed_by is not None:
        return packed_token_logprobs(model, prompt_ids, prompt_mask, responses, packed_by, temperature, head)
    out, skipped = _final_output(model, prompt_ids, prompt_mask, responses, share_prompts, head, prompt_model)
    if head is None:
        return logprobs_and_entropy(out, responses, temperature)
    with skipped.same_precision():
        return head_logprobs(out, head, responses, temperature)


def _final_output(model, prompt_ids, prompt_mask, responses, share_prompts: bool, head, prompt_model=None):
    """(the logits that predict the responses, None), or with `head` (the output layer) (the final hidden states
    there, the `_SkippedOutputLayer` that stood in for it)."""
    with _output_layer_skipped(head) as skipped:
        if share_prompts:
            output = shared_prompt_logits(model, prompt_ids, prompt_mask, responses, prompt_model=prompt_model)
        else:
            output = response_logits(model, prompt_ids, prompt_mask, responses)
    return output, skipped


def packed_token_logprobs(model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask,
                          temperature: float, head: torch.nn.Linear | None) -> TokenLogprobs:
    """`response_token_logprobs` of one padding-free packed pass (rollout/packing.py): each row's real prompt tokens
    and its completion up to its last real token, as one sequence. The output (logits, or with `head` the final
    hidden states) is kept only at the positions predicting a packed completion token, and those go through the
    same chunked output layer as one token per row. -> (B, T), 0 at every position not packed."""
    packed = pack_rows(prompt_ids, prompt_mask, responses, completion_prefix(response_mask))
    with _output_layer_skipped(head) as skipped:
        output = packed_forward(model, packed, logits_to_keep=packed.predictors).logits[0].unsqueeze(1)  # (M, 1, *)
    tokens = packed.tokens.unsqueeze(1)  # (M, 1)
    if head is None:
        token = logprobs_and_entropy(output, tokens, temperature)
    else:
        with skipped.same_precision():
            token = head_logprobs(output, head, tokens, temperature)
    return TokenLogprobs(unpack(token.logprobs[:, 0], packed.kept), unpack(token.entropy[:, 0], packed.kept))


def content_columns(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[int, int]:
    """(first prompt column holding a real token in any row, response columns up to the last real token of any
    row). Columns outside are padding in every row: attention masks them out, so cutting them changes nothing but
    the work. At least one response column is kept."""
    real_prompt = prompt_mask.any(0).nonzero()
    start = int(real_prompt[0]) if real_prompt.numel() else 0
    real_response = response_mask.any(0).nonzero()
    end = int(real_response[-1]) + 1 if real_response.numel() else 1
    return start, end


def distinct_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices of the first row of each distinct prompt, for every row the position of its prompt among them).

    Two rows are the same prompt when their ids and mask are equal. Order of first appearance is kept, so a batch
    without repeats gives (arange(B), arange(B)) and runs exactly as before.
    """
    rows = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    batch = rows.shape[0]
    first = torch.full((int(inverse.max()) + 1,), batch, dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, inverse, torch.arange(batch, device=rows.device), reduce="amin")
    order = torch.argsort(first)  # distinct prompts in order of first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=rows.device)
    return first[order], rank[inverse]


def plain_key_value_cache(cache) -> bool:
    """Whether every layer of a transformers cache holds only keys and values (`DynamicLayer`): sliding-window,
    hybrid and quantised layers keep more state, which code that sets `keys` and `values` itself would bypass."""
    from transformers.cache_utils import DynamicLayer

    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def shared_prompt_logits(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, prompt_model: torch.nn.Module | None = None
) -> torch.Tensor:
    """`response_logits` with each distinct prompt run once: rows holding the same prompt (the k samples of one
    prompt) share one pass over it, whose KV cache is repeated for them, and only the responses run per row.

    The shared pass covers every prompt column but the last (which holds a real token in every left-padded row);
    the per-row pass runs that last prompt token and the responses but their last token, so it returns the T
    logits that predict the responses, as one tensor (joining two pieces would hold a second (B, T, V) copy).
    Same logits as `response_logits` up to float rounding (the matrix products have other shapes); a batch
    without repeated prompts runs `response_logits` itself. With gradient enabled the prompt pass's gradient is
    the sum over the rows that share it, as in the per-row pass. `prompt_model` runs the prompt pass when given
    (the update: the module without its data-parallel wrapper, so the wrapper sees one forward pass per
    backward; the parameters and their gradients are the same). Works under activation checkpointing (see
    `_checkpointed_layers_keep_cache`). Models whose cache is not plain keys and values per layer (sliding
    windows, hybrid layers) run `response_logits`.
    """
    distinct, copies = distinct_rows(prompt_ids, prompt_mask)
    (batch, width), prompt_width = responses.shape, prompt_ids.shape[1]
    if distinct.shape[0] == batch or prompt_width < 2:
        return response_logits(model, prompt_ids, prompt_mask, responses)
    prompt_model = prompt_model or model
    from transformers import DynamicCache

    prompt_cache = DynamicCache(config=prompt_model.config)
    if not plain_key_value_cache(prompt_cache):  # the cache layers set below would bypass their extra state
        return response_logits(model, prompt_ids, prompt_mask, responses)
    mask = prompt_mask.long()
    positions = position_ids_from_mask(mask)
    with _checkpointed_layers_keep_cache(prompt_model):
        _each_layer(prompt_cache, _stored_once)
        prompt_model(
            input_ids=prompt_ids[distinct, :-1], attention_mask=mask[distinct, :-1],
            position_ids=positions[distinct, :-1], past_key_values=prompt_cache,
            use_cache=False,  # the layers fill the cache given; nothing else to make
            logits_to_keep=last_positions(prompt_width - 1, 1, prompt_ids.device),  # unused: the least it allows
        )
        # Each row's copy of its prompt's keys and values (the backward sums the rows' gradients into them),
        # in a cache of its own: the prompt pass's replay in the backward writes to `prompt_cache` again.
        row_cache = _each_layer(DynamicCache(config=prompt_model.config), _read_only)
        for prompt_layer, row_layer in zip(prompt_cache.layers, row_cache.layers):
            row_layer.lazy_initialization(prompt_layer.keys, prompt_layer.values)
            row_layer.keys, row_layer.values = prompt_layer.keys[copies], prompt_layer.values[copies]
        return model(
            input_ids=torch.cat([prompt_ids[:, -1:], responses[:, :-1]], dim=1),
            attention_mask=torch.cat([mask, mask.new_ones(batch, width - 1)], dim=1),
            position_ids=positions[:, -1:] + torch.arange(width, device=positions.device),
            past_key_values=row_cache, use_cache=False,
        ).logits


# Activation checkpointing runs each layer's forward again in the backward. transformers drops the KV cache inside
# checkpointed layers unless a layer declares it only reads it (`_can_checkpoint_with_cache`), because a second
# run would append to the cache again. The shared prompt pass makes that safe: its cache layers store the prompt's
# keys and values instead of appending them (the replay stores the same values again), and the responses' pass
# reads them joined with its own without storing anything.
def _stored_once(layer, key_states, value_states, *args, **kwargs):
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
    layer.keys, layer.values = key_states, value_states
    return key_states, value_states


def _read_only(layer, key_states, value_states, *args, **kwargs):
    return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


def _each_layer(cache, update):
    for layer in cache.layers:
        layer.update = functools.partial(update, layer)
    return cache


@contextlib.contextmanager
def _checkpointed_layers_keep_cache(model: torch.nn.Module):
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True
              and hasattr(type(m), "_can_checkpoint_with_cache")]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # the class's value again


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask, temperature: float, batch_size: int,
    share_prompts: bool = True, from_hidden_states: bool = True, max_tokens: int | None = None,
    padding_free: bool = False,
) -> torch.Tensor:
    """Per-token logprobs of the responses under `model`, `batch_size` rows at a time, each chunk cut to its
    content (`content_columns`). -> (B, T) float32, 0 after every row's last real token of the chunk.
    `max_tokens` (max_tokens_per_micro_batch): chunks of rows of similar length holding at most that many tokens
    each (`core.micro_batches.token_budget_chunks`) instead of `batch_size` rows.

    With `share_prompts` the rows of one prompt go into the same chunk and share one pass over their prompt
    (`shared_prompt_logits`): with k samples per prompt the prompt tokens cost 1/k of a pass. Callers whose
    model is sharded pass False: there every forward pass is a collective, and the number of passes would then
    depend on the data each process holds. `from_hidden_states`: see `response_token_logprobs`. `padding_free`:
    each chunk is one packed pass (`packed_token_logprobs`; 0 after each row's last real token).
    """
    out = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
    head = plain_output_head(model) if from_hidden_states else None
    # rows grouped by prompt (stable: without repeats, or without sharing, the order stays as it is)
    order = torch.argsort(distinct_rows(prompt_ids, prompt_mask)[1], stable=True) if share_prompts else None
    for part in forward_chunks(prompt_mask, response_mask, batch_size, max_tokens, order, padded=not padding_free):
        first, end = content_columns(prompt_mask[part], response_mask[part])
        ids, kept = responses[part, :end], slice(first, None)
        if padding_free:
            out[part, :end] = packed_token_logprobs(model, prompt_ids[part, kept], prompt_mask[part, kept], ids,
                                                    response_mask[part, :end], temperature, head).logprobs
            continue
        output, skipped = _final_output(model, prompt_ids[part, kept], prompt_mask[part, kept], ids, share_prompts,
                                        head)
        if head is None:
            out[part, :end] = selective_logprobs(output, ids, temperature)
        else:  # final hidden states
            with skipped.same_precision():
                out[part, :end] = head_logprobs(output, head, ids, temperature).logprobs
        del output
    return out


def forward_chunks(prompt_mask, response_mask, batch_size: int, max_tokens: int | None = None, order=None,
                   padded: bool = True) -> list:
    """The rows of each chunk of a no-grad pass: `batch_size` rows at a time (in `order` when given, else as
    slices), or with `max_tokens` rows of similar length up to that many tokens a chunk (order unused; `padded`
    False counts a packed chunk's real tokens, see `core/micro_batches.py`)."""
    if max_tokens is not None:
        return token_budget_chunks(prompt_mask, response_mask, max_tokens, padded=padded)
    starts = range(0, prompt_mask.shape[0], batch_size)
    if order is not None:
        return [order[start : start + batch_size] for start in starts]
    return [slice(start, start + batch_size) for start in starts]


@torch.no_grad()
def classifier_scores(
    model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask, pad_token_id: int, batch_size: int,
    max_tokens: int | None = None, padding_free: bool = False,
) -> torch.Tensor:
    """Scores of a sequence classifier that shares the policy's tokenizer, read at the last real token. -> (B,).
    `max_tokens`: chunks by tokens (`forward_chunks`), each cut to its content (`content_columns`);
    `padding_free`: each chunk is one packed pass (`packed_classifier_scores`)."""
    if max_tokens is not None:
        scores = torch.zeros(responses.shape[0], dtype=torch.float32, device=responses.device)
        for part in forward_chunks(prompt_mask, response_mask, batch_size, max_tokens, padded=not padding_free):
            first, end = content_columns(prompt_mask[part], response_mask[part])
            scores[part] = classifier_scores(model, prompt_ids[part, first:], prompt_mask[part, first:],
                                             responses[part, :end], response_mask[part, :end], pad_token_id, len(part),
                                             padding_free=padding_free)
        return scores
    if padding_free:
        return torch.cat([packed_classifier_scores(model, prompt_ids[part], prompt_mask[part], responses[part],
                                                   response_mask[part], pad_token_id)
                          for part in torch.arange(responses.shape[0], device=responses.device).split(batch_size)])
    ids = torch.cat([prompt_ids, torch.where(response_mask, responses, torch.full_like(responses, pad_token_id))], 1)
    mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    scores = []
    for start in range(0, ids.shape[0], batch_size):
        part = slice(start, start + batch_size)
        logits = model(input_ids=ids[part], attention_mask=mask[part], position_ids=position_ids_from_mask(mask[part])).logits
        scores.append(logits[:, 0].float())
    return torch.cat(scores)


def packed_classifier_scores(model: torch.nn.Module, prompt_ids, prompt_mask, responses, response_mask,
                             pad_token_id: int) -> torch.Tensor:
    """`classifier_scores` of one padding-free packed pass: the real tokens of each row as one sequence, the
    classifier's `score` layer applied to the final hidden state where it would pool the row
    (`packing.last_token_positions`, with the model's own padding id). -> (B,) float32."""
    responses = torch.where(response_mask, responses, torch.full_like(responses, pad_token_id))
    packed = pack_rows(prompt_ids, prompt_mask, responses, response_mask)
    hidden = packed_forward(model, packed, output_hidden_states=True).hidden_states[-1][0]  # (N, H)
    config = getattr(model, "module", model).config
    pooled = last_token_positions(packed, config.get_text_config().pad_token_id)
    return score_layer(model)(hidden[pooled])[:, 0].float()
