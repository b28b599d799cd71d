"""Leave-one-out advantages, batch statistics (whitening, reward scaling, normalisation) and the RLOO advantage
assembly (sequence-level and token-level KL).

Batch statistics take a `moments(values, mask) -> (mean, variance)` function. The default, `local_moments`, sees
the tensors it is given; a multi-process trainer passes one that first gathers the global batch
(`Collectives.global_moments`), so the statistics never depend on how many processes share the batch while this
module stays pure torch.

Three standardisations exist in the package and differ on purpose:
- `whiten` here: unbiased variance, (x - mean) * rsqrt(var + 1e-8), over the global batch (advantages, rewards).
- `inverse_std` here: the same variance, but only the scale 1 / std is returned (`whiten_rewards` multiplies by it:
  the mean of the rewards is scaled too, not kept).
- `specs.reward.standardize`: a reward component's `normalize`, over the completions one process scores, with the
  population standard deviation, (x - mean) / (std + 1e-8); it runs inside the reward spec on plain lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from training_wizard.core.groups import from_grid, group_members, on_grid
from training_wizard.core.kl import kl_per_token, sequence_rlhf_reward, token_rewards
from training_wizard.core.masking import masked_sum, truncation_mask

Moments = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


def rloo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE Leave-One-Out: each completion's reward minus the mean reward of the other k-1 of its prompt.

    rewards: (B,); group_ids: (B,) long, the prompt each completion was sampled from (`core.groups`), every group
    of the same size k >= 2. Vectorised: baseline = (sum over the group - own) / (k - 1). Advantages sum to zero
    per prompt. `scored` (B,) bool (`scored_rows`): a row no reward scored is left out of its siblings' baselines
    and gets advantage 0; the others' baseline is the mean over their scored siblings, (sum - own) / (n - 1) with
    n the group's scored rows (TRL 1.16's RLOO trainer), and a row without a scored sibling gets 0 as well.
    """
    members = group_members(group_ids)
    rloo_k = members.shape[0]
    if rloo_k < 2:
        raise ValueError(f"rloo_k must be at least 2 for a leave-one-out baseline, got {rloo_k}")
    grid = on_grid(rewards, members)
    if scored is None or bool(scored.all()):
        baseline = (grid.sum(0, keepdim=True) - grid) / (rloo_k - 1)
        return from_grid(grid - baseline, members)
    kept = on_grid(scored.to(rewards.device), members)
    values = torch.where(kept, grid, torch.zeros_like(grid))
    count = kept.sum(0, keepdim=True)
    baseline = (values.sum(0, keepdim=True) - values) / (count - 1).clamp(min=1)
    advantages = torch.where(kept & (count > 1), grid - baseline, torch.zeros_like(grid))
    return from_grid(advantages, members)


