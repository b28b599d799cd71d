"""GRPO's group advantages, importance weights, per-token clipped loss and loss aggregation.

Sources: "DeepSeekMath" (Shao et al. 2024, GRPO), "DAPO" (Yu et al. 2025: clip-higher, token-level loss, dynamic
sampling, overlong filtering), "Understanding R1-Zero-Like Training" (Liu et al. 2025, Dr. GRPO), "Group Sequence
Policy Optimization" (Zheng et al. 2025, GSPO), "MiniMax-M1" (2025, CISPO), "INTELLECT-2" (two-sided clipping,
`delta`), "Beyond the 80/20 Rule" (Wang et al. 2025, training on the highest-entropy tokens), and TRL's GRPO
trainer docs, whose option names these functions take.

B = completions, T = response width. `group_ids` (B,) name the prompt each completion was sampled from
(core/groups.py). `mask` (B, T) bool is True at the tokens that carry loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_wizard.core.advantages import Moments, ShapedRewards, local_moments
from training_wizard.core.groups import from_grid, group_members, on_grid
from training_wizard.core.kl import kl_per_token
from training_wizard.core.losses import clipped_ratio_loss
from training_wizard.core.masking import masked_mean, masked_sum, truncation_mask

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo")
# Added to the standard deviation before dividing, as TRL's GRPO trainer does: a group whose rewards all agree
# gets advantage 0, not 0 / 0.
STD_EPSILON = 1e-4


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: str = "group", moments: Moments = local_moments,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantages: each reward minus its group's mean, divided by a standard deviation (DeepSeekMath eq. 3).

    rewards, group_ids: (B,) -> (advantages (B,), std_is_zero (B,) bool).
    scale_rewards: "group" divides by the group's standard deviation (the paper), "batch" by the whole batch's
    (`moments` gives it over every process; "A Tricks or Traps? A Deep Dive into RL for LLM Reasoning" argues for
    it), "none" does not divide (Dr. GRPO: the division favours groups that are nearly all right or all wrong).
    Standard deviations are unbiased (n - 1), and STD_EPSILON is added before dividing. `std_is_zero` marks rows
    whose scale (the group's, or the batch's for "batch") is zero: TRL's `frac_reward_zero_std` is its mean.
    `scored` (B,) bool (`core.advantages.scored_rows`): rows no reward scored are left out of every mean and
    standard deviation and get advantage 0, as TRL 1.16's nanmean / nanstd leave them out; a group with fewer than
    two scored rows has no standard deviation (not zero) and advantage 0 on every row.
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; expected 'group', 'batch' or 'none'")
    members = group_members(group_ids)
    grid = on_grid(rewards, members)
    valid = None
    if scored is None or bool(scored.all()):
        centred = from_grid(grid - grid.mean(0, keepdim=True), members)
        group_std = grid.std(0, unbiased=True, keepdim=True)
    else:
        kept = on_grid(scored.to(rewards.device), members)
        deviation, group_std = scored_group_moments(grid, kept)
        centred = from_grid(deviation, members)
        valid = from_grid(kept & (kept.sum(0, keepdim=True) > 1), members)
    if scale_rewards == "batch":
        std = moments(rewards, scored)[1].clamp(min=0).sqrt().expand_as(rewards)
    else:
        std = from_grid(group_std.expand_as(grid), members)
    advantages = centred if scale_rewards == "none" else centred / (std + STD_EPSILON)
    if valid is not None:
        advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    return advantages, torch.isclose(std, torch.zeros_like(std))


def scored_group_moments(grid: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each scored reward minus its group's mean over the scored rows, 0 elsewhere; each group's unbiased
    standard deviation over them, (1, G), NaN where fewer than two were scored, as TRL's nanstd gives it) of a
    (k, G) grid of rewards and its (k, G) bool grid `kept` of scored rows."""
    count = kept.sum(0, keepdim=True)
    values = torch.where(kept, grid, torch.zeros_like(grid))
    mean = values.sum(0, keepdim=True) / count.clamp(min=1)
    deviation = torch.where(kept, grid - mean, torch.zeros_like(grid))
    variance = (deviation**2).sum(0, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, variance.sqrt(), torch.full_like(variance, float("nan")))
    return deviation, std


