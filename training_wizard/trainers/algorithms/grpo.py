"""GRPOTrainer: Group Relative Policy Optimization on the shared on-policy loop (TRL's GRPO trainer; DeepSeekMath,
Shao et al. 2024; the variants of DAPO, Dr. GRPO, GSPO and CISPO through `loss_type` and its neighbours).

What GRPO adds to the loop in trainers/loop/on_policy.py (math in core/grpo.py):
- step 6, `shape_rewards`: group advantages (reward minus the group mean, scaled by `scale_rewards`), one per
  completion; the KL to the reference is no reward term here but a loss term (`beta`);
- step 7, `micro_batch_loss`: the clipped per-token loss aggregated by `loss_type` (`grpo_loss`); the
  dapo/bnpo/cispo token counts of each optimizer step are taken before its first micro-batch
  (`optimizer_step_totals`) and passed to each of its micro-batches, so gradient accumulation and several
  processes give the whole step's gradient;
- TRL's GRPO metric names beside the shared ones: `clip_ratio/*_mean`, `cispo_clip_ratio`, `entropy` and `kl`
  from the loss pass; the rest (`reward`, `completions/*`, ...) as for RLOO (trainers/loop/iteration_metrics.py).
"""

from __future__ import annotations

import dataclasses

import torch

from training_wizard.core.advantages import ShapedRewards, local_moments, scored_rows
from training_wizard.core.grpo import (
    STD_EPSILON, GRPOLossOptions, StepTokens, aggregate_loss, grpo_shaped_rewards, high_entropy_mask, per_token_loss,
)
from training_wizard.core.turn_shaping import grpo_turn_advantages
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.trainers.config.on_policy import GRPOConfig
from training_wizard.trainers.algorithms.group import GroupTrainer
from training_wizard.trainers.loop.iteration_metrics import TRLRewardInputs
from training_wizard.trainers.loop.update import MicroBatchLoss, PolicyForward


