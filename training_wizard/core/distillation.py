"""On-policy distillation losses: the dense generalized JSD of TRL 1.16's DistillationTrainer, its sampled-token
form, and the student/teacher argmax agreement.

Conventions (TRL's, kept so the numbers match): p_s is the student's and p_t the teacher's next-token distribution,
both softmax(logits / temperature), and the mixture is m = beta * p_t + (1 - beta) * p_s. The per-token loss is

    beta * KL(p_t || m) + (1 - beta) * KL(p_s || m)

so beta = 0 is the forward KL(p_t || p_s) and beta = 1 the reverse KL(p_s || p_t). Both ends are computed as those
KLs directly (the mixture form would take log(0)). Gradients flow to the student's logits only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from training_wizard.core.kl import kl_per_token


@dataclass(frozen=True)
class DistillationTerms:
    """What `generalized_jsd` returns. All (B, T) float32 and 0 outside the mask.

    per_token: the divergence of each token (carries the gradient).
    entropy: the student's entropy (nats) at the same temperature, detached (a metric, as in TRL).
    mask: the (B, T) bool mask the terms were computed on.
    """

    per_token: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor

    @property
    def num_tokens(self) -> torch.Tensor:
        """Number of masked-in tokens of this batch."""
        return self.mask.sum()

    def loss(self, num_items: torch.Tensor | int | None = None) -> torch.Tensor:
        """TRL's reduction: the sum divided by `num_items` (a global token count, for gradient accumulation across
        micro-batches and processes) when given, else the mean over this batch's masked tokens (0 when none)."""
        # Summing the masked-in tokens only keeps the sum's rounding independent of where unmasked tokens sit.
        total = self.per_token[self.mask].sum()
        if num_items is None:
            return total / self.num_tokens.clamp(min=1)
        if isinstance(num_items, torch.Tensor):
            num_items = num_items.to(total.device)
        return total / num_items


def _log_add_exp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)). Not torch.logaddexp: on CPU its vectorised and scalar paths round differently, so a
    row's value would depend on how many rows share the call, and chunked would not equal unchunked."""
    return torch.maximum(a, b) + torch.log1p(torch.exp(-(a - b).abs()))


def _token_divergence(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of logits (N, V), (N, V) -> (divergence (N,), student entropy (N,)), in float32."""
    log_ps = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        divergence = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    elif beta == 1.0:
        divergence = (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    else:
        log_m = _log_add_exp(log_pt + math.log(beta), log_ps + math.log1p(-beta))
        kl_teacher = (log_pt.exp() * (log_pt - log_m)).sum(-1)
        kl_student = (log_ps.exp() * (log_ps - log_m)).sum(-1)
        divergence = beta * kl_teacher + (1 - beta) * kl_student
    with torch.no_grad():
        entropy = -(log_ps.exp() * log_ps).sum(-1)
    return divergence, entropy


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> DistillationTerms:
    """TRL 1.16 DistillationTrainer's per-token generalized JSD (see the module docstring for beta's meaning).

    student_logits, teacher_logits: (B, T, V); mask: (B, T) bool. Only masked-in tokens are computed, so tokens
    outside the mask (prompt, padding, environment tokens) carry no loss and exactly zero gradient, whatever their
    logits. With `chunk_rows`, the masked-in tokens are taken `chunk_rows` at a time and each chunk is recomputed in
    the backward pass, so no float32 (N, V) copy larger than one chunk is kept; the numbers are the same.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    batch, steps, vocab = student_logits.shape
    rows = mask.reshape(-1).nonzero().squeeze(-1)
    student_rows = student_logits.reshape(-1, vocab)
    teacher_rows = teacher_logits.detach().reshape(-1, vocab)
    step = rows.numel() if chunk_rows is None else chunk_rows
    divergences, entropies = [], []
    for start in range(0, rows.numel(), max(step, 1)):
        chunk = rows[start : start + step]
        student_chunk, teacher_chunk = student_rows[chunk], teacher_rows[chunk]
        if chunk_rows is None:
            divergence, entropy = _token_divergence(student_chunk, teacher_chunk, beta, temperature)
        else:
            divergence, entropy = checkpoint(
                _token_divergence, student_chunk, teacher_chunk, beta, temperature, use_reentrant=False
            )
        divergences.append(divergence)
        entropies.append(entropy)
    zeros = torch.zeros(batch * steps, dtype=torch.float32, device=student_logits.device)
    if rows.numel() == 0:
        # The sum of no rows keeps the graph to the student, so an all-masked batch backpropagates a zero gradient.
        per_token = zeros + student_rows[rows].float().sum()
        return DistillationTerms(per_token.reshape(batch, steps), zeros.reshape(batch, steps), mask.bool())
    per_token = zeros.index_copy(0, rows, torch.cat(divergences))
    entropy = zeros.index_copy(0, rows, torch.cat(entropies))
    return DistillationTerms(per_token.reshape(batch, steps), entropy.reshape(batch, steps), mask.bool())


def sampled_token_reverse_kl(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(p_s || p_t) from the tokens the student sampled. (B, T), (B, T), (B, T) -> (B, T).

    With r = log p_s(y_t) - log p_t(y_t): "k1" is r itself (on-policy distillation's dense reward is -r);
    "k3" is exp(-r) - 1 + r, veRL's kl_penalty "k3" / "low_var_kl" (without veRL's clamping), never negative.
    Both have expectation KL(p_s || p_t) under y_t ~ p_s. Zero outside the mask.
    """
    estimate = kl_per_token(student_logprobs, teacher_logprobs, estimator)
    return torch.where(mask.bool(), estimate, torch.zeros_like(estimate))


def top_k_teacher_logprobs(
    teacher_logits: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's k most likely tokens per position: (B, T, V) -> (logprobs (B, T, k), token ids (B, T, k)),
    log-probabilities of the full softmax(logits / temperature) (not renormalised over the k), highest first."""
    logprobs = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return logprobs.topk(k, dim=-1)


def agreement(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Share of masked-in tokens where the student's argmax is the teacher's: (B, T, V), (B, T, V), (B, T) -> ()
    float32 (0 when the mask is empty)."""
    same = (student_logits.argmax(-1) == teacher_logits.argmax(-1)) & mask.bool()
    return same.sum().float() / mask.bool().sum().clamp(min=1).float()
