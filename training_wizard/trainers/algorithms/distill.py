"""DistillationTrainer: on-policy distillation on the shared loop (TRL 1.16's DistillationTrainer; "On-Policy
Distillation of Language Models", Agarwal et al. 2024; the sampled-token form of veRL's and slime's on-policy
distillation). Math in core/distillation.py.

What distillation adds to the loop in trainers/loop/on_policy.py:
- the teacher: a frozen model prepared like the reference (trainers/loop/teacher.py: sharded under ZeRO-3 and
  FSDP2); in the sampled-token forms its logprob of every sampled token comes from one no-grad rollout pass;
- step 6, `shape_rewards`: no reward is needed. The sampled-token forms turn each loss token's reverse KL
  estimate into its negative advantage; the JSD reads no advantage (zeros);
- step 7, `micro_batch_loss`: "jsd" runs the teacher over the micro-batch (no grad) and takes TRL's generalized
  JSD of the student's and teacher's logits over the loss mask; the sampled forms take the clipped per-token
  policy gradient of their advantages. Both are token sums over the whole optimizer step divided by its token
  count on every process (`optimizer_step_totals`), TRL's reduction, so the split into micro-batches and processes
  never changes the gradient. Tokens outside the loss mask (an environment's) carry no loss.
- metrics: distill/divergence (per loss token), distill/teacher_logprob and distill/student_logprob (of the
  sampled tokens), distill/agreement (JSD: the share of tokens where the student's argmax is the teacher's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_wizard.core.advantages import ShapedRewards
from training_wizard.core.distillation import generalized_jsd, sampled_token_reverse_kl
from training_wizard.core.grpo import GRPOLossOptions, StepTokens, aggregate_loss, per_token_loss
from training_wizard.core.logprobs import logprobs_and_entropy, selective_logprobs
from training_wizard.errors import UserError
from training_wizard.rollout.scoring import response_logits
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.trainers.algorithms.group import GroupTrainer
from training_wizard.trainers.config.distill import DistillationConfig
from training_wizard.trainers.loop.iteration_metrics import TRLRewardInputs
from training_wizard.trainers.loop.teacher import TEACHER_LOGPROBS, loss_token_sums
from training_wizard.trainers.loop.update import MicroBatchLoss, PolicyForward



@dataclass
class TeacherForward(PolicyForward):
    """The student's pass over one micro-batch with its logits kept (with gradient), and the teacher's logits at
    the same positions (no grad): (b, T, V) each, what the full-vocabulary JSD reads."""

    student_logits: torch.Tensor | None = None
    teacher_logits: torch.Tensor | None = None


def no_reward(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """Distillation's reward when none is given: 0 for every completion (the teacher is the signal)."""
    return [0.0] * len(completions)


