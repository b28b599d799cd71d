"""The clipped-ratio policy loss (PPO's surrogate), shared by RLOO, PPO and GRPO, and the two ways RLOO and PPO
aggregate it (a whole completion as one action, or each token as one). GRPO's aggregations are in core/grpo.py.

B = completions, T = completion width; `mask` (B, T) bool is the loss mask: the tokens the policy sampled and is
trained on. A token outside it gets no gradient and enters no statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_wizard.core.masking import masked_mean, masked_sum


@dataclass
class ClippedRatio:
    """loss: the clipped objective of each element, with gradient; ratio: the importance ratio, detached;
    low_clipped / high_clipped: bool, where the clip took the ratio's gradient away (ratio below 1 - epsilon with a
    negative advantage; above 1 + epsilon_high with a positive one)."""

    loss: torch.Tensor
    ratio: torch.Tensor
    low_clipped: torch.Tensor
    high_clipped: torch.Tensor

    @property
    def clipped(self) -> torch.Tensor:
        return self.low_clipped | self.high_clipped


def clipped_ratio_loss(
    log_ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float, epsilon_high: float | None = None,
    delta: float | None = None,
) -> ClippedRatio:
    """PPO's clipped surrogate, elementwise: max(-A r, -A clip(r, 1 - epsilon, 1 + epsilon_high)), r = exp(log_ratio).

    Any shape; `advantages` broadcasts against `log_ratio`. epsilon_high None: epsilon (symmetric; DAPO's
    clip-higher and TRL's `epsilon_high` otherwise). `delta` (INTELLECT-2's two-sided clip) first caps the
    unclipped ratio at delta, so a negative advantage can no longer push an unbounded ratio; the clip statistics
    are measured on the capped ratio, as TRL's are.
    """
    upper = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(log_ratio)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + upper)
    loss = torch.max(-advantages * unclipped, -advantages * clipped)
    capped = unclipped.detach()
    return ClippedRatio(
        loss=loss,
        ratio=ratio.detach(),
        low_clipped=(capped < 1.0 - epsilon) & (advantages < 0),
        high_clipped=(capped > 1.0 + upper) & (advantages > 0),
    )


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # scalar, differentiable
    ratio: torch.Tensor  # the ratio that was clipped: (B,) sequence-level or (B, T) token-level, detached
    clipfrac: torch.Tensor  # scalar: share of ratios where the clip took the gradient away
    approxkl: torch.Tensor  # scalar: 0.5 * mean(log_ratio ** 2), KL between consecutive policies


def clipped_surrogate_sequence(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float,
    weights: torch.Tensor | None = None, cliprange_high: float | None = None,
) -> PolicyLossOutput:
    """The clipped loss with the whole completion as one action (RLOO, TRL's RLOO docs; the RLOO blog post).

    logprobs, old_logprobs: (B, T); advantages: (B,); mask: (B, T) bool. ratio = exp(sum_t logp - sum_t logp_old)
    over the masked-in tokens. With one epoch and one mini-batch the ratio is 1 and the gradient equals
    REINFORCE's (the RLOO blog post's example). The loss is the mean over completions: equal-sized micro-batches
    with accumulation give the full batch's gradient. `weights` (B,), detached, multiply each completion's term:
    the sampling correction of core/importance_sampling.py when another engine sampled the completions.
    `cliprange_high`: `clipped_ratio_loss`'s epsilon_high. A completion whose mask is all False
    (mask_truncated_completions) has ratio 1 and no gradient.
    """
    log_ratio = masked_sum(logprobs, mask) - masked_sum(old_logprobs, mask)
    out = clipped_ratio_loss(log_ratio, advantages, cliprange, cliprange_high)
    per_sequence = out.loss if weights is None else out.loss * weights
    return PolicyLossOutput(
        loss=per_sequence.mean(),
        ratio=out.ratio,
        clipfrac=out.clipped.float().mean(),
        approxkl=(0.5 * log_ratio.detach() ** 2).mean(),
    )


def clipped_surrogate_token(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float,
    weights: torch.Tensor | None = None, cliprange_high: float | None = None,
) -> PolicyLossOutput:
    """The clipped loss with each token as an action (PPO; RLOO with token-level KL). logprobs, old_logprobs,
    advantages, mask: (B, T).

    Each completion's loss is its masked token mean, and the batch loss the mean over completions, so the
    gradient does not depend on how the batch is split into micro-batches. `weights` (B, T), detached, multiply
    each token's term (the sampling correction of core/importance_sampling.py). `cliprange_high` as in
    `clipped_surrogate_sequence`.
    """
    log_ratio = (logprobs - old_logprobs) * mask.to(logprobs.dtype)
    out = clipped_ratio_loss(log_ratio, advantages, cliprange, cliprange_high)
    per_token = out.loss if weights is None else out.loss * weights
    per_sequence = masked_mean(per_token, mask, dim=-1)
    return PolicyLossOutput(
        loss=per_sequence.mean(),
        ratio=out.ratio,
        clipfrac=masked_mean(out.clipped.float(), mask),
        approxkl=masked_mean(0.5 * log_ratio.detach() ** 2, mask),
    )
