"""What one on-policy iteration records: its metrics (`IterationMetrics.of`, which the loop calls once per iteration
from `OnPolicyTrainer._record_iteration`) and its rows of the sample table (`record_samples`).

A metrics record holds, in this key order (metrics.jsonl keeps it, and users' tooling reads it):
  1. the metrics every on-policy trainer logs (`shared_metrics`): objective/*, the update's statistics, lengths,
     the learning rate, timings, `rewards/<name>` per reward component, `sampling/*` when vLLM sampled,
     `episodes/*` and `tools/*` for episodes, the rollout source's own and the update's corrections;
  2. for GRPO and RLOO, TRL 1.16's metric names beside ours, which are never renamed (`add_trl_names`);
  3. what reward functions logged through TRL's `log_metric` (`reward_log_metrics`), and guards/skipped_batches.
An algorithm hands over its own inputs to part 2 through one hook, `trainer.trl_reward_inputs(rollout, shaped)`;
a trainer whose hook gives None (PPO) logs no TRL names.

TRL's GRPOTrainer and RLOOTrainer log `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<name>/mean` and
`/std`, `kl`, `entropy`, `num_tokens`, `step_time`, `completions/*_length`, `completions/clipped_ratio` and
`clip_ratio/*`; transformers' Trainer adds `loss`, `grad_norm` and `learning_rate`. Where we compute the same
quantity it is logged under TRL's name with TRL's definition; `step_time`, a wall-clock figure, reaches
`state.log_history` only (trainers/algorithms/group.py: `wall_clock_logs`). A completion no reward scored (every reward
function in TRL's form returned None) is left out of `objective/scores`, `reward` and `reward_std`, as TRL's nanmean
and nanstd leave its NaN out; an iteration in which every row was scored keeps the plain means.

Each group of values is one collective and one host sync (collectives.py), called at the same point on every
process.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping

import torch

from training_wizard.core.importance_sampling import ImportanceWeights
from training_wizard.core.turn_credit import turn_mask, turn_tokens
from training_wizard.rollout.trajectory import StopReason, TrajectoryBatch
from training_wizard.specs.reward import RewardSpec
from training_wizard.trainers.loop.environment_failures import failed_episodes
from training_wizard.trainers.loop.teacher import distillation_metrics

# TRL's name -> ours, for values the update or the shared metrics already hold under our name
SAME_VALUES = {"loss": "loss/policy_avg", "learning_rate": "lr", "entropy": "policy/entropy_avg"}


@dataclasses.dataclass(frozen=True)
class TRLRewardInputs:
    """What an algorithm adds to TRL's reward metrics: `std_is_zero`, (B,) bool, the rows counted in
    `frac_reward_zero_std`; `kl_sum`, each row's KL to the reference summed over its tokens where TRL logs `kl` from
    the rollout (None where it does not, or logs it from the loss pass)."""

    std_is_zero: torch.Tensor
    kl_sum: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class IterationMetrics:
    """One iteration's metrics record (`values`, in metrics.jsonl's key order) and the prompt and sampled tokens it
    read over every process (`tokens_read`, which the loop adds to TRL's running `num_input_tokens_seen`; 0 for a
    trainer without TRL's names)."""

    values: dict[str, float]
    tokens_read: int = 0

    @classmethod
    def of(cls, trainer, rollout: TrajectoryBatch, shaped, update, eps: float, lr: float, update_seconds: float,
           started: float | None = None) -> IterationMetrics:
        """The metrics of the iteration that sampled `rollout`, shaped it (`shaped`) and trained on it (`update`,
        an UpdateResult). `eps`: its episodes per second; `lr`: the learning rate its update used; `started`: its
        time.perf_counter() at the start (TRL's step time; None outside the loop). Every process calls it."""
        trl_inputs = trainer.trl_reward_inputs(rollout, shaped)
        with_trl_names = trl_inputs is not None
        tokens = tokens_read(trainer.collectives, trainer.accelerator.device, rollout) if with_trl_names else 0
        values = shared_metrics(trainer, rollout, shaped, update, eps, lr, update_seconds)
        if with_trl_names:
            tokens_seen = trainer.state.num_input_tokens_seen + tokens
            add_trl_names(trainer, values, rollout, shaped, trl_inputs, tokens_seen, started)
        values.update(reward_log_metrics(trainer.collectives, rollout, values, trainer.reward))  # by their names
        if trainer.config.skip_nonfinite_batches:
            values["guards/skipped_batches"] = trainer.state.skipped_batches
        return cls(values, tokens)


# -- 1. the shared metrics ---------------------------------------------------------------------------------------
def shared_metrics(trainer, rollout: TrajectoryBatch, shaped, update, eps: float, lr: float,
                   update_seconds: float) -> dict[str, float]:
    """The metrics of every on-policy trainer (TRL's PPOv2 and RLOO names, ours beside them)."""
    collectives, device, update_stats = trainer.collectives, trainer.accelerator.device, update.stats

    def mean(values: torch.Tensor) -> float:
        return float(collectives.mean(values.float().mean().to(device)))

    seconds = {**rollout.timings, "update": update_seconds}
    timings = {k: float(collectives.mean(torch.tensor(v, device=device))) for k, v in seconds.items()}
    tokens = rollout.completion_mask.sum().float().to(device)  # every token sampled or read
    metrics = {
        "eps": eps,
        "objective/kl": mean(shaped.kl),
        "objective/entropy": mean(-(rollout.logprobs * rollout.loss_mask).sum(-1)),
        "objective/non_score_reward": mean(shaped.non_score_reward),
        "objective/rlhf_reward": mean(shaped.rlhf_reward),
        "objective/scores": mean(rollout.scores),
        **update_stats,
        # RLOO has no value model: 0 keeps TRL's metric names identical for both trainers.
        "val/clipfrac_avg": update_stats.get("val/clipfrac_avg", 0.0),
        "val/num_eos_tokens": float(collectives.sum(rollout.has_stop.sum().float().to(device))),
        "completions/mean_length": mean(rollout.loss_mask.sum(-1)),
        "lr": lr,
        "episode": trainer.state.episode,
        "time/generation": timings["generation"] + timings["logprobs"],
        "time/scoring": timings["scoring"],
        "time/update": timings["update"],
        "tokens_per_s": float(collectives.sum(tokens)) / max(sum(timings.values()), 1e-9),
    }
    for name, values in rollout.components.items():
        metrics[f"rewards/{name}"] = component_mean(collectives, device, values)
    if rollout.sampling_logprobs is not None:
        weights = trainer.correction_weights(rollout.logprobs, rollout.sampling_logprobs, rollout.loss_mask)
        metrics.update(sampling_metrics(collectives, device, rollout, weights,
                                        trainer.correction_mode.startswith("sequence")))
    if rollout.episode_stats:
        metrics.update(episode_metrics(collectives, device, rollout))
        metrics["episodes/failed_total"] = trainer.state.failed_episodes
        if rollout.turn_counts is not None:
            metrics.update(turn_metrics(collectives, device, rollout, shaped.advantages))
    if trainer.config.distillation_coef > 0.0:  # a teacher beside the algorithm (trainers/loop/teacher.py)
        metrics.update(distillation_metrics(collectives, device, rollout))
    metrics.update(trainer.rollout_source.metrics(rollout, trainer.state.iteration))
    metrics.update(update.corrections)  # the update's own correction weights, in place of the batch's above
    return metrics


def component_mean(collectives, device, values: list[float]) -> float:
    """Mean of a reward component over every process's completions it scored: a reward function in TRL's form
    that returned None for a completion leaves NaN there (specs/reward_functions.py). NaN when none scored."""
    local = torch.tensor(values, dtype=torch.float32)
    scored = ~local.isnan()
    sums = collectives.sum(torch.stack([local[scored].sum(), scored.sum().float()]).to(device))
    return float(sums[0] / sums[1]) if sums[1] > 0 else math.nan


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


def turn_metrics(collectives, device, batch, advantages: torch.Tensor) -> dict[str, float]:
    """Credit per turn in episodes (docs/algorithms.md): `turns/advantage_mean_<k>`, the mean advantage of turn k
    (its tokens' mean, one per episode) over the episodes that reached it, and `turns/episode_share_<n>`, the
    share of episodes that lasted n turns; k, n = 1 .. the most turns of any episode on any process."""
    turns = collectives.max_int(int(batch.turn_counts.max()))
    numbers = torch.arange(turns, device=batch.turn_counts.device)
    if advantages.dim() == 1:
        per_turn = advantages.float().unsqueeze(-1).expand(-1, turns)
    else:
        in_turn = turn_tokens(batch.turn_index, turns).float()
        per_turn = (advantages.float().unsqueeze(1) * in_turn).sum(-1) / in_turn.sum(-1).clamp(min=1)
    reached = turn_mask(batch.turn_counts, turns).float()
    lasted = (batch.turn_counts.unsqueeze(-1) == numbers.unsqueeze(0) + 1).float()
    advantage_sums, reached_counts, lasted_counts = collectives.sum(
        torch.stack([(per_turn * reached).sum(0), reached.sum(0), lasted.sum(0)]).to(device))
    episodes = float(reached_counts[0]) if turns else 1.0
    metrics = {f"turns/advantage_mean_{k + 1}": float(advantage_sums[k] / reached_counts[k].clamp(min=1))
               for k in range(turns)}
    metrics.update({f"turns/episode_share_{n + 1}": float(lasted_counts[n]) / max(episodes, 1.0)
                    for n in range(turns)})
    return metrics


# -- 2. TRL's names (GRPO, RLOO) ----------------------------------------------------------------------------------
def add_trl_names(trainer, metrics: dict[str, float], rollout: TrajectoryBatch, shaped, inputs: TRLRewardInputs,
                  tokens_seen: int, started: float | None) -> None:
    """Add TRL's names to the shared `metrics`, in place, and count the iteration into the trainer's TRL counters
    (`trl_step_time`, and `trl_loss_sum` and `trl_loss_steps` for train()'s training_loss). `tokens_seen`: the
    running token count with this iteration's (TRL's `num_tokens`)."""
    collectives, device, config = trainer.collectives, trainer.accelerator.device, trainer.config
    lengths = completion_metrics(collectives, device, rollout)
    steps = config.num_ppo_epochs * config.num_mini_batches
    rewards = reward_metrics(collectives, device, rollout, inputs.std_is_zero, inputs.kl_sum, shaped.scored)
    if "objective/scores" in rewards:  # some rows went unscored: our score mean leaves them out too
        metrics["objective/scores"] = rewards.pop("objective/scores")
    trl = {**lengths, **rewards}
    trl.update({name: metrics[ours] for name, ours in SAME_VALUES.items() if ours in metrics})
    # a value the trainer already logs under TRL's name (GRPO's update: entropy, kl) is the one kept
    metrics.update({name: value for name, value in trl.items() if name not in metrics})
    metrics["num_tokens"] = float(tokens_seen)
    trainer.trl_step_time = (time.perf_counter() - started) / steps if started is not None else 0.0
    if "loss" in metrics:  # train()'s training_loss: the mean over the optimizer steps it ran
        trainer.trl_loss_sum += metrics["loss"] * steps
        trainer.trl_loss_steps += steps
    for name, values in rollout.components.items():
        component = metrics[f"rewards/{name}/mean"] = metrics[f"rewards/{name}"]
        metrics[f"rewards/{name}/std"] = component_std(collectives, device, values, component)


def completion_metrics(collectives, device, rollout: TrajectoryBatch) -> dict[str, float]:
    """TRL's `completions/*` over every process's completions: lengths in loss tokens; a completion is clipped when
    the length budget cut it; the terminated ones' figures are 0 when none ended."""
    lengths = rollout.loss_mask.sum(-1).float()
    done = rollout.has_stop.to(lengths.device)
    ended = lengths[done]
    sums = collectives.sum(torch.stack([
        lengths.new_tensor(lengths.numel()), lengths.sum(), (~done).sum().float(), ended.sum(),
        ended.new_tensor(ended.numel())]).double().to(device))
    rows, length_sum, clipped, ended_sum, ended_rows = sums.tolist()
    lowest = -math.inf
    extremes = collectives.max(torch.stack([
        lengths.max(), -lengths.min(), ended.max() if ended.numel() else lengths.new_tensor(lowest),
        -ended.min() if ended.numel() else lengths.new_tensor(lowest)]).to(device))
    longest, shortest, longest_ended, shortest_ended = extremes.tolist()
    return {
        "completions/mean_length": length_sum / max(rows, 1.0),
        "completions/min_length": -shortest,
        "completions/max_length": longest,
        "completions/clipped_ratio": clipped / max(rows, 1.0),
        "completions/mean_terminated_length": ended_sum / ended_rows if ended_rows else 0.0,
        "completions/min_terminated_length": -shortest_ended if ended_rows else 0.0,
        "completions/max_terminated_length": longest_ended if ended_rows else 0.0,
    }


def tokens_read(collectives, device, rollout: TrajectoryBatch) -> int:
    """The prompt and sampled tokens of a batch over every process (what TRL's `num_tokens` adds up). An episode's
    environment tokens are not counted, so the count is the same whatever an environment inserts."""
    return int(collectives.sum((rollout.prompt_mask.sum() + rollout.loss_mask.sum()).to(device)))


def reward_metrics(collectives, device, rollout: TrajectoryBatch, std_is_zero: torch.Tensor,
                   kl_sum: torch.Tensor | None, scored: torch.Tensor | None = None) -> dict[str, float]:
    """TRL's `reward` (mean score) and `reward_std` (unbiased) over every process's rows `scored` marks (default:
    all), `frac_reward_zero_std` (the share of all rows marked in `std_is_zero`) and, when `kl_sum` is given, `kl`
    as TRL's token mean over every process's loss tokens; with `objective/scores`, the scored rows' mean, when some
    rows went unscored. One all-reduce for all of them."""
    scores = rollout.scores.double()
    kept = scores[scored.to(scores.device)] if scored is not None else scores
    kl = kl_sum.double().sum() if kl_sum is not None else scores.new_tensor(0.0)
    sums = collectives.sum(torch.stack([
        scores.new_tensor(scores.numel()), kept.new_tensor(kept.numel()), kept.sum(), (kept**2).sum(),
        std_is_zero.double().sum(), kl, rollout.loss_mask.sum().double().to(scores.device),
        scores.new_tensor(scores.numel() - kept.numel())]).to(device))
    rows, scored_rows, total, squares, zero_std, kl_total, tokens, unscored = sums.tolist()
    mean = total / scored_rows if scored_rows else (math.nan if unscored else 0.0)
    variance = (squares - scored_rows * mean**2) / (scored_rows - 1) if scored_rows > 1 else math.nan
    metrics = {"reward": mean, "reward_std": math.sqrt(max(variance, 0.0)) if scored_rows > 1 else math.nan,
               "frac_reward_zero_std": zero_std / max(rows, 1.0)}
    if kl_sum is not None:
        metrics["kl"] = kl_total / max(tokens, 1.0)
    if unscored:
        metrics["objective/scores"] = mean
    return metrics


def component_std(collectives, device, values: list[float], mean: float) -> float:
    """Unbiased standard deviation of a reward component over every process's completions it scored, around its
    global `mean` (TRL's nanstd); NaN when fewer than two were scored."""
    local = torch.tensor(values, dtype=torch.float64)
    kept = local[~local.isnan()]
    sums = torch.stack([((kept - mean) ** 2).sum(), torch.tensor(float(len(kept)), dtype=torch.float64)])
    squares, count = (float(x) for x in collectives.sum(sums.to(device)))
    return math.sqrt(squares / (count - 1)) if count > 1 else math.nan


# -- 3. what reward functions logged ------------------------------------------------------------------------------
def reward_log_metrics(collectives, rollout: TrajectoryBatch, taken: Mapping[str, Any],
                       reward: Any = None) -> dict[str, float]:
    """{name: mean of every value logged under it through TRL's `log_metric` on every process}, by sorted name,
    leaving out the names in `taken` (the trainer's own metrics keep their meaning). Every process calls it once per
    iteration, with or without metrics of its own: a function may log a name on some processes only, so the names
    travel with the values (`Collectives.gather_json`) and no process waits in a collective another one skipped. A
    `reward` that never logs (a reward model, a spec without `score_logging` of its own: the same on every process)
    costs no collective."""
    if reward is not None and not can_log(reward):
        return {}
    totals: dict[str, list[float]] = {}
    for local in collectives.gather_json({name: [sum(values), len(values)]
                                             for name, values in rollout.logged_metrics.items()}):
        for name, (total, count) in local.items():
            summed = totals.setdefault(name, [0.0, 0])
            summed[0] += total
            summed[1] += count
    return {name: total / count for name, (total, count) in sorted(totals.items())
            if count and name not in taken}


def can_log(reward: Any) -> bool:
    """Whether the trainer's reward can hand over logs: a RewardSpec whose class has its own `score_logging`."""
    return isinstance(reward, RewardSpec) and type(reward).score_logging is not RewardSpec.score_logging


# -- the sample table ----------------------------------------------------------------------------------------------
def record_samples(samples, state, rollout: TrajectoryBatch, rows: int, probe: bool = False):
    """The first `rows` rows of `rollout` into the sample table `samples` at the run's `state` (step, episode):
    query, response, score, each reward component and each column the reward's functions logged through TRL's
    `log_extra`; the rich table (None on processes other than the main one)."""
    shown = min(rows, rollout.num_rows)
    return samples.record(state.iteration, state.episode, rollout.queries[:shown], rollout.completions[:shown],
                          rollout.scores[:shown].tolist(),
                          {name: list(values[:shown]) for name, values in rollout.components.items()}, probe=probe,
                          columns={name: list(values[:shown]) for name, values in rollout.logged_columns.items()})
