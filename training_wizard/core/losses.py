"""The clipped surrogate policy loss and its statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_wizard.core.masking import masked_mean, masked_sum


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # scalar, differentiable
    ratio: torch.Tensor  # the ratio that was clipped: (B,) sequence-level or (B, T) token-level, detached
    clipfrac: torch.Tensor  # scalar: share of ratios where the clipped branch was taken
    approxkl: torch.Tensor  # scalar: 0.5 * mean(log_ratio ** 2), KL between consecutive policies


def clipped_surrogate_sequence(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float,
    weights: torch.Tensor | None = None, cliprange_high: float | None = None,
) -> PolicyLossOutput:
    """PPO's clipped loss with the whole completion as one action (RLOO, TRL's RLOO docs; the RLOO blog post).

    logprobs, old_logprobs: (B, T); advantages: (B,); mask: (B, T) bool. ratio = exp(sum_t logp - sum_t logp_old).
    With one epoch and one mini-batch the ratio is 1 and the gradient equals REINFORCE's (the RLOO blog post's example).
    The loss is the mean over completions: equal-sized micro-batches with accumulation give the full batch's
    gradient. `weights` (B,), detached, multiply each completion's term: the sampling correction of
    core/importance_sampling.py when another engine sampled the completions. `cliprange_high` (DAPO's
    clip-higher, TRL's `epsilon_high`): the ratio is clipped to [1 - cliprange, 1 + cliprange_high]; None:
    cliprange. A completion whose mask is all False (mask_truncated_completions) has ratio 1 and no gradient.
    """
    log_ratio = masked_sum(logprobs, mask) - masked_sum(old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    upper = cliprange if cliprange_high is None else cliprange_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + upper)
    per_sequence = torch.max(unclipped, clipped)
    if weights is not None:
        per_sequence = per_sequence * weights
    return PolicyLossOutput(
        loss=per_sequence.mean(),
        ratio=ratio.detach(),
        clipfrac=(clipped > unclipped).float().mean().detach(),
        approxkl=(0.5 * log_ratio.detach() ** 2).mean(),
    )


def clipped_surrogate_token(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float,
    weights: torch.Tensor | None = None, cliprange_high: float | None = None,
) -> PolicyLossOutput:
    """PPO's clipped loss with each token as an action. logprobs, old_logprobs, advantages, mask: (B, T).

    Each completion's loss is its masked token mean, and the batch loss the mean over completions, so the
    gradient does not depend on how the batch is split into micro-batches. `weights` (B, T), detached, multiply
    each token's term (the sampling correction of core/importance_sampling.py). `cliprange_high` as in
    `clipped_surrogate_sequence`.
    """
    log_ratio = (logprobs - old_logprobs) * mask.to(logprobs.dtype)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    upper = cliprange if cliprange_high is None else cliprange_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + upper)
    per_token = torch.max(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    per_sequence = masked_mean(per_token, mask, dim=-1)
    return PolicyLossOutput(
        loss=per_sequence.mean(),
        ratio=ratio.detach(),
        clipfrac=masked_mean((clipped > unclipped).float(), mask).detach(),
        approxkl=masked_mean(0.5 * log_ratio.detach() ** 2, mask),
    )
