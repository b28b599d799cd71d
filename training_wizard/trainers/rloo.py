"""RLOOTrainer: REINFORCE Leave-One-Out on the shared on-policy loop (seed 000; Ahmadian et al. 2024)."""

from __future__ import annotations

import torch

from training_wizard.core.advantages import (
    normalize_and_clip,
    reward_to_go,
    rloo_advantages,
    whiten,
)
from training_wizard.core.kl import kl_per_token, sequence_rlhf_reward, token_rewards
from training_wizard.core.losses import (
    clipped_surrogate_sequence,
    clipped_surrogate_token,
)
from training_wizard.core.masking import masked_sum
from training_wizard.rollout.record import Rollout
from training_wizard.trainers.base import OnPolicyTrainer
from training_wizard.trainers.config import RLOOConfig


class RLOOTrainer(OnPolicyTrainer):
    """k completions per prompt; each completion's baseline is the mean reward of the other k - 1.

    `RLOOTrainer(config=RLOOConfig(...), tokenizer=..., policy=..., ref_policy=..., reward_model=...,
    train_dataset=..., eval_dataset=...)`, then `.train()`. `reward_model` is a sequence classifier sharing the
    policy's tokenizer, a RewardSpec, or a callable `fn(prompts, completions, **columns) -> list[float]`.
    Without `ref_policy`, a LoRA policy uses itself with the adapter disabled as the reference, and a full
    policy a frozen copy of its starting weights.
    """

    config: RLOOConfig

    def compute_advantages(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        config, mask = self.config, rollout.response_mask
        kl = kl_per_token(rollout.logprobs, rollout.ref_logprobs, config.kl_estimator) * mask
        scores = rollout.scores
        if config.normalize_reward:
            scores = self._over_all_processes(lambda s: normalize_and_clip(s, config.reward_clip_range), scores)
        if config.token_level_kl:
            per_token = token_rewards(scores, kl, mask, config.kl_coef)
            rlhf_reward = per_token.sum(-1)
            non_score_reward = rlhf_reward - scores
        else:
            rlhf_reward, non_score_reward = sequence_rlhf_reward(scores, kl, mask, config.kl_coef)
        scale = self._reward_scale(rlhf_reward) if config.whiten_rewards else 1.0
        baseline_free = rloo_advantages(rlhf_reward * scale, config.rloo_k)
        if config.token_level_kl:
            # Each token's return-to-go minus the leave-one-out baseline of the whole-completion reward.
            baseline = (rlhf_reward * scale) - baseline_free
            advantages = (reward_to_go(per_token * scale, mask) - baseline.unsqueeze(-1)) * mask
        else:
            advantages = baseline_free
        if config.normalize_advantage:
            if config.token_level_kl:
                advantages = self._over_all_processes(lambda a, m: whiten(a, mask=m), advantages, mask)
            else:
                advantages = self._over_all_processes(whiten, advantages)
        return {
            "advantages": advantages,
            "kl": masked_sum(kl, mask),
            "non_score_reward": non_score_reward,
            "rlhf_reward": rlhf_reward,
        }

    def policy_loss(self, logprobs, old_logprobs, advantages, mask):
        if self.config.token_level_kl:
            return clipped_surrogate_token(logprobs, old_logprobs, advantages, mask, self.config.cliprange)
        return clipped_surrogate_sequence(logprobs, old_logprobs, advantages, mask, self.config.cliprange)

    def _reward_scale(self, rlhf_reward: torch.Tensor) -> float:
        """whiten_rewards: divide by the batch standard deviation (over all processes); the mean is kept."""
        everything = self.accelerator.gather(rlhf_reward.to(self.accelerator.device))
        return float(torch.rsqrt(everything.var(unbiased=everything.numel() > 1) + 1e-8))

    def _over_all_processes(self, fn, values: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        """Apply a batch statistic over the global batch (all processes), then keep this process's rows."""
        if self.accelerator.num_processes == 1:
            return fn(values, *more)
        gathered = [self.accelerator.gather(t.to(self.accelerator.device).contiguous()) for t in (values, *more)]
        rows = values.shape[0]
        start = self.accelerator.process_index * rows
        return fn(*gathered)[start : start + rows].to(values.device)
