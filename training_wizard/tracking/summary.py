"""What a run did, at a glance: read back from its output_dir (resolved_config.toml, metrics.jsonl, an evaluation's
winrate.json) and shown in three places: the last lines in the terminal, the top of report.html, and the model
card (model/README.md)."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The metrics a reader looks at first, in this order; every reward component (`rewards/<name>`) follows the first two.
MAIN_METRICS = ("objective/scores", "objective/rlhf_reward", "objective/kl", "completions/mean_length",
                "distill/divergence", "distill/agreement")  # the last two: distillation runs only
EVAL_METRICS = ("eval/scores", "eval/kl", "eval/response_length")


def main_metric_names(present: set[str] | list[str]) -> list[str]:
    """The main metrics among `present`: scores, rlhf_reward, each reward component, kl, mean completion length."""
    # TRL's rewards/<name>/mean and /std repeat a component logged as rewards/<name>: the component is shown once
    components = sorted(k for k in present if k.startswith("rewards/")
                        and not (k.endswith(("/mean", "/std")) and k.rsplit("/", 1)[0] in present))
    ordered = [*MAIN_METRICS[:2], *components, *MAIN_METRICS[2:]]
    return [name for name in ordered if name in present]


def window_size(count: int) -> int:
    """How many logged iterations the start and end values average: a quarter of the run, at most 5, at least 1
    (single iterations of a sampled batch are noisy)."""
    return max(1, min(5, count // 4))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file; a line cut short by a crash is passed over."""
    records = []
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


