"""Per-token log-probabilities and entropy from logits."""

from __future__ import annotations

from dataclasses import dataclass

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
    return torch.cat([picked for _, picked, _ in _chunked_logprobs(logits, tokens, temperature)])


def _chunked_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """Per chunk of rows: (float32 scaled logits, logprobs of `tokens`, logsumexp), chunks from `split`."""
    size = _row_chunks(logits)
    for part, ids in zip(logits.split(size), tokens.split(size)):
        scaled = part.float() if temperature == 1.0 else part.float() / temperature  # float32 logits: no copy
        log_z = torch.logsumexp(scaled, dim=-1)
        yield scaled, scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - log_z, log_z


@dataclass
class TokenLogprobs:
    """What the update needs from a micro-batch's policy logits, so the logits themselves need not outlive the
    forward pass. logprobs: (B, T) float32 with gradient; entropy: (B, T) float32, detached."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


def logprobs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> TokenLogprobs:
    """`selective_logprobs` and the entropy of softmax(logits / temperature), in one pass over each chunk, sharing
    its logsumexp.

    The update used to keep the (B, T, V) logits alive through the backward to take the entropy afterwards;
    here the entropy is taken from the chunk already in hand, so the logits are freed as soon as the backward
    has used them. The entropy is non-finite at a position exactly when one of its logits is (a -inf logit
    gives 0 x -inf), which makes it the update's finiteness check of the logits as well.
    """
    picked, entropies = [], []
    for scaled, chunk_logprobs, log_z in _chunked_logprobs(logits, tokens, temperature):
        picked.append(chunk_logprobs)
        with torch.no_grad():
            values, log_z = scaled.detach(), log_z.detach()
            weighted = (values - log_z.unsqueeze(-1)).exp_().mul_(values)  # p * logit, one work tensor
            entropies.append(log_z - weighted.sum(-1))
            del weighted
    return TokenLogprobs(torch.cat(picked), torch.cat(entropies))
