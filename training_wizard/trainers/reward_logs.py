"""What reward functions log through TRL 1.16's `log_metric(name, value)` and `log_extra(column, values)`, as an
iteration's metrics and sample table show it (TRL's `GRPOTrainer._generate_and_score_completions` and
`print_prompt_completions_sample`): each metric under the name given, the mean of every call on every process;
each column beside the query and the response in the sample table, one value per completion."""

from __future__ import annotations

import json
from typing import Any, Mapping

import torch

from training_wizard.rollout.trajectory import TrajectoryBatch
from training_wizard.specs.reward import RewardSpec


def reward_log_metrics(collectives, rollout: TrajectoryBatch, taken: Mapping[str, Any],
                       reward: Any = None) -> dict[str, float]:
    """{name: mean of every value logged under it on every process}, by sorted name, leaving out the names in
    `taken` (the trainer's own metrics keep their meaning). Every process calls it once per iteration, with or
    without metrics of its own: a function may log a name on some processes only, so the names travel with the
    values (`_gathered_totals`) and no process waits in a collective another one skipped. A `reward` that never
    logs (a reward model, a spec without `take_logs` of its own: the same on every process) costs no collective."""
    if reward is not None and not can_log(reward):
        return {}
    totals: dict[str, list[float]] = {}
    for local in _gathered_totals(collectives, {name: [sum(values), len(values)]
                                                for name, values in rollout.logged_metrics.items()}):
        for name, (total, count) in local.items():
            summed = totals.setdefault(name, [0.0, 0])
            summed[0] += total
            summed[1] += count
    return {name: total / count for name, (total, count) in sorted(totals.items())
            if count and name not in taken}


def can_log(reward: Any) -> bool:
    """Whether the trainer's reward can hand over logs: a RewardSpec whose class has its own `take_logs`."""
    return isinstance(reward, RewardSpec) and type(reward).take_logs is not RewardSpec.take_logs


def _gathered_totals(collectives, local: dict[str, list[float]]) -> list[dict[str, list[float]]]:
    """Every process's `local` (one process: only its own), as JSON bytes of one width, the widest process's:
    two small collectives per iteration, however many metrics there are."""
    if collectives.single:
        return [local]
    payload = torch.tensor(list(json.dumps(local).encode()), dtype=torch.uint8)
    width = collectives.max_int(payload.numel())
    padded = torch.zeros(width, dtype=torch.uint8)  # a zero byte is never part of JSON text
    padded[: payload.numel()] = payload
    rows = collectives.gather(padded).view(-1, width).cpu()
    return [json.loads(bytes(row.tolist()).rstrip(b"\0").decode()) for row in rows]


def record_samples(samples, state, rollout: TrajectoryBatch, rows: int, probe: bool = False):
    """The first `rows` rows of `rollout` into the sample table `samples` at the run's `state` (step, episode):
    query, response, score, each reward component and each column the reward's functions logged; the rich
    table (None on processes other than the main one)."""
    shown = min(rows, rollout.num_rows)
    return samples.record(state.iteration, state.episode, rollout.queries[:shown], rollout.completions[:shown],
                          rollout.scores[:shown].tolist(),
                          {name: list(values[:shown]) for name, values in rollout.components.items()}, probe=probe,
                          columns={name: list(values[:shown]) for name, values in rollout.logged_columns.items()})
