"""Padding-free packed forwards (`padding_free`): the rows of a pass concatenated into one sequence of batch 1.

Each row keeps its real prompt tokens (no left padding) and its completion up to the last real token; position ids
restart at 0 at every row. Given such position ids, batch size 1 and no attention mask, transformers builds a
causal mask per packed row itself (transformers/masking_utils.py: `find_packed_sequence_indices` starts a row
wherever a position id does not follow the one before; flash-attention's variable-length path reads the same
position ids), so every token attends exactly the tokens of its own row that the padded pass lets it attend.
What a pass computes per token is read back at the positions that predict the completion tokens, and laid out
again as the (B, T) tensors the loop uses, 0 where no token was packed (TRL's `padding_free`, veRL's
`use_remove_padding`, OpenRLHF's `--ds.packing_samples`, NeMo-RL's `sequence_packing`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Model types whose attention masks come from transformers' mask builders, which read packed position ids (checked
# against the padded pass in tests/unit/test_padding_free.py), and the attention implementations that honour them.
PACKABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
PACKABLE_ATTENTION = frozenset({"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"})


@dataclass(frozen=True)
class PackedRows:
    """B rows as one sequence of N tokens. input_ids, position_ids: (1, N) long; rows: (N,) each token's row;
    kept: (B, T) bool, the completion positions packed (in row-major order); predictors: (M,) the packed index of
    the position predicting each kept completion token (M = kept.sum()); tokens: (M,) those tokens."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    kept: torch.Tensor
    predictors: torch.Tensor
    tokens: torch.Tensor


def completion_prefix(completion_mask: torch.Tensor) -> torch.Tensor:
    """Every completion position up to each row's last real token: (B, T) bool -> (B, T) bool.

    The padded passes attend every completion position, so a row packed this far gives its real tokens the same
    context (tokens outside the loss mask inside an episode, the environment's, included)."""
    columns = torch.arange(1, completion_mask.shape[1] + 1, device=completion_mask.device)
    lengths = torch.where(completion_mask.bool(), columns, 0).amax(1, keepdim=True)  # (B, 1)
    return columns.sub(1) < lengths


def pack_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor,
              kept: torch.Tensor) -> PackedRows:
    """Rows (B, P) prompts with their mask, (B, T) completions, of which the `kept` (B, T) positions are packed,
    as one `PackedRows`. Positions count a row's packed tokens from 0, as `scoring.position_ids_from_mask` counts
    the padded row's real ones. Every row needs a real prompt token (it predicts the first completion token)."""
    if not bool(prompt_mask.bool().any(1).all()):
        raise ValueError("padding-free packing needs at least one real prompt token in every row")
    width = prompt_ids.shape[1]
    packed = torch.cat([prompt_mask.bool(), kept.bool()], dim=1)  # (B, P + T)
    ids = torch.cat([prompt_ids, completions], dim=1)
    count = int(packed.sum())
    index = torch.full(packed.shape, -1, dtype=torch.long, device=ids.device)
    index[packed] = torch.arange(count, device=ids.device)  # each packed token's place in the sequence
    rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1).expand_as(packed)[packed]
    return PackedRows(
        input_ids=ids[packed].unsqueeze(0), position_ids=(packed.long().cumsum(1) - 1)[packed].unsqueeze(0),
        rows=rows, kept=kept.bool(), predictors=index[:, width:][kept.bool()] - 1, tokens=completions[kept.bool()],
    )


def unpack(values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """(M,) values of the kept completion positions -> (B, T), 0 elsewhere (with gradient through `values`)."""
    return values.new_zeros(kept.shape).masked_scatter(kept, values)


def packed_forward(model: torch.nn.Module, packed: PackedRows, **kwargs):
    """`model`'s forward over the packed sequence: no attention mask, so the position ids delimit the rows."""
    return model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, **kwargs)


def last_token_positions(packed: PackedRows, pad_token_id: int | None) -> torch.Tensor:
    """(B,) the packed index where a sequence classifier pools each row: its last token that is not
    `pad_token_id` (as transformers' sequence classifiers choose in a padded batch), else its last token."""
    index = torch.arange(packed.rows.shape[0], device=packed.rows.device)
    batch = packed.kept.shape[0]
    last = torch.full((batch,), -1, dtype=torch.long, device=index.device)
    last = last.scatter_reduce(0, packed.rows, index, reduce="amax")
    if pad_token_id is None:
        return last
    real = packed.input_ids[0] != pad_token_id
    pooled = torch.full_like(last, -1).scatter_reduce(0, packed.rows, torch.where(real, index, -1), reduce="amax")
    return torch.where(pooled >= 0, pooled, last)


def score_layer(model: torch.nn.Module) -> torch.nn.Module:
    """A sequence classifier's `score` layer under any wrappers (DistributedDataParallel's `module`, peft's base
    model)."""
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return inner.score


def unpackable_reason(model: torch.nn.Module) -> str | None:
    """Why `model`'s forward would not keep packed rows apart (None: it does): its model type or attention
    implementation is not one known to build the per-row mask from position ids."""
    config = getattr(getattr(model, "module", model), "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in PACKABLE_MODEL_TYPES:
        return f"model type {kind!r} is not one known to pack ({', '.join(sorted(PACKABLE_MODEL_TYPES))})"
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in PACKABLE_ATTENTION:
        return f"attention implementation {attention!r} does not read packed position ids"
    return None
