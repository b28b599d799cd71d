"""Statistics of a trajectory batch over every process that the metrics of an iteration report: reward components
(which a reward function may leave unscored for some rows) and the vLLM sampling gap. Each is one or two
collectives (collectives.py), called at the same point on every process."""

from __future__ import annotations

import math

import torch

from training_wizard.core.importance_sampling import ImportanceWeights


def component_mean(collectives, device, values: list[float]) -> float:
    """Mean of a reward component over every process's completions it scored: a reward function in TRL's form
    that returned None for a completion leaves NaN there (specs/reward_functions.py). NaN when none scored."""
    local = torch.tensor(values, dtype=torch.float32)
    scored = ~local.isnan()
    sums = collectives.sum(torch.stack([local[scored].sum(), scored.sum().float()]).to(device))
    return float(sums[0] / sums[1]) if sums[1] > 0 else math.nan


def component_std(collectives, device, values: list[float], mean: float) -> float:
    """Unbiased standard deviation of a reward component over every process's completions it scored, around its
    global `mean` (TRL's nanstd); NaN when fewer than two were scored."""
    local = torch.tensor(values, dtype=torch.float64)
    kept = local[~local.isnan()]
    sums = torch.stack([((kept - mean) ** 2).sum(), torch.tensor(float(len(kept)), dtype=torch.float64)])
    squares, count = (float(x) for x in collectives.sum(sums.to(device)))
    return math.sqrt(squares / (count - 1)) if count > 1 else math.nan


def sampling_metrics(collectives, device, batch, weights: ImportanceWeights, per_sequence: bool) -> dict[str, float]:
    """TRL's sampling/* metrics: how far the sampler's logprobs are from the training pass's (over the loss tokens
    of every process), and the bounded correction `weights` (per token, or per completion in sequence modes)."""
    mask = batch.loss_mask
    difference = (batch.logprobs - batch.sampling_logprobs).abs()[mask].float().to(device)
    ratios = (weights.sequence if per_sequence else weights.token[mask]).float().to(device)
    sums = collectives.sum(torch.stack([difference.sum(), difference.new_tensor(difference.numel()),
                                        ratios.sum(), ratios.new_tensor(ratios.numel())]))
    none = torch.tensor(0.0, device=device)
    highest = collectives.max(torch.stack([
        difference.max() if difference.numel() else none, ratios.max() if ratios.numel() else none,
        -ratios.min() if ratios.numel() else none,
    ]))
    return {
        "sampling/sampling_logp_difference/mean": float(sums[0] / sums[1].clamp(min=1)),
        "sampling/sampling_logp_difference/max": float(highest[0]),
        "sampling/importance_sampling_ratio/min": float(-highest[2]),
        "sampling/importance_sampling_ratio/mean": float(sums[2] / sums[3].clamp(min=1)),
        "sampling/importance_sampling_ratio/max": float(highest[1]),
    }


def episode_metrics(collectives, device, batch) -> dict[str, float]:
    """Episodes of several turns (docs/environments.md): replies and environment tokens per episode, the share
    of episodes each stop reason ended, and the tool counts with TRL's names and definitions (calls per episode,
    failures per call) beside ours, and the share of episodes whose environment failed (environment_failures.py).
    Sums over every process's rows."""
    from training_wizard.rollout.trajectory import StopReason
    from training_wizard.trainers.environment_failures import failed_episodes

    loss, real, stats = batch.loss_mask, batch.completion_mask, batch.episode_stats
    replies = loss[:, 0].float() + (loss[:, 1:] & ~loss[:, :-1]).sum(-1).float()  # runs of the model's tokens
    reasons = {"stop_token": StopReason.STOP_TOKEN, "length": StopReason.LENGTH, "turns": StopReason.TURNS,
               "environment": StopReason.ENVIRONMENT_DONE, "tool_budget": StopReason.TOOL_BUDGET}
    per_row = [replies, (real & ~loss).sum(-1).float(), torch.ones_like(replies)]
    per_row += [(batch.stop_reason == int(code)).float() for code in reasons.values()]
    per_row += [stats[name].float() for name in ("calls", "failures", "malformed", "errors", "drift")]
    per_row += [(stats["calls"] > 0).float(), failed_episodes(batch)]
    (replies_sum, environment_tokens, episodes, *stopped, calls, failures, malformed, errors, drift, with_call,
     failed) = collectives.sum(torch.stack([values.sum() for values in per_row]).to(device))
    metrics = {
        "episodes/replies_mean": float(replies_sum / episodes),
        "episodes/environment_tokens_mean": float(environment_tokens / episodes),
        "episodes/tokenization_drift": float(drift / episodes),
        "episodes/environment_errors_mean": float(errors / episodes),
        "episodes/failed": float(failed / episodes),
        "tools/call_frequency": float(calls / episodes),
        "tools/failure_frequency": float(failures / calls.clamp(min=1)),
        "tools/malformed_frequency": float(malformed / (calls + malformed).clamp(min=1)),
        "tools/episodes_with_call": float(with_call / episodes),
    }
    metrics.update({f"episodes/stopped_by_{name}": float(value / episodes) for name, value in zip(reasons, stopped)})
    return metrics

