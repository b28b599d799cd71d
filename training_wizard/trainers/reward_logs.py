"""What reward functions log through TRL 1.16's `log_metric(name, value)` and `log_extra(column, values)`, as an
iteration's metrics and sample table show it (TRL's `GRPOTrainer._generate_and_score_completions` and
`print_prompt_completions_sample`): each metric under the name given, the mean of every call on every process;
each column beside the query and the response in the sample table, one value per completion."""

from __future__ import annotations

from typing import Any, Mapping

from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.specs.reward import RewardSpec


def reward_log_metrics(collectives, rollout: TrajectoryBatch, taken: Mapping[str, Any],
                       reward: Any = None) -> dict[str, float]:
    """{name: mean of every value logged under it on every process}, by sorted name, leaving out the names in
    `taken` (the trainer's own metrics keep their meaning). Every process calls it once per iteration, with or
    without metrics of its own: a function may log a name on some processes only, so the names travel with the
    values (`Collectives.gather_json`) and no process waits in a collective another one skipped. A `reward`
    that never logs (a reward model, a spec without `score_logging` of its own: the same on every process) costs
    no collective."""
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


def record_samples(samples, state, rollout: TrajectoryBatch, rows: int, probe: bool = False):
    """The first `rows` rows of `rollout` into the sample table `samples` at the run's `state` (step, episode):
    query, response, score, each reward component and each column the reward's functions logged; the rich
    table (None on processes other than the main one)."""
    shown = min(rows, rollout.num_rows)
    return samples.record(state.iteration, state.episode, rollout.queries[:shown], rollout.completions[:shown],
                          rollout.scores[:shown].tolist(),
                          {name: list(values[:shown]) for name, values in rollout.components.items()}, probe=probe,
                          columns={name: list(values[:shown]) for name, values in rollout.logged_columns.items()})