def importance_log_weights(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log of the importance ratio each token's loss uses. logprobs (with gradient), old_logprobs: (B, T) -> (B, T).

    "token": log pi(y_t) - log pi_old(y_t), per token (PPO, GRPO).
    "sequence" (GSPO): the sequence's mean per-token log-ratio s_i = (1/|y_i|) sum_t (log pi - log pi_old), written
    per token as sg[s_i] + log pi(y_t) - sg[log pi(y_t)] (the GSPO paper's GSPO-token form, sg = stop gradient):
    every token of a sequence carries the value s_i, and the gradient of exp(.) at token t is exp(s_i) grad log
    pi(y_t). With one advantage per sequence and the same token weight on every token of it, this is GSPO's
    gradient under every loss aggregation here (TRL's (B, 1) sequence weight broadcast over the tokens gives the
    same numbers). With weights that differ within a sequence (top_entropy_quantile, a token-level vLLM
    correction), each token's gradient here takes its own weight, as GSPO-token defines it; TRL's (B, 1) ratio
    spreads the weighted sum over all the sequence's tokens instead.
    """
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    if level == "sequence":
        sequence = masked_mean(log_ratio.detach(), mask, dim=-1).unsqueeze(-1)
        return sequence + logprobs - logprobs.detach()
    raise ValueError(f"unknown importance_sampling_level {level!r}; expected 'token' or 'sequence'")


@dataclass(frozen=True)
class GRPOLossOptions:
    """The loss options of GRPOConfig (TRL's names). epsilon_high None means epsilon (symmetric clipping)."""

    loss_type: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    beta: float = 0.0

    @property
    def upper(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


@dataclass
class PerTokenLoss:
    """per_token: (B, T) loss of each token, with gradient (KL term included); ratio: (B, T) the importance ratio
    that was clipped, detached; low_clipped / high_clipped: (B, T) bool, where the clip took the ratio's gradient
    away (ratio below 1 - epsilon with a negative advantage, above 1 + epsilon_high with a positive one; CISPO: above
    epsilon_high with a positive advantage); kl: (B, T) the per-token k3 KL to the reference, detached (zeros when
    beta is 0)."""

    per_token: torch.Tensor
    ratio: torch.Tensor
    low_clipped: torch.Tensor
    high_clipped: torch.Tensor
    kl: torch.Tensor


def per_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    options: GRPOLossOptions,
    ref_logprobs: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> PerTokenLoss:
    """Each token's GRPO loss. logprobs (with gradient), old_logprobs, ref_logprobs: (B, T); advantages: (B,), or
    (B, T) under credit per turn.

    Clipped losses (grpo, bnpo, dr_grpo, dapo): `core.losses.clipped_ratio_loss`, the one clipped ratio of RLOO and
    PPO too, with `delta` (INTELLECT-2's two-sided clip). cispo (MiniMax-M1): -sg[min(r, epsilon_high)] A log
    pi(y_t), every token keeps a gradient, only its weight is capped (TRL's convention: the cap is epsilon_high itself, not 1 + epsilon_high).
    `token_weights` (B, T), e.g. the top-entropy mask, multiply the policy term. With beta > 0 the k3 estimate of
    KL(pi || pi_ref) = exp(ref - logp) - (ref - logp) - 1 is added per token times beta (DeepSeekMath eq. 4).
    """
    log_weights = importance_log_weights(logprobs, old_logprobs, mask, options.importance_sampling_level)
    gain = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # per token: credit per turn
    if options.loss_type == "cispo":
        ratio = torch.exp(log_weights)
        capped = torch.clamp(ratio, max=options.upper).detach()
        loss = -capped * gain * logprobs
        low_clipped = torch.zeros_like(mask)
        high_clipped = (ratio.detach() > options.upper) & (gain > 0)
        ratio = ratio.detach()
    elif options.loss_type in LOSS_TYPES:
        out = clipped_ratio_loss(log_weights, gain, options.epsilon, options.upper, options.delta)
        loss, ratio, low_clipped, high_clipped = out.loss, out.ratio, out.low_clipped, out.high_clipped
    else:
        raise ValueError(f"unknown loss_type {options.loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    if token_weights is not None:
        loss = loss * token_weights
    kl = torch.zeros_like(logprobs).detach()
    if options.beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs the reference's logprobs")
        kl_term = kl_per_token(logprobs, ref_logprobs, "k3")
        loss = loss + options.beta * kl_term
        kl = kl_term.detach()
    return PerTokenLoss(loss, ratio, low_clipped & mask, high_clipped & mask, kl)


@dataclass(frozen=True)
class StepTokens:
    """Loss tokens of the optimizer step a micro-batch belongs to. local: this process's mini-batch (every
    accumulation micro-batch); world: the same over every process; micro_batches: how many micro-batch losses the
    step's gradient averages (gradient_accumulation_steps x processes: accelerate divides each loss by the
    accumulation steps, data parallel averages over processes)."""

    local: float
    world: float
    accumulation_steps: int
    processes: int
    world_rows: float | None = None  # with dynamic_sampling: the step's rows left in the loss, on every process


def aggregate_loss(
    per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, step: StepTokens, max_completion_length: int
) -> torch.Tensor:
    """One micro-batch's loss, scaled so that the step's averaged gradient is the loss_type's full-batch gradient.

    per_token, mask: (B, T) -> scalar. The update averages the micro-batch losses of a step over accumulation and
    processes (StepTokens); per loss_type the step's loss is:
    - grpo (DeepSeekMath): each sequence's token mean, averaged over sequences;
    - dr_grpo (Dr. GRPO): the token sum divided by sequences x max_completion_length (a constant: no length bias);
    - dapo (DAPO, TRL's default) and cispo: the token sum over the whole step, every process, divided by that
      step's token count: every token weighs the same whatever its sequence's length or micro-batch;
    - bnpo: the same with this process's mini-batch token count (TRL's bnpo divides by the micro-batch's count, so
      its gradient changes with the accumulation split; this one does not, and with one process equals dapo).
    grpo and dr_grpo are means over equal-sized micro-batches, so plain averaging already gives the full batch.
    With `step.world_rows` (dynamic_sampling) their sequence count is the step's rows left in the loss instead: a
    dropped group weighs nothing and does not dilute the others, under every loss_type.
    """
    total = masked_sum(per_token, mask).sum()
    rows_scale = (None if step.world_rows is None
                  else step.accumulation_steps * step.processes / max(step.world_rows, 1.0))
    if loss_type == "grpo":
        per_sequence = masked_mean(per_token, mask, dim=-1)  # a dropped row's is 0
        return per_sequence.mean() if rows_scale is None else per_sequence.sum() * rows_scale
    if loss_type == "dr_grpo":
        if rows_scale is None:
            return total / (per_token.shape[0] * max_completion_length)
        return total * rows_scale / max_completion_length
    if loss_type in ("dapo", "cispo"):
        return total * (step.accumulation_steps * step.processes) / max(step.world, 1.0)
    if loss_type == "bnpo":
        return total * step.accumulation_steps / max(step.local, 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float, pool: torch.Tensor) -> torch.Tensor:
    """Tokens at or above the (1 - quantile) quantile of `pool`'s entropies ("Beyond the 80/20 Rule"; TRL's
    `top_entropy_quantile`): quantile 0.2 keeps the 20% most uncertain tokens. entropy, mask: (B, T); pool: (N,)
    the entropies the threshold is taken over (the micro-batch's real tokens on every process) -> (B, T) bool."""
    if quantile >= 1.0 or pool.numel() == 0:
        return mask.clone()
    threshold = torch.quantile(pool.float(), 1.0 - quantile)
    return (entropy >= threshold) & mask


@dataclass(frozen=True)
class GRPOShapedRewards(ShapedRewards):
    """ShapedRewards with what GRPO's update and metrics need besides: std_is_zero (B,) bool (the row's reward
    scale was zero); ref_logprobs (B, T) for the KL term (the policy's own when beta is 0). GRPO always sets
    loss_mask (truncated completions left out under mask_truncated_completions, constant groups under
    dynamic_sampling)."""

    std_is_zero: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    kept_rows: torch.Tensor | None = None  # (B,) bool under dynamic_sampling: the rows left in the loss


def constant_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) bool: the rows whose group's rewards are all equal (DAPO's dynamic sampling filters these groups out:
    their advantages are all 0, so they carry no policy gradient). rewards, group_ids: (B,). With `scored` (B,)
    bool, only the scored rows' rewards are compared, and a group with fewer than two of them is constant (its
    advantages are 0 as well)."""
    members = group_members(group_ids)
    grid = on_grid(rewards, members)
    if scored is None or bool(scored.all()):
        return from_grid((grid == grid[:1]).all(0, keepdim=True).expand_as(grid), members)
    kept = on_grid(scored.to(rewards.device), members)
    highest = torch.where(kept, grid, torch.full_like(grid, -torch.inf)).amax(0, keepdim=True)
    lowest = torch.where(kept, grid, torch.full_like(grid, torch.inf)).amin(0, keepdim=True)
    constant = (highest == lowest) | (kept.sum(0, keepdim=True) < 2)
    return from_grid(constant.expand_as(grid), members)


def grpo_shaped_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    has_stop: torch.Tensor,
    group_ids: torch.Tensor,
    scale_rewards: str = "group",
    mask_truncated_completions: bool = False,
    moments: Moments = local_moments,
    drop_constant_groups: bool = False,
    scored: torch.Tensor | None = None,
) -> GRPOShapedRewards:
    """GRPO's advantages of one rollout: `group_advantages` of the scores, one per completion (B,). The KL to the
    reference is a loss term (`per_token_loss`), not part of the reward: non_score_reward is 0 and rlhf_reward
    the score; `kl` (B,) is the rollout's summed k3 estimate, for the objective/kl metric. `drop_constant_groups`
    (DAPO's dynamic sampling, without its refill) leaves groups whose rewards are all equal out of the loss mask:
    out of the token counts the dapo/bnpo losses divide by, and out of the KL term. `scored` (B,) bool: see
    `group_advantages`; rows no reward scored get advantage 0 but stay in the loss mask (their tokens still count
    in the loss's normalisation and carry the KL term), as in TRL 1.16."""
    advantages, std_is_zero = group_advantages(scores, group_ids, scale_rewards, moments, scored)
    kl = masked_sum(kl_per_token(logprobs, ref_logprobs, "k3"), mask)
    loss_mask = truncation_mask(mask, has_stop) if mask_truncated_completions else mask
    kept_rows = ~constant_groups(scores, group_ids, scored) if drop_constant_groups else None
    if kept_rows is not None:
        loss_mask = loss_mask & kept_rows.unsqueeze(-1)
    return GRPOShapedRewards(
        advantages=advantages, kl=kl, non_score_reward=torch.zeros_like(scores), rlhf_reward=scores,
        std_is_zero=std_is_zero, loss_mask=loss_mask, ref_logprobs=ref_logprobs, kept_rows=kept_rows,
        scored=scored,
    )
