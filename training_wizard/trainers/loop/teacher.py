"""A teacher beside any on-policy algorithm: its logprob of every sampled token (one no-grad pass in the rollout, as
the reference's), and the on-policy distillation term an RL recipe adds to its reward with
`distillation_coef` (the peers' `opd_kl_coef`: slime's `--opd-kl-coef`, veRL's distillation with task rewards).

The term is the sampled-token reverse KL estimate k1 = log p_student(y_t) - log p_teacher(y_t) (core/distillation.py)
of each loss token; each row's score becomes score - distillation_coef * sum_t k1_t over its loss tokens, before
the algorithm shapes it (an environment's tokens are never counted). The DistillationTrainer
(trainers/algorithms/distill.py) uses the same pass for its sampled-token forms.
"""

from __future__ import annotations

import dataclasses

import torch

from training_wizard.core.distillation import sampled_token_reverse_kl
from training_wizard.errors import UserError
from training_wizard.rollout.scoring import batched_logprobs
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.sharding import prepare_frozen
from training_wizard.trainers.loop.setup import disable_dropout

TEACHER_LOGPROBS = "teacher_logprobs"  # the rollout's per-token teacher pass (`TrajectoryBatch.extras`)


def prepare_teacher(accelerator, config, teacher: torch.nn.Module | None) -> torch.nn.Module | None:
    """The teacher frozen, dropout off, placed like the reference (`prepare_frozen`: a DeepSpeed inference engine
    under ZeRO-3, fully sharded under FSDP2); refused in one line where distillation_coef asks for one and there is
    none."""
    if teacher is None:
        if config.distillation_coef > 0.0:
            raise UserError("teacher_model: required with training.distillation_coef > 0 (a [teacher_model] table, "
                            "or teacher_model= from Python)")
        return None
    disable_dropout(teacher)
    return prepare_frozen(accelerator, teacher)


def teacher_logprobs_pass(trainer):
    """The collector's extra pass of the teacher's logprobs of the sampled tokens at the run's temperature: every
    column is read (an episode's environment tokens are context); the loss mask picks the tokens later."""
    config = trainer.config

    def teacher_logprobs(prompt_ids, prompt_mask, responses, completion_mask):
        # every column, not `completion_mask`'s: the widths, and so the float rounding, stay those of the whole batch
        return batched_logprobs(trainer.teacher, prompt_ids, prompt_mask, responses, torch.ones_like(responses),
                                config.temperature, config.local_rollout_forward_batch_size,
                                share_prompts=trainer.shared_prompt_passes,
                                from_hidden_states=trainer.rollout_head_logprobs)

    return teacher_logprobs


def loss_token_sums(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's sum over its loss tokens, (B, T) -> (B,) float32, accumulated in float64: float32 sums round
    differently with the row's width and where its zeros sit (an environment's tokens), float64 sums of a row's
    float32 values do not (they are exact far below float32's precision)."""
    return torch.where(mask.bool(), values, 0.0).double().sum(-1).float()


def with_distillation_reward(rollout: TrajectoryBatch, coef: float) -> TrajectoryBatch:
    """The rollout whose scores carry -coef * the summed k1 reverse KL to the teacher (unchanged when coef is 0)."""
    if coef == 0.0:
        return rollout
    estimate = sampled_token_reverse_kl(rollout.logprobs, rollout.extras[TEACHER_LOGPROBS], rollout.loss_mask)
    return dataclasses.replace(rollout, scores=rollout.scores - coef * loss_token_sums(estimate, rollout.loss_mask))


def distillation_metrics(collectives, device, rollout: TrajectoryBatch) -> dict[str, float]:
    """distill/reverse_kl (the k1 estimate), distill/teacher_logprob and distill/student_logprob: means over every
    process's loss tokens."""
    mask = rollout.loss_mask.bool()
    teacher, student = rollout.extras[TEACHER_LOGPROBS].float(), rollout.logprobs.float()
    values = [(student - teacher)[mask].double().sum(), teacher[mask].double().sum(), student[mask].double().sum(),
              mask.sum().double()]
    totals = collectives.sum(torch.stack(values).to(device))
    count = float(totals[3].clamp(min=1))
    return {"distill/reverse_kl": float(totals[0]) / count, "distill/teacher_logprob": float(totals[1]) / count,
            "distill/student_logprob": float(totals[2]) / count}
