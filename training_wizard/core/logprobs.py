"""Per-token log-probabilities and entropy from logits."""

from __future__ import annotations

import torch


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] for each position, without keeping a (B, T, V) log-softmax.

    logits: (B, T, V) float; tokens: (B, T) long -> (B, T) float32.
    The temperature must be the sampling temperature: the ratio compares training-style logprobs of the same
    distribution that generated the tokens (the RLOO blog post, "recompute old logprobs with a forward pass").
    Computed row by row in float32 so bf16 logits do not lose the small differences the ratio depends on.
    """
    out = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)
    for row in range(logits.shape[0]):
        scaled = logits[row].float() / temperature
        picked = scaled.gather(-1, tokens[row].unsqueeze(-1)).squeeze(-1)
        out[row] = picked - torch.logsumexp(scaled, dim=-1)
    return out


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at each position. (B, T, V) -> (B, T) float32."""
    out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
    for row in range(logits.shape[0]):
        scaled = logits[row].float() / temperature
        log_z = torch.logsumexp(scaled, dim=-1)
        probs = torch.softmax(scaled, dim=-1)
        out[row] = log_z - (probs * scaled).sum(-1)
    return out