def vocabulary_size(model: torch.nn.Module) -> int | None:
    """The width of a causal LM's logits, from its config (a partitioned model's weights have no shape)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "vocab_size", None)


def check_same_vocabulary(student: torch.nn.Module, teacher: torch.nn.Module) -> None:
    """The divergence compares the two next-token distributions token by token: one vocabulary, one line if not."""
    mine, theirs = vocabulary_size(student), vocabulary_size(teacher)
    if mine is not None and theirs is not None and mine != theirs:
        raise UserError(f"teacher_model: its vocabulary has {theirs} tokens, the student's (model) {mine}; "
                        "distillation needs a teacher with the student's tokenizer and vocabulary")


class DistillationTrainer(GroupTrainer):
    """The student (`policy`) samples, the `teacher_model` scores the same tokens, the student learns the divergence.

    `DistillationTrainer(config=DistillationConfig(...), tokenizer=..., policy=..., teacher_model=...,
    train_dataset=..., reward_model=None, eval_dataset=...)`; TRL's constructor: trl/trainers.py. A reward (or an
    environment's) is scored and logged, not trained on.
    """

    config: DistillationConfig

    def __init__(self, *, config: DistillationConfig, tokenizer, policy, teacher_model: torch.nn.Module,
                 train_dataset, reward_model=None, **rest):
        if teacher_model is None:
            raise UserError("teacher_model: required (the model whose distribution the student learns)")
        check_same_vocabulary(policy, teacher_model)
        if reward_model is None and rest.get("environment_factory") is None:
            reward_model = no_reward
        super().__init__(config=config, tokenizer=tokenizer, policy=policy, reward_model=reward_model,
                         train_dataset=train_dataset, teacher_model=teacher_model, **rest)

    # -- step 6 ------------------------------------------------------------------------------------------------
    def shape_rewards(self, rollout: TrajectoryBatch) -> ShapedRewards:
        """The sampled-token forms: each loss token's advantage is minus its reverse KL estimate (0 elsewhere),
        and a row's non-score reward their sum. The JSD: zero advantages (its loss reads none)."""
        zeros = torch.zeros_like(rollout.scores, dtype=torch.float32)
        estimator = self.config.sampled_estimator
        if estimator is None:
            advantages, non_score = torch.zeros_like(rollout.logprobs), zeros
        else:
            estimate = sampled_token_reverse_kl(rollout.logprobs, rollout.extras[TEACHER_LOGPROBS],
                                                rollout.loss_mask, estimator)  # (B, T), 0 outside the mask
            advantages, non_score = -estimate, -loss_token_sums(estimate, rollout.loss_mask)
        return ShapedRewards(advantages=advantages, kl=zeros, non_score_reward=non_score,
                             rlhf_reward=rollout.scores.float() + non_score, loss_mask=rollout.loss_mask)

    def trl_reward_inputs(self, rollout: TrajectoryBatch, shaped: ShapedRewards) -> TRLRewardInputs:
        """One completion per prompt: no group has a standard deviation, so none counts as zero (as RLOO's groups
        of fewer than two scored rows); no KL to a reference."""
        return TRLRewardInputs(std_is_zero=torch.zeros_like(rollout.scores, dtype=torch.bool), kl_sum=None)

    # -- step 7 ------------------------------------------------------------------------------------------------
    def optimizer_step_totals(self, shaped: ShapedRewards, order: torch.Tensor) -> list[StepTokens]:
        """Loss tokens of each mini-batch of this epoch, on this process and over all: one all-reduce per epoch."""
        plan = self.plan
        per_row = shaped.loss_mask.sum(-1).float()[order.to(shaped.loss_mask.device)]
        local = per_row.reshape(-1, plan.local_mini_batch_size).sum(-1)
        world = self.collectives.sum(local.to(self.accelerator.device))
        return [StepTokens(float(mine), float(every), self.config.gradient_accumulation_steps, plan.world_size)
                for mine, every in zip(local.tolist(), world.tolist())]

    def policy_forward(self, rows: dict[str, torch.Tensor], stale=None) -> PolicyForward:
        """The sampled-token forms: the shared pass. The JSD: the student's logits kept for the divergence, and
        the teacher's at the same positions."""
        if self.config.sampled_estimator is not None:
            return super().policy_forward(rows, stale)
        config = self.config
        ids, mask, responses = rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"]
        student = response_logits(self.update_forward["model"], ids, mask, responses)  # (b, T, V), with gradient
        with torch.no_grad(), self.accelerator.autocast():
            teacher = response_logits(self.teacher, ids, mask, responses)  # (b, T, V)
        token = logprobs_and_entropy(student, responses, config.temperature)
        old = token.logprobs.detach() if config.single_update_pass else rows["logprobs"]
        return TeacherForward(token, old, None, student_logits=student, teacher_logits=teacher)

    def micro_batch_loss(self, rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor],
                         forward: PolicyForward, step_totals: StepTokens) -> MicroBatchLoss:
        return distillation_loss(rows, shaped, forward, step_totals, self.config)


def distillation_loss(rows: dict[str, torch.Tensor], shaped: dict[str, torch.Tensor], forward: PolicyForward,
                      step: StepTokens, config: DistillationConfig) -> MicroBatchLoss:
    """One micro-batch's distillation loss and statistics over the loss mask (`step`: the token counts of its
    optimizer step). "jsd": `forward` is a `TeacherForward`; the sampled forms read `shaped["advantages"]` and the
    rollout's teacher logprobs."""
    mask, token, old = rows["loss_mask"], forward.token, forward.old_logprobs
    scale = step.accumulation_steps * step.processes / max(step.world, 1.0)

    def step_mean(values: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of a token mean over its whole optimizer step, every process (grpo.py)."""
        return values.detach().float()[mask].sum() * scale  # the loss tokens alone, in order: exact wherever they sit

    stats: dict[str, torch.Tensor] = {}
    if config.sampled_estimator is None:
        terms = generalized_jsd(forward.student_logits, forward.teacher_logits, mask, config.beta,
                                config.temperature)  # (b, T): 0 and no gradient outside the mask
        loss = terms.per_token[mask].sum() * scale
        divergence = terms.per_token
        teacher_logprobs = selective_logprobs(forward.teacher_logits, rows["completion_ids"], config.temperature)
        same = forward.student_logits.detach().argmax(-1) == forward.teacher_logits.argmax(-1)
        stats["distill/agreement"] = step_mean(same.float())
        ratio = torch.exp(token.logprobs.detach() - old)
        clipped = torch.zeros_like(mask)
    else:
        weights = forward.correction.token if forward.correction is not None else None
        options = GRPOLossOptions(loss_type="dapo", epsilon=config.cliprange)
        out = per_token_loss(token.logprobs, old, shaped["advantages"], mask, options, token_weights=weights)
        loss = aggregate_loss(out.per_token, mask, "dapo", step, config.response_length)
        divergence, teacher_logprobs = -shaped["advantages"], rows[TEACHER_LOGPROBS]
        ratio, clipped = out.ratio, out.low_clipped | out.high_clipped
    stats.update({
        "loss/policy_avg": loss.detach(),
        "policy/approxkl_avg": step_mean(0.5 * (token.logprobs.detach() - old) ** 2),
        "policy/clipfrac_avg": step_mean(clipped.float()),
        "distill/divergence": step_mean(divergence),
        "distill/teacher_logprob": step_mean(teacher_logprobs),
        "distill/student_logprob": step_mean(token.logprobs),
        "entropy": step_mean(token.entropy),
    })
    return MicroBatchLoss(loss=loss, entropy=token.entropy, ratio=ratio, stats=stats)