def rows_with_scored_sibling(scored: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the scored rows whose group has another scored row, the ones `rloo_advantages` gives a
    leave-one-out advantage (TRL 1.16's is NaN for the rest: unscored, or alone with 0 / 0 as its baseline)."""
    members = group_members(group_ids)
    kept = on_grid(scored, members)
    return from_grid(kept & (kept.sum(0, keepdim=True) > 1), members)


def scored_rows(components: Mapping[str, Sequence[float]], rows: int) -> torch.Tensor:
    """(rows,) bool: False where every reward component is NaN, the mark of a completion that every reward function
    in TRL's form returned None for (specs/reward_functions.py; TRL 1.16 calls it unscorable). Scores themselves
    stay finite (such a row's is 0), so the non-finite guard still catches a NaN from a broken reward. Without
    components (a reward model, a plain function) every row is scored."""
    if not components:
        return torch.ones(rows, dtype=torch.bool)
    values = torch.tensor([list(values) for values in components.values()], dtype=torch.float64)
    return ~values.isnan().all(0)


def local_moments(values: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, unbiased variance) of the (masked-in) entries; variance 0 for fewer than two entries.

    An empty selection gives (nan, 0): callers check for it before using the mean.
    """
    selected = values[mask] if mask is not None else values.reshape(-1)
    mean = selected.mean() if selected.numel() else selected.new_full((), float("nan"))
    var = selected.var(unbiased=True) if selected.numel() > 1 else selected.new_zeros(())
    return mean, var


def whiten(
    values: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True, moments: Moments = local_moments
) -> torch.Tensor:
    """(values - mean) / std over the (masked) batch; the mean is added back when shift_mean is False.

    Any shape; mask (same shape, bool) selects the entries used for the statistics, and masked-out entries come
    back as zero. A batch with zero variance returns values minus the mean (no division by ~0, no NaN).
    """
    mean, var = moments(values, mask)
    if torch.isnan(mean):  # nothing selected anywhere
        return values
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    if mask is not None:
        whitened = torch.where(mask, whitened, torch.zeros_like(whitened))
    return whitened


def inverse_std(
    values: torch.Tensor, moments: Moments = local_moments, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """1 / sqrt(var + 1e-8) over the (masked-in) batch: the factor `whiten_rewards` multiplies the rewards by
    (0-dim)."""
    return torch.rsqrt(moments(values, mask)[1] + 1e-8)


def normalize_and_clip(
    scores: torch.Tensor, clip_range: float, moments: Moments = local_moments, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Reinforce++ reward normalisation: standardise over the (masked-in) batch, then clamp to [-clip_range,
    clip_range]; masked-out entries come back 0."""
    return whiten(scores, mask, moments=moments).clamp(-clip_range, clip_range)


def reward_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Undiscounted return from each token to the end of its completion. (B, T) -> (B, T), zero where masked."""
    rewards = token_rewards * mask.to(token_rewards.dtype)
    return rewards.flip(-1).cumsum(-1).flip(-1) * mask.to(token_rewards.dtype)


@dataclass(frozen=True)
class ShapedRewards:
    """What the reward shaping of one rollout produced. B = completions, T = response width.

    advantages: (B,) for sequence-level KL, (B, T) (zero on masked positions) for token-level KL or PPO.
    kl: (B,) summed per-token KL estimate; non_score_reward: (B,) the KL part of the reward;
    rlhf_reward: (B,) score + non_score_reward, before any scaling. `returns`: PPO's value targets (B, T).
    `loss_mask`: (B, T) bool, the response tokens that carry loss, where it differs from the response mask
    (mask_truncated_completions); None: every response token. `scored`: (B,) bool, the rows a reward scored, as
    the shaping used them (None: every row); the logged score means leave the others out.
    """

    advantages: torch.Tensor
    kl: torch.Tensor
    non_score_reward: torch.Tensor
    rlhf_reward: torch.Tensor
    returns: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    scored: torch.Tensor | None = None  # (B,) bool, `scored_rows`: False where no reward scored the row


@dataclass(frozen=True)
class RLOOShaping:
    """The options of the RLOO reward shaping (names as in RLOOConfig)."""

    rloo_k: int
    kl_coef: float
    kl_estimator: str = "k1"
    token_level_kl: bool = False
    normalize_reward: bool = False
    reward_clip_range: float | tuple[float, float] = 10.0  # a pair clamps the raw scores (TRL 1.x)
    whiten_rewards: bool = False
    normalize_advantage: bool = False
    mask_truncated_completions: bool = False


def clipped_scores(
    scores: torch.Tensor, options: RLOOShaping, moments: Moments, scored: torch.Tensor | None
) -> torch.Tensor:
    """RLOO's scores after its optional clamp and normalisation (`rloo_shaped_rewards`), the batch statistics
    taken over the `scored` rows (None: every row)."""
    clip = options.reward_clip_range
    if isinstance(clip, (tuple, list)):
        scores = scores.clamp(clip[0], clip[1])
        return whiten(scores, scored, moments=moments) if options.normalize_reward else scores
    return normalize_and_clip(scores, clip, moments, scored) if options.normalize_reward else scores


def rloo_shaped_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    options: RLOOShaping,
    group_ids: torch.Tensor,
    moments: Moments = local_moments,
    has_stop: torch.Tensor | None = None,
    scored: torch.Tensor | None = None,
) -> ShapedRewards:
    """RLOO's rewards and advantages from one rollout (TRL's RLOO trainer; Ahmadian et al. 2024).

    scores: (B,) after missing_eos_penalty; logprobs, ref_logprobs: (B, T) at the sampling temperature;
    mask: (B, T) bool, the loss mask (the tokens the policy sampled); group_ids: (B,) the prompt of each row.

    Sequence level (default): rlhf_reward = score - kl_coef * sum_t kl_t, advantage = rlhf_reward minus the mean
    of the other k - 1 completions of the prompt. Token level (`token_level_kl`, Reinforce++): each token's
    advantage is its KL-shaped reward-to-go minus the same leave-one-out baseline of the whole-completion reward.
    Optional steps, in order: a (min, max) reward_clip_range clamps the raw scores (TRL 1.x's RLOO clamps before
    the KL penalty), normalize_reward (standardise; then clamp to +-c when reward_clip_range is one number c),
    whiten_rewards (scale the rlhf rewards by 1 / std), normalize_advantage (whiten the advantages, masked for
    token level). mask_truncated_completions (needs has_stop (B,) bool) sets loss_mask: the response mask without
    the completions that have no stop token; their rewards still enter the baselines.
    `scored` (B,) bool (`scored_rows`): rows no reward scored are left out of the baselines and of every batch
    statistic, and get advantage 0 (TRL 1.16), as does a lone scored row in its group; they stay in the loss mask.
    """
    kl = kl_per_token(logprobs, ref_logprobs, options.kl_estimator) * mask
    scores = clipped_scores(scores, options, moments, scored)
    if options.token_level_kl:
        per_token = token_rewards(scores, kl, mask, options.kl_coef)
        rlhf_reward = per_token.sum(-1)
        non_score_reward = rlhf_reward - scores
    else:
        rlhf_reward, non_score_reward = sequence_rlhf_reward(scores, kl, mask, options.kl_coef)
    scale = inverse_std(rlhf_reward, moments, scored) if options.whiten_rewards else 1.0
    sequence_advantages = rloo_advantages(rlhf_reward * scale, group_ids, scored)
    # TRL 1.16 whitens over the advantages that are not NaN: a lone scored row's 0 / 0 baseline leaves it out too
    statistics_mask = None if scored is None else rows_with_scored_sibling(scored, group_ids)
    if options.token_level_kl:
        baseline = rlhf_reward * scale - sequence_advantages
        advantages = (reward_to_go(per_token * scale, mask) - baseline.unsqueeze(-1)) * mask
        rows = statistics_mask
        statistics_mask = mask if rows is None else mask & rows.unsqueeze(-1)
        if rows is not None and not bool(rows.all()):
            # a row without a baseline has its own reward as one, so its tokens would keep their KL parts: zeroed
            advantages = torch.where(statistics_mask, advantages, torch.zeros_like(advantages))
    else:
        advantages = sequence_advantages
    if options.normalize_advantage:
        advantages = whiten(advantages, statistics_mask, moments=moments)
    loss_mask = None
    if options.mask_truncated_completions:
        if has_stop is None:
            raise ValueError("mask_truncated_completions needs has_stop, which completions ended with the stop token")
        loss_mask = truncation_mask(mask, has_stop)
    return ShapedRewards(
        advantages=advantages, kl=masked_sum(kl, mask), non_score_reward=non_score_reward, rlhf_reward=rlhf_reward,
        loss_mask=loss_mask, scored=scored,
    )
