"""PPOTrainer: PPO with a value model on the shared on-policy loop (TRL's PPOv2; "The N+ Implementation Details of
RLHF with PPO", Huang et al. 2024).

What PPO adds to the loop in trainers/loop/on_policy.py:
- the value model, trained beside the policy with the same optimizer (`additional_trained_models`);
- its values of every response token, computed during the rollout (`extra_rollout_passes`);
- per-token KL rewards, GAE advantages (whitened) and returns (`shape_rewards`, math in core/ppo.py);
- the clipped value loss added to the policy loss (`micro_batch_loss`).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from training_wizard.core.advantages import ShapedRewards, local_moments
from training_wizard.core.losses import clipped_surrogate_token
from training_wizard.core.ppo import PPOShaping, clipped_value_loss, ppo_shaped_rewards
from training_wizard.core.turn_credit import turn_end_rewards
from training_wizard.core.turn_shaping import turn_last_tokens
from training_wizard.rollout.collector import SamplingSettings
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.rollout.value import value_logits
from training_wizard.sharding import unwrap_model
from training_wizard.trainers.loop.on_policy import OnPolicyTrainer
from training_wizard.trainers.loop.update import MicroBatchLoss, PolicyForward
from training_wizard.trainers.config.on_policy import PPOConfig


class PPOTrainer(OnPolicyTrainer):
    """One completion per prompt, a value model as baseline, advantages by GAE.

    `PPOTrainer(config=PPOConfig(...), tokenizer=..., policy=..., ref_policy=..., reward_model=...,
    value_model=..., train_dataset=..., eval_dataset=...)`, then `.train()`. `value_model` is a sequence
    classifier with one output (`num_labels=1`) sharing the policy's tokenizer; its output is read at every response
    token. Without it, a copy of `reward_model` is used when that is a model (as the N+ paper does), otherwise the
    policy's weights with a new scalar head (`specs.value_model.value_model_from_policy`).

    Policy and value train with one AdamW (as TRL's PPOv2 does, through one wrapper module): one learning-rate
    schedule, one gradient clip over both, one accumulation context, and one optimizer state to checkpoint.
    """

    config: PPOConfig

    def __init__(self, config: PPOConfig, tokenizer, policy, reward_model, train_dataset, ref_policy=None,
                 value_model: torch.nn.Module | None = None, eval_dataset=None, accelerator=None, **sources):
        """`sources`: `generation_backend` and `rollout_source`, as for every trainer (trainers/loop/on_policy.py)."""
        from training_wizard.specs.chat_rendering import bind_chat_template_kwargs
        from training_wizard.specs.prompt_rows import check_trainer_datasets

        check_trainer_datasets(train_dataset, eval_dataset)  # as GRPO's and RLOO's TRL-form arguments are checked
        bind_chat_template_kwargs(tokenizer, config.chat_template_kwargs)
        value_model = value_model if value_model is not None else _default_value_model(policy, reward_model)
        super().__init__(config=config, tokenizer=tokenizer, policy=policy, reward_model=reward_model,
                         train_dataset=train_dataset, ref_policy=ref_policy, eval_dataset=eval_dataset,
                         accelerator=accelerator, additional_models={"value_model": value_model}, **sources)
        self.value_model = self.trained_models["value_model"]

    # -- hooks of the shared loop -------------------------------------------------------------------------------
    def _sampling_settings(self) -> SamplingSettings:
        settings = super()._sampling_settings()
        if not self.config.non_eos_penalty:
            return settings
        from dataclasses import replace

        return replace(settings, score_without_stop=self.config.penalty_reward_value)

    def extra_rollout_passes(self) -> dict[str, Callable[..., torch.Tensor]]:
        def values(prompt_ids, prompt_mask, responses, response_mask):
            model = unwrap_model(self.accelerator, self.trained_models["value_model"])
            model.eval()
            with torch.no_grad():
                return value_logits(model, prompt_ids, prompt_mask, responses, self._packed_by(response_mask))

        return {"values": values}

    def shape_rewards(self, rollout: TrajectoryBatch) -> ShapedRewards:
        config = self.config
        options = PPOShaping(kl_coef=config.kl_coef, kl_estimator=config.kl_estimator, gamma=config.gamma,
                             lam=config.lam, whiten_rewards=config.whiten_rewards)
        score_rewards = None
        if config.turn_credit == "gae":
            last_tokens = turn_last_tokens(rollout.turn_index, rollout.turn_rewards.shape[1])
            score_rewards = turn_end_rewards(rollout.turn_rewards, last_tokens, rollout.turn_counts,
                                             rollout.loss_mask.shape[1])
        return ppo_shaped_rewards(
            rollout.scores, rollout.logprobs, rollout.ref_logprobs, rollout.extras["values"], rollout.loss_mask,
            options, moments=self.collectives.global_moments(local_moments), score_rewards=score_rewards,
        )

    def micro_batch_loss(self, rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor],
                         forward: PolicyForward, step_totals=None) -> MicroBatchLoss:
        values = value_logits(self.update_forward["value_model"], rows["prompt_ids"], rows["prompt_mask"],
                              rows["completion_ids"], self._packed_by(rows["completion_mask"]))
        return ppo_loss(rows, shaped, forward, values, self.config)

    def _packed_by(self, completion_mask: torch.Tensor) -> torch.Tensor | None:
        """The value passes' `packed_by`: the completion mask where `padding_free` packs them, else None."""
        return completion_mask if self.config.padding_free else None


def ppo_loss(rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor], forward: PolicyForward,
             values: torch.Tensor, config: PPOConfig) -> MicroBatchLoss:
    """PPO's loss of one micro-batch: the per-token clipped ratio plus vf_coef times the clipped value loss, both
    over the loss mask. `values` (b, T): the value model's output, with gradient."""
    mask, correction = rows["loss_mask"], forward.correction
    policy_out = clipped_surrogate_token(forward.token.logprobs, forward.old_logprobs, shaped["advantages"], mask,
                                         config.cliprange, correction.token if correction is not None else None)
    value_loss, value_clipfrac = clipped_value_loss(values, rows["values"], shaped["returns"], mask,
                                                    config.cliprange_value)
    stats = {
        "loss/policy_avg": policy_out.loss.detach(),
        "policy/approxkl_avg": policy_out.approxkl,
        "policy/clipfrac_avg": policy_out.clipfrac,
        "loss/value_avg": value_loss.detach(),
        "val/clipfrac_avg": value_clipfrac.detach(),
    }
    loss = policy_out.loss + config.vf_coef * value_loss
    return MicroBatchLoss(loss=loss, entropy=forward.token.entropy, ratio=policy_out.ratio, stats=stats)


def _default_value_model(policy: torch.nn.Module, reward_model) -> torch.nn.Module:
    """A copy of the reward model when it is one (N+ paper: the value starts from the reward model), otherwise the
    policy's weights with a new scalar head."""
    if isinstance(reward_model, torch.nn.Module):
        value = copy.deepcopy(reward_model)
        value.requires_grad_(True)
        return value
    from training_wizard.specs.value_model import value_model_from_policy

    return value_model_from_policy(policy)
