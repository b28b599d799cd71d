"""Per-token log-probabilities and entropy from logits."""

from __future__ import annotations

import torch


# Floats of (rows x T x V) float32 work space per chunk: about 64 MB, whatever the batch and vocabulary.
_CHUNK_ELEMENTS = 1 << 24


def _row_chunks(logits: torch.Tensor) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] for each position, without keeping a (B, T, V) log-softmax.

    logits: (B, T, V) float; tokens: (B, T) long -> (B, T) float32.
    The temperature must be the sampling temperature: the ratio compares training-style logprobs of the same
    distribution that generated the tokens (the RLOO blog post, "recompute old logprobs with a forward pass").
    Computed in float32 so bf16 logits do not lose the small differences the ratio depends on, a chunk of rows at
    a time (about 64 MB of float32 each). The chunks come from `split` and are joined with `cat`, whose backward
    writes each chunk's gradient once; indexing rows one by one would make the backward fill a full (B, T, V)
    zero gradient per row.
    """
    size = _row_chunks(logits)
    picked = []
    for part, ids in zip(logits.split(size), tokens.split(size)):
        scaled = part.float() if temperature == 1.0 else part.float() / temperature  # float32 logits: no copy
        picked.append(scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1))
    return torch.cat(picked)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at each position. (B, T, V) -> (B, T) float32, in row chunks."""
    size = _row_chunks(logits)
    entropies = []
    for part in logits.split(size):
        scaled = part.float() / temperature
        log_z = torch.logsumexp(scaled, dim=-1)
        entropies.append(log_z - (torch.softmax(scaled, dim=-1) * scaled).sum(-1))
    return torch.cat(entropies)