@dataclass
class RunSummary:
    """base_model: the name the run trained from; algorithm: e.g. "RLOO"; metrics: (name, start, end), each the mean
    of the first and last `window` logged iterations; evaluation: the last in-training evaluation record; win_rate:
    an evaluation's winrate.json found in output_dir; model_dir: the saved model, if there is one; failed_episodes:
    episodes whose environment failed (could not reset or go on), the run's total."""

    output_dir: Path
    base_model: str | None
    algorithm: str | None
    episodes: int
    iterations: int
    window: int
    metrics: list[tuple[str, float, float]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    win_rate: dict[str, Any] | None = None
    wall_seconds: float | None = None
    model_dir: Path | None = None
    lora: bool = False
    failed_episodes: int = 0

    def headline(self) -> str:
        """One sentence: what was trained from what, how far, how long."""
        what = f"{self.algorithm or 'training'} of {self.base_model or 'a model'}"
        kind = " (LoRA adapter)" if self.lora else ""
        wall = f" in {format_seconds(self.wall_seconds)}" if self.wall_seconds is not None else ""
        return f"{what}{kind}: {self.episodes} episodes, {self.iterations} logged iterations{wall}"

    def metric_lines(self) -> list[str]:
        span = f"mean of the first/last {self.window} iterations" if self.window > 1 else "first/last iteration"
        width = max((len(name) for name, _, _ in self.metrics), default=0)
        lines = [f"{name:<{width}}  {start:>9.4g} -> {end:.4g}" for name, start, end in self.metrics]
        return [f"main metrics ({span}):", *(f"  {line}" for line in lines)] if lines else []

    def evaluation_line(self) -> str | None:
        parts = []
        if self.evaluation:
            values = ", ".join(f"{k} {self.evaluation[k]:.4g}" for k in EVAL_METRICS
                               if _number(self.evaluation.get(k)) is not None)
            parts.append(f"last evaluation (episode {self.evaluation.get('episode')}): {values}")
        if self.win_rate:
            rate = self.win_rate
            parts.append(f"win rate {rate['win_rate']:.1%} against {rate.get('baseline', 'the baseline')} "
                         f"(95% CI {rate.get('ci95_low', float('nan')):.1%} to {rate.get('ci95_high', float('nan')):.1%}, "
                         f"n = {rate.get('n', '?')})")
        return "; ".join(parts) or None

    def failure_line(self) -> str | None:
        """How many episodes the environment failed (None when none did): they were trained on as they ended."""
        if not self.failed_episodes:
            return None
        share = f" ({self.failed_episodes / self.episodes:.1%})" if self.episodes else ""
        return (f"failed episodes: {self.failed_episodes} of {self.episodes}{share} ended by an environment that "
                f"could not reset or go on (episodes/failed in metrics.jsonl)")

    def lines(self) -> list[str]:
        """The plain-text summary the terminal ends with."""
        lines = [self.headline(), *filter(None, [self.failure_line()]), *self.metric_lines()]
        evaluation = self.evaluation_line()
        if evaluation:
            lines.append(evaluation)
        if self.model_dir is not None:
            lines.append(f"model: {self.model_dir}")
        return lines


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def algorithm_key(recipe_class: str | None) -> str | None:
    """'rloo' from "rloo" or "training_wizard.recipes.rloo.RLOORecipe"; None if unknown."""
    if not recipe_class:
        return None
    name = recipe_class.rsplit(".", 1)[-1].lower().removesuffix("recipe")
    return name or None


def run_summary(output_dir: str | Path, *, base_model: str | None = None, wall_seconds: float | None = None) -> RunSummary:
    """The summary of the run in `output_dir` (`base_model`: the model's name as its saved files record it; default:
    the resolved recipe's model.pretrained_name)."""
    folder = Path(output_dir)
    recipe = _read_recipe(folder)
    records = read_jsonl(folder / "metrics.jsonl")
    train = [r for r in records if "objective/scores" in r]
    evals = [r for r in records if "eval/scores" in r]
    window = window_size(len(train))
    present = {k for r in train for k, v in r.items() if _number(v) is not None}
    metrics = []
    for name in main_metric_names(present):
        values = [_number(r.get(name)) for r in train]
        values = [v for v in values if v is not None]
        if values:
            metrics.append((name, _mean(values[:window]), _mean(values[-window:])))
    key = algorithm_key(recipe.get("recipe_class"))
    model_dir = folder / "model"
    return RunSummary(
        output_dir=folder,
        base_model=base_model or recipe.get("model", {}).get("pretrained_name"),
        algorithm=ALGORITHMS[key].name if key in ALGORITHMS else key,
        episodes=int(max((_number(r.get("episode")) or 0 for r in records), default=0)),
        iterations=len(train),
        window=window,
        metrics=metrics,
        evaluation=evals[-1] if evals else None,
        win_rate=_win_rate(folder),
        wall_seconds=wall_seconds,
        model_dir=model_dir if model_dir.is_dir() else None,
        lora=(model_dir / "adapter_config.json").is_file(),
        failed_episodes=int(max((_number(r.get("episodes/failed_total")) or 0 for r in train), default=0)),
    )


def _read_recipe(folder: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((folder / "resolved_config.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _win_rate(folder: Path) -> dict[str, Any] | None:
    """The newest winrate.json (`training-wizard eval`) in output_dir or one folder below it."""
    found = sorted((*folder.glob("winrate.json"), *folder.glob("*/winrate.json")), key=lambda p: p.stat().st_mtime)
    for path in reversed(found):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and _number(data.get("win_rate")) is not None:
            return data
    return None


@dataclass(frozen=True)
class Algorithm:
    name: str
    full_name: str
    paper: str  # title, authors and year
    url: str


ALGORITHMS = {
    "rloo": Algorithm("RLOO", "REINFORCE Leave-One-Out",
                      "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in "
                      "LLMs (Ahmadian et al., 2024)", "https://arxiv.org/abs/2402.14740"),
    "ppo": Algorithm("PPO", "Proximal Policy Optimization",
                     "Proximal Policy Optimization Algorithms (Schulman et al., 2017); for language models: The N+ "
                     "Implementation Details of RLHF with PPO: A Case Study on TL;DR Summarization (Huang et al., 2024)",
                     "https://arxiv.org/abs/1707.06347"),
    "grpo": Algorithm("GRPO", "Group Relative Policy Optimization",
                      "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models (Shao et al., "
                      "2024)", "https://arxiv.org/abs/2402.03300"),
}
