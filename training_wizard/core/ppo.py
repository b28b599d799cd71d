"""PPO's reward shaping, advantages and value loss (TRL's PPOv2 docs; "The N+ Implementation Details of RLHF with
PPO", Huang et al. 2024). B = completions, T = completion width; `mask` (B, T) bool is the loss mask, True at the
tokens the policy sampled (the stop token included); no other token gets a reward, value, advantage, return or
loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_wizard.core.advantages import Moments, ShapedRewards, local_moments, whiten
from training_wizard.core.kl import kl_per_token, token_rewards
from training_wizard.core.masking import masked_mean, masked_sum


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each completion's loss tokens (Schulman et al. 2016, as in TRL's
    PPOv2; tokens outside the mask skipped as veRL's GAE skips them).

    rewards, values: (B, T) float; mask: (B, T) bool, the loss mask -> (advantages (B, T), returns (B, T)), zero
    outside the mask. delta_t = r_t + gamma * V_next - V_t and A_t = delta_t + gamma * lam * A_next, where "next"
    is the next token inside the mask: a token the environment wrote between two replies is stepped over, so
    the model's tokens get the GAE of the sequence of its own tokens. V and A past the last loss token are 0:
    the episode ends there. returns = A + V.
    """
    real = mask.to(rewards.dtype)
    rewards, values = rewards * real, values * real
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * real[:, t]
        # outside the mask the running values pass through unchanged to the loss token before
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_advantage = torch.where(mask[:, t], advantage, next_advantage)
    return advantages, (advantages + values) * real


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss and the share of real tokens where the clipped branch was taken.

    values (with gradient), old_values (the rollout's), returns: (B, T); mask: (B, T) bool -> (loss, clipfrac).
    loss = 0.5 * mean over completions of the masked token mean of max((V - R)^2, (clip(V, V_old +- c) - R)^2):
    averaged per completion first, like the token-level policy loss, so a split batch with accumulation gives the
    full batch's gradient.
    """
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    per_sequence = masked_mean(torch.max(unclipped_loss, clipped_loss), mask, dim=-1)
    clipfrac = masked_mean((clipped_loss > unclipped_loss).float(), mask)
    return 0.5 * per_sequence.mean(), clipfrac.detach()


@dataclass(frozen=True)
class PPOShaping:
    """The options of PPO's reward shaping (names as in PPOConfig)."""

    kl_coef: float
    gamma: float = 1.0
    lam: float = 0.95
    kl_estimator: str = "k1"
    whiten_rewards: bool = False


def ppo_shaped_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    options: PPOShaping,
    moments: Moments = local_moments,
    score_rewards: torch.Tensor | None = None,
) -> ShapedRewards:
    """Per-token rewards, GAE advantages (whitened) and returns of one rollout (TRL's PPOv2).

    scores: (B,); logprobs, ref_logprobs, values: (B, T); mask: (B, T) bool. Each real token earns
    -kl_coef * kl_t and the last real token also the score (`core.kl.token_rewards`). With `whiten_rewards` the
    per-token rewards are whitened over the batch's real tokens, mean kept. Advantages are always whitened over
    the real tokens (mean removed); returns are not. `moments` gives the batch statistics (over every process).
    `score_rewards` (B, T) (turn_credit "gae": each turn's reward at its last model token) replaces the score at
    the last token; the KL rewards stay.
    """
    kl = kl_per_token(logprobs, ref_logprobs, options.kl_estimator) * mask
    if score_rewards is None:
        rewards = token_rewards(scores, kl, mask, options.kl_coef)
    else:
        rewards = token_rewards(torch.zeros_like(scores), kl, mask, options.kl_coef) + score_rewards * mask
    non_score_reward = -options.kl_coef * masked_sum(kl, mask)
    if options.whiten_rewards:
        rewards = whiten(rewards, mask, shift_mean=False, moments=moments)
    advantages, returns = gae_advantages(rewards, values, mask, options.gamma, options.lam)
    return ShapedRewards(
        advantages=whiten(advantages, mask, moments=moments),
        kl=masked_sum(kl, mask),
        non_score_reward=non_score_reward,
        rlhf_reward=scores + non_score_reward,
        returns=returns,
    )
