"""RLOOTrainer: REINFORCE Leave-One-Out on the shared on-policy loop (TRL's RLOO trainer; Ahmadian et al. 2024)."""

from __future__ import annotations

import dataclasses

import torch

from training_wizard.core.advantages import (
    RLOOShaping, ShapedRewards, local_moments, rloo_shaped_rewards, scored_rows,
)
from training_wizard.core.grpo import group_advantages
from training_wizard.core.losses import clipped_surrogate_sequence, clipped_surrogate_token
from training_wizard.core.turn_shaping import rloo_turn_advantages, with_last_turn_added
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.trainers.config.on_policy import RLOOConfig
from training_wizard.trainers.algorithms.group import GroupTrainer
from training_wizard.trainers.loop.iteration_metrics import TRLRewardInputs
from training_wizard.trainers.loop.update import MicroBatchLoss, PolicyForward


class RLOOTrainer(GroupTrainer):
    """k completions per prompt; each completion's baseline is the mean reward of the other k - 1.

    `RLOOTrainer(config=RLOOConfig(...), tokenizer=..., policy=..., ref_policy=..., reward_model=...,
    train_dataset=..., eval_dataset=...)` (trainers/algorithms/group.py; TRL's constructor arguments:
    trl/trainers.py). Without `ref_policy`, a LoRA policy uses itself with the adapter disabled as the reference,
    and a full policy a frozen copy of its starting weights.
    """

    config: RLOOConfig

    def shape_rewards(self, rollout: TrajectoryBatch) -> ShapedRewards:
        config = self.config
        options = RLOOShaping(
            rloo_k=config.rloo_k, kl_coef=config.kl_coef, kl_estimator=config.kl_estimator,
            token_level_kl=config.token_level_kl, normalize_reward=config.normalize_reward,
            reward_clip_range=config.reward_clip_range, whiten_rewards=config.whiten_rewards,
            normalize_advantage=config.normalize_advantage,
            mask_truncated_completions=config.mask_truncated_completions,
        )
        moments = self.collectives.global_moments(local_moments)
        shaped = rloo_shaped_rewards(
            rollout.scores, rollout.logprobs, rollout.ref_logprobs, rollout.loss_mask, options, rollout.group_ids,
            moments=moments, has_stop=rollout.has_stop,
            scored=scored_rows(rollout.components, rollout.num_rows).to(rollout.scores.device),
        )
        if config.turn_credit == "episode":
            return shaped
        # the KL part of the reward (non-score reward) is the last turn's, beside its share of the score
        turn_rewards = with_last_turn_added(rollout.turn_rewards, rollout.turn_counts, shaped.non_score_reward)
        advantages = rloo_turn_advantages(
            config.turn_credit, turn_rewards, rollout.turn_counts, rollout.turn_index, rollout.group_ids,
            config.turn_gamma, rollout.loss_mask, config.normalize_advantage, moments, shaped.scored)
        return dataclasses.replace(shaped, advantages=advantages)

    def trl_reward_inputs(self, rollout: TrajectoryBatch, shaped: ShapedRewards) -> TRLRewardInputs:
        """`std_is_zero`: the row's group has equal rewards after the KL penalty, over its scored rows. TRL 1.16's
        RLOO takes its `frac_reward_zero_std` from the nanstd of score - beta * kl, the reward its baselines use
        (ours: `rlhf_reward`), so with kl_coef != 0 a group is rarely counted; a group with fewer than two scored
        rows has no standard deviation, so it is not counted as zero. `kl_sum` where TRL logs `kl` (beta != 0)."""
        std_is_zero = group_advantages(shaped.rlhf_reward.float(), rollout.group_ids, scored=shaped.scored)[1]
        return TRLRewardInputs(std_is_zero=std_is_zero, kl_sum=shaped.kl if self.config.kl_coef != 0.0 else None)

    def micro_batch_loss(self, rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor],
                         forward: PolicyForward, step_totals=None) -> MicroBatchLoss:
        return rloo_loss(rows, shaped, forward, self.config)


def rloo_loss(rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor], forward: PolicyForward,
              config: RLOOConfig) -> MicroBatchLoss:
    """RLOO's loss of one micro-batch: the clipped ratio of whole completions, or of tokens with token-level KL,
    over the loss mask (narrowed by mask_truncated_completions when set)."""
    correction = forward.correction
    if config.token_level_kl or config.turn_credit != "episode":  # per-token advantages: a per-token ratio
        surrogate, weights = clipped_surrogate_token, correction.token if correction is not None else None
    else:
        surrogate, weights = clipped_surrogate_sequence, correction.sequence if correction is not None else None
    mask = shaped.get("loss_mask", rows["loss_mask"])  # shaped: mask_truncated_completions took truncated rows out
    out = surrogate(forward.token.logprobs, forward.old_logprobs, shaped["advantages"], mask, config.cliprange,
                    weights, cliprange_high=config.epsilon_high)
    stats = {"loss/policy_avg": out.loss.detach(), "policy/approxkl_avg": out.approxkl,
             "policy/clipfrac_avg": out.clipfrac,
             **clip_ratios(out.ratio.detach(), shaped["advantages"], mask, config)}
    return MicroBatchLoss(loss=out.loss, entropy=forward.token.entropy, ratio=out.ratio, stats=stats)


def clip_ratios(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                config: RLOOConfig) -> dict[str, torch.Tensor]:
    """TRL's clip_ratio/* of one micro-batch: the share of ratios below 1 - cliprange with a negative advantage
    (low), above 1 + epsilon_high with a positive one (high), and either (region); over completions for the
    sequence-level loss, over loss tokens for the token-level one. ratio, advantages: (B,) or (B, T). A completion
    mask_truncated_completions took out has ratio 1 and still counts, unclipped, among the completions: TRL 1.16
    zeroes its completion_mask and keeps its row in the mean."""
    high_bound = 1 + (config.epsilon_high if config.epsilon_high is not None else config.cliprange)
    low = (ratio < 1 - config.cliprange) & (advantages < 0)
    high = (ratio > high_bound) & (advantages > 0)
    kept = mask if ratio.dim() == 2 else torch.ones_like(ratio, dtype=torch.bool)
    count = kept.sum().clamp(min=1)
    shares = [(flags & kept).sum() / count for flags in (low, high, low | high)]
    return dict(zip(("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"), shares))
