"""TRL 1.16's metric names for GRPO and RLOO, logged beside ours (ours are never renamed) by every GRPO and RLOO
run, recipe or Python API.

TRL's GRPOTrainer and RLOOTrainer log `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<name>/mean` and
`/std`, `kl`, `entropy`, `num_tokens`, `step_time`, `completions/*_length`, `completions/clipped_ratio` and
`clip_ratio/*`; transformers' Trainer adds `loss`, `grad_norm` and `learning_rate`, and prefixes evaluation's with
`eval_`. Where we compute the same quantity it is logged under TRL's name with TRL's definition; `step_time`, a
wall-clock figure, reaches `state.log_history` only (`wall_clock_logs`). Each group of values below is one
collective and one host sync (collectives.py), not one per value.
"""

from __future__ import annotations

import math
import time

import torch

from training_wizard.core.grpo import group_advantages
from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.trainers.rollout_metrics import component_std

# TRL's name -> ours, for values the update or the shared metrics already hold under our name
SAME_VALUES = {"loss": "loss/policy_avg", "learning_rate": "lr", "entropy": "policy/entropy_avg"}


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
                   kl_sum: torch.Tensor | None) -> dict[str, float]:
    """TRL's `reward` (mean score), `reward_std` (unbiased, over every process), `frac_reward_zero_std` (the share
    of completions marked in `std_is_zero`: the trainer's `reward_std_is_zero`) and, when `kl_sum` (each row's KL summed over its tokens) is
    given, `kl` as TRL's token mean over every process's loss tokens; one all-reduce for all of them."""
    scores = rollout.scores.double()
    kl = kl_sum.double().sum() if kl_sum is not None else scores.new_tensor(0.0)
    sums = collectives.sum(torch.stack([
        scores.new_tensor(scores.numel()), scores.sum(), (scores**2).sum(), std_is_zero.double().sum(), kl,
        rollout.loss_mask.sum().double().to(scores.device)]).to(device))
    rows, total, squares, zero_std, kl_total, tokens = sums.tolist()
    mean = total / max(rows, 1.0)
    variance = (squares - rows * mean**2) / (rows - 1) if rows > 1 else math.nan
    metrics = {"reward": mean, "reward_std": math.sqrt(max(variance, 0.0)) if rows > 1 else math.nan,
               "frac_reward_zero_std": zero_std / max(rows, 1.0)}
    if kl_sum is not None:
        metrics["kl"] = kl_total / max(tokens, 1.0)
    return metrics


class GroupMetrics:
    """Mixed into a trainer before OnPolicyTrainer: TRL's names beside the shared metrics of every iteration
    (`_iteration_metrics`) and of evaluation (`evaluate`), and the counters train()'s TrainOutput reads."""

    trl_loss_sum = 0.0  # `loss` times the optimizer steps of each iteration since train() began
    trl_loss_steps = 0  # those optimizer steps
    trl_step_time = 0.0  # seconds per optimizer step of the last iteration

    def reward_std_is_zero(self, rollout: TrajectoryBatch, shaped) -> torch.Tensor:
        """(B,) bool: the row's group scored all its completions alike. GRPO's shaping has it already; RLOO's
        compares the rewards after the KL penalty, as TRL's RLOO does."""
        return group_advantages(rollout.scores.float(), rollout.group_ids)[1]

    def trl_kl_sum(self, shaped) -> torch.Tensor | None:
        """Each row's KL to the reference summed over its tokens, where TRL logs `kl` (beta != 0); None otherwise."""
        return shaped.kl if self.config.kl_coef != 0.0 else None

    def _iteration_metrics(self, rollout: TrajectoryBatch, shaped, update_stats, eps, lr, update_seconds) -> dict:
        metrics = super()._iteration_metrics(rollout, shaped, update_stats, eps, lr, update_seconds)
        collectives, device = self.collectives, self.accelerator.device
        lengths = completion_metrics(collectives, device, rollout)
        steps = self.config.num_ppo_epochs * self.config.num_mini_batches
        trl = {**lengths, **reward_metrics(collectives, device, rollout, self.reward_std_is_zero(rollout, shaped),
                                           self.trl_kl_sum(shaped))}
        trl.update({name: metrics[ours] for name, ours in SAME_VALUES.items() if ours in metrics})
        # a value the trainer already logs under TRL's name (GRPO's update: entropy, kl) is the one kept
        metrics.update({name: value for name, value in trl.items() if name not in metrics})
        metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
        started = getattr(self, "_iteration_started", None)  # set by _iteration (unset: metrics outside the loop)
        self.trl_step_time = (time.perf_counter() - started) / steps if started is not None else 0.0
        if "loss" in metrics:  # train()'s training_loss: the mean over the optimizer steps it ran
            self.trl_loss_sum += metrics["loss"] * steps
            self.trl_loss_steps += steps
        for name, values in rollout.components.items():
            component = metrics[f"rewards/{name}/mean"] = metrics[f"rewards/{name}"]
            metrics[f"rewards/{name}/std"] = component_std(collectives, device, values, component)
        return metrics

    def _record_iteration(self, rollout: TrajectoryBatch, *args, **kwargs) -> None:
        """The iteration's tokens are counted before its metrics and checkpoint read the total."""
        self.state.num_input_tokens_seen += tokens_read(self.collectives, self.accelerator.device, rollout)
        super()._record_iteration(rollout, *args, **kwargs)

    def wall_clock_logs(self, metrics: dict[str, float]) -> dict[str, float]:
        """TRL's `step_time` for `state.log_history` beside a training record: a wall-clock figure kept out of
        metrics.jsonl, whose values two runs of one recipe repeat exactly apart from eps, time/* and tokens_per_s."""
        return {"step_time": self.trl_step_time} if "loss" in metrics else {}

    def evaluate(self) -> dict[str, float]:
        """Ours (eval/*) and TRL's eval_ names of the same values (reward, completion length)."""
        metrics = super().evaluate()
        metrics["eval_reward"] = metrics["eval/scores"]
        metrics["eval_completions/mean_length"] = metrics["eval/response_length"]
        return metrics
