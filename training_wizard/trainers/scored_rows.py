"""Completions no reward scored (every reward function in TRL's form returned None), in GRPO's and RLOO's metrics.

TRL 1.16 marks such a completion's reward NaN: it leaves its group's baseline with advantage 0 (core/grpo.py,
core/advantages.py take `ShapedRewards.scored` for that), and its nanmean / nanstd leave it out of the logged
`reward` and `reward_std`. The shared metrics average every row's score, so this mixin takes the unscored rows out
of `objective/scores`, `reward` and `reward_std` (each trainer's `reward_std_is_zero` leaves them out of
`frac_reward_zero_std`). An iteration in which every row was scored keeps the shared values exactly as they are.
"""

from __future__ import annotations

import math

import torch

from training_wizard.rollout.trajectory import TrajectoryBatch


class ScoredRowsMetrics:
    """Mixed into a trainer before GroupMetrics: score metrics over the rows a reward scored (`shaped.scored`)."""

    def _iteration_metrics(self, rollout: TrajectoryBatch, shaped, *args, **kwargs) -> dict:
        metrics = super()._iteration_metrics(rollout, shaped, *args, **kwargs)
        if shaped.scored is None:  # the trainers set it on every process alike, so all skip the collective together
            return metrics
        scored = shaped.scored.to(rollout.scores.device)
        scores = rollout.scores.double()[scored]
        sums = self.collectives.sum(torch.stack([
            scores.new_tensor(scores.numel()), scores.sum(), (scores**2).sum(),
            (~scored).sum().to(scores.dtype)]).to(self.accelerator.device))
        rows, total, squares, unscored = sums.tolist()
        if not unscored:
            return metrics
        mean = total / rows if rows else math.nan
        variance = (squares - rows * mean**2) / (rows - 1) if rows > 1 else math.nan
        metrics["objective/scores"] = mean
        if "reward" in metrics:
            metrics["reward"] = mean
            metrics["reward_std"] = math.sqrt(max(variance, 0.0)) if rows > 1 else math.nan
        return metrics
