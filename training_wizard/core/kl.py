"""KL between policy and reference, per token, and the KL-shaped rewards (the RLOO blog post's worked example)."""

from __future__ import annotations

import torch

from training_wizard.core.masking import masked_sum


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL(policy || reference) estimate on sampled tokens. (B, T), (B, T) -> (B, T).

    k1 = log p - log q (unbiased, can be negative); k3 = (q/p - 1) - log(q/p) (unbiased, never negative),
    with p the policy and q the reference (Schulman, "Approximating KL divergence").
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1' or 'k3'")


def sequence_rlhf_reward(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole completion as one action: rlhf_reward = score - kl_coef * sum_t kl_t.

    scores: (B,), kl: (B, T), mask: (B, T) bool -> (rlhf_reward (B,), non_score_reward (B,)).
    Equal to `token_rewards(...).sum(-1)`: the sequence-level reward is the sum of the per-token ones.
    """
    non_score_reward = -kl_coef * masked_sum(kl, mask)
    return scores + non_score_reward, non_score_reward


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token rewards: -kl_coef * kl_t at every real token, plus the score at the last real token.

    scores: (B,), kl: (B, T), mask: (B, T) bool -> (B, T); zero on masked positions.
    Summing over t gives `sequence_rlhf_reward` (the RLOO blog post: "entire_generation_reward = per_token_reward.sum()").
    The RLOO blog post's worked example adds +kl per token, which is kl_coef = -1 here: kl = [-1.0, 0.1, -0.3] and
    score 1.0 give [-1.0, 0.1, 0.7], whose sum is the entire-completion reward -0.2.
    """
    rewards = -kl_coef * kl * mask.to(kl.dtype)
    last = (mask.long().cumsum(-1) == mask.long().sum(-1, keepdim=True)) & mask
    return rewards + last.to(kl.dtype) * scores.unsqueeze(-1)