class GRPOTrainer(GroupTrainer):
    """num_generations completions per prompt; each one's advantage is its reward minus its group's mean.

    `GRPOTrainer(config=GRPOConfig(...), tokenizer=..., policy=..., reward_model=..., train_dataset=...,
    ref_policy=..., eval_dataset=...)` (trainers/algorithms/group.py; TRL's constructor arguments: trl/trainers.py).
    With beta = 0 (the default) no reference is used and `ref_policy` is ignored; with beta > 0 and no
    `ref_policy`, a LoRA policy's base (adapter disabled) or a frozen copy of the starting policy is the reference.
    """

    config: GRPOConfig

    @property
    def loss_options(self) -> GRPOLossOptions:
        """The config's options of the per-token loss."""
        config = self.config
        return GRPOLossOptions(
            loss_type=config.loss_type, epsilon=config.cliprange, epsilon_high=config.epsilon_high,
            delta=config.delta, importance_sampling_level=config.importance_sampling_level, beta=config.kl_coef,
        )

    # -- step 6 ------------------------------------------------------------------------------------------------
    def shape_rewards(self, rollout: TrajectoryBatch) -> ShapedRewards:
        config = self.config
        moments = self.collectives.global_moments(local_moments)
        shaped = grpo_shaped_rewards(
            rollout.scores, rollout.logprobs, rollout.ref_logprobs, rollout.loss_mask, rollout.has_stop,
            rollout.group_ids, config.scale_rewards, config.mask_truncated_completions,
            moments=moments, drop_constant_groups=config.dynamic_sampling,
            scored=scored_rows(rollout.components, rollout.num_rows).to(rollout.scores.device),
        )
        if config.turn_credit == "episode":
            return shaped
        advantages = grpo_turn_advantages(
            config.turn_credit, rollout.turn_rewards, rollout.turn_counts, rollout.turn_index, rollout.scores,
            rollout.group_ids, config.turn_gamma, config.scale_rewards, moments, shaped.scored, STD_EPSILON)
        return dataclasses.replace(shaped, advantages=advantages)

    # -- step 7 ------------------------------------------------------------------------------------------------
    def optimizer_step_totals(self, shaped, order: torch.Tensor) -> list[StepTokens]:
        """Loss tokens of each mini-batch of this epoch, on this process and over all, and under dynamic_sampling the
        rows left in the loss over all: one all-reduce per epoch."""
        plan = self.plan
        device = shaped.loss_mask.device
        per_row = shaped.loss_mask.sum(-1).float()[order.to(device)]
        local = per_row.reshape(-1, plan.local_mini_batch_size).sum(-1)
        kept = shaped.kept_rows if shaped.kept_rows is not None else torch.ones_like(per_row, dtype=torch.bool)
        rows = kept.float()[order.to(device)].reshape(-1, plan.local_mini_batch_size).sum(-1)
        world, world_rows = self.collectives.sum(torch.stack([local, rows]).to(self.accelerator.device))
        # micro-batches by tokens hold unequal rows: a mean over sequences then divides by the step's rows too
        counted = shaped.kept_rows is not None or self.config.max_tokens_per_micro_batch is not None
        return [StepTokens(float(mine), float(every), self.config.gradient_accumulation_steps, plan.world_size,
                           world_rows=float(step_rows) if counted else None)
                for mine, every, step_rows in zip(local.tolist(), world.tolist(), world_rows.tolist())]

    def micro_batch_loss(self, rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor],
                         forward: PolicyForward, step_totals: StepTokens) -> MicroBatchLoss:
        pool = None
        if self.config.top_entropy_quantile < 1.0:
            pool = self._entropy_pool(forward.token.entropy, shaped["loss_mask"])
        return grpo_loss(shaped, forward, step_totals, self.config, self.loss_options, pool)

    def _entropy_pool(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The real tokens' entropies of this micro-batch on every process (the top-entropy threshold's sample,
        as TRL takes it): padded with NaN to one length for the gather, NaN dropped after."""
        local = entropy[mask].float()
        length = self.collectives.max_int(local.numel())
        padded = torch.nn.functional.pad(local, (0, length - local.numel()), value=float("nan"))
        pooled = self.collectives.gather(padded)
        return pooled[~torch.isnan(pooled)].to(entropy.device)

    # -- step 8 ------------------------------------------------------------------------------------------------
    def trl_reward_inputs(self, rollout: TrajectoryBatch, shaped: ShapedRewards) -> TRLRewardInputs:
        """The rows whose advantage scale was zero (with scale_rewards = "batch", the whole batch's); no KL sums:
        TRL's GRPO logs `kl` from its loss pass, which grpo_loss's statistics hold."""
        return TRLRewardInputs(std_is_zero=shaped.std_is_zero, kl_sum=None)


def grpo_loss(shaped: dict[str, torch.Tensor], forward: PolicyForward, step: StepTokens, config: GRPOConfig,
              options: GRPOLossOptions, entropy_pool: torch.Tensor | None = None) -> MicroBatchLoss:
    """GRPO's loss of one micro-batch and TRL's GRPO statistics, over the shaped loss mask (the rollout's, narrowed
    by mask_truncated_completions and dynamic_sampling). `step`: the token counts of the optimizer step the
    micro-batch belongs to; `entropy_pool`: the entropies the top_entropy_quantile threshold is taken over."""
    mask, token, old = shaped["loss_mask"], forward.token, forward.old_logprobs
    weights = None
    if entropy_pool is not None:
        weights = high_entropy_mask(token.entropy, mask, config.top_entropy_quantile, entropy_pool)
    if forward.correction is not None:  # vLLM sampled: weigh the policy term as TRL's GRPO does
        weights = forward.correction.token if weights is None else weights * forward.correction.token
    out = per_token_loss(token.logprobs, old, shaped["advantages"], mask, options,
                         ref_logprobs=shaped["ref_logprobs"], token_weights=weights)
    loss = aggregate_loss(out.per_token, mask, config.loss_type, step, config.response_length)
    log_ratio = (token.logprobs.detach() - old).float()
    clipped = (out.low_clipped | out.high_clipped).float()

    def step_mean(values: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of a token mean over its whole optimizer step (all micro-batches, every
        process), scaled like the dapo loss: the update averages the shares, so the metric is the step's token
        mean whatever the split (a per-micro-batch mean would weigh a micro-batch of few tokens like a full one)."""
        return (values.detach() * mask).sum() * (step.accumulation_steps * step.processes) / max(step.world, 1.0)

    stats = {
        "loss/policy_avg": loss.detach(),
        "policy/approxkl_avg": step_mean(0.5 * log_ratio**2),
        "policy/clipfrac_avg": step_mean(clipped),
        "clip_ratio/low_mean": step_mean(out.low_clipped.float()),
        "clip_ratio/high_mean": step_mean(out.high_clipped.float()),
        "clip_ratio/region_mean": step_mean(clipped),
        "entropy": step_mean(token.entropy),
    }
    if config.loss_type == "cispo":  # TRL's name for it under cispo: tokens whose weight hit the cap, A > 0
        stats["cispo_clip_ratio"] = stats["clip_ratio/high_mean"]
    if config.kl_coef != 0.0:
        stats["kl"] = step_mean(out.kl)
    # the statistics are step shares always; the loss where it is normalised by the step's totals
    step_shares = config.loss_type in ("dapo", "cispo", "bnpo") or step.world_rows is not None
    return MicroBatchLoss(loss=loss, entropy=token.entropy, ratio=out.ratio, stats=stats, step_shares=step_shares)
