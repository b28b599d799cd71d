"""The evaluation recipe: `training-wizard eval EVAL.toml` (or `recipe_class = "evaluate"`).

One completion per held-out prompt from the candidate model, and one from the baseline model (or the prompt
rows' own reference completions), judged pairwise; writes the win rate with its 95% interval and every decision
(`decisions.jsonl`, `decisions.html`, `winrate.json`) into output_dir. `[metrics]` scores each model on its own
(e.g. the share of answers that are right) and writes `metrics.json` and `completions.jsonl`. A LoRA run's
`model/` folder loads as a model (its base with the adapter merged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, PositiveInt, model_validator
from rich.console import Console

from training_wizard.errors import UserError
from training_wizard.evaluation.judges import JudgeSpec
from training_wizard.recipes.base import Recipe
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.specs.environment import EnvironmentSpec
from training_wizard.specs.episode import (EnvironmentTimeout, EpisodeSettings, MaxToolCallingIterations, MaxTurns,
                                            limits_from_environment)
from training_wizard.specs.model import TransformerSpec
from training_wizard.specs.reward import RewardSpec


@dataclass
class Completions:
    """One side of an evaluation: a model's (or the data's) completion of each prompt row, with what a reward in
    TRL's form receives in training (the dataset's own prompts, each completion's token ids)."""

    name: str
    queries: list[str]
    prompts: list[Any]
    tokenizer: Any
    texts: list[str] = field(default_factory=list)
    has_stop: list[bool] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    # episodes: the reward columns training gives (transcript, completion_messages, environments), and the
    # per-episode values reported beside the metrics (the environment's reward, tool calls)
    episode_columns: dict[str, list[Any]] = field(default_factory=dict)
    episode_values: dict[str, list[float]] = field(default_factory=dict)

    def reward_columns(self, columns: dict[str, list[Any]], spec: RewardSpec) -> dict[str, list[Any]]:
        """The columns `spec.score` gets, as the rollout collector builds them."""
        extra: dict[str, list[Any]] = {"completion_has_eos": self.has_stop, **self.episode_columns}
        if spec.uses_trl_inputs():
            extra["completion_ids"] = self.token_ids
            extra["dataset_prompts"] = self.prompts or [None] * len(self.texts)
        return {**columns, **extra}


class EvaluateRecipe(Recipe):
    """A candidate model against a baseline model or reference completions, on held-out prompts."""

    prompts: DataSourceSpec = Field(description="Held-out prompts (prompt-only rows; other columns go to the judge).")
    candidate: TransformerSpec = Field(description="The model under test, e.g. a run's model/ folder.")
    baseline: TransformerSpec | None = Field(None, description="The model to beat, e.g. the starting model.")
    reference_column: str | None = Field(
        None, description="Instead of a baseline model: the column of the prompt rows holding reference completions."
    )
    judge: JudgeSpec | None = Field(
        None, description="Who decides each pair (RewardJudgeSpec or ChatJudgeSpec); optional when metrics are set."
    )
    metrics: dict[str, RewardSpec] = Field(
        default_factory=dict,
        description="Name -> reward spec scoring each model's completions on its own: the mean over the prompts and "
        "its 95% interval (Wilson's when every value is 0 or 1, i.e. a share), for the candidate and the baseline.",
    )
    response_length: PositiveInt = Field(64, description="Most new tokens per completion.")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 decodes greedily.")
    batch_size: PositiveInt = Field(16, description="Prompts per generation batch.")
    dtype: str = Field("float32", description="Weight dtype of both models.")
    environment: EnvironmentSpec | None = Field(
        None, description="Play episodes as training does (docs/environments.md): the metrics score each episode's "
        "last reply (with transcript, completion_messages and environments columns); the environment's reward and "
        "the tool-call shares are reported beside them. response_length is the episode's budget.")
    # the episode's limits (specs/episode.py), as a training recipe's [training] table names them
    max_turns: MaxTurns = EpisodeSettings.max_turns
    max_tool_calling_iterations: MaxToolCallingIterations = EpisodeSettings.max_tool_calling_iterations
    environment_timeout: EnvironmentTimeout = EpisodeSettings.environment_timeout
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Variables given to both models' chat templates wherever a prompt or turn is rendered "
        "(TRL's name; e.g. { enable_thinking = false }), as the run that trained the candidate gave them.")

    @model_validator(mode="after")
    def _episode_limits_in_one_place(self) -> EvaluateRecipe:
        if self.environment is not None:
            limits_from_environment(self.environment, self, "")
        return self

    @model_validator(mode="after")
    def _one_baseline(self) -> EvaluateRecipe:
        if self.judge is None and not self.metrics:
            raise ValueError("set a judge (pairwise win rate), metrics (per-model scores), or both")
        if self.baseline is not None and self.reference_column is not None:
            raise ValueError("set baseline (a model) or reference_column (completions in the data), not both")
        if self.judge is not None and self.baseline is None and self.reference_column is None:
            raise ValueError("a judge compares two sides: set baseline (a model) or reference_column (completions "
                             "in the data)")
        self.candidate._key = "candidate"
        if self.baseline is not None:
            self.baseline._key = "baseline"
        return self

    def main(self, dry_run: bool = False) -> None:
        from accelerate.utils import set_seed

        from training_wizard.evaluation.report import write_decisions
        from training_wizard.evaluation.winrate import win_rate
        from training_wizard.specs.dataset import validate_prompts

        set_seed(self.seed)
        console = Console()
        rows = self.prompts.load("prompts")
        if self.environment is not None:  # rows without a prompt: the environment's reset supplies it, as in training
            from training_wizard.rollout.environments import environment_rows

            rows = environment_rows(rows, self.environment.load(), len(rows))
        validate_prompts(rows, "prompts")
        rows = list(rows)
        if self.reference_column is not None and self.reference_column not in rows[0]:
            raise UserError(f"reference_column: column '{self.reference_column}' is not in the prompt rows")
        judged = f"judge {type(self.judge).__name__}" if self.judge is not None else "no judge"
        console.print(f"{len(rows)} prompts; {judged}; metrics: {', '.join(self.metrics) or 'none'}")
        if self.environment is not None:  # built and reset on its first row, as training's start does
            from training_wizard.rollout.environment_check import check_episodes_can_start

            check_episodes_can_start(self.environment.load(), self.environment.settings(), True, rows)
        if dry_run:
            return
        candidate = self._completions(self.candidate, rows)
        queries, candidates = candidate.queries, candidate.texts
        baseline: Completions | None = None
        if self.baseline is not None:
            baseline = self._completions(self.baseline, rows)
        elif self.reference_column is not None:
            baseline = self._reference_completions(rows, candidate)
        baselines = baseline.texts if baseline is not None else None
        names = (self.candidate.pretrained_name, baseline.name if baseline is not None else "")
        columns = {k: [row.get(k) for row in rows] for k in rows[0] if k not in ("prompt", self.reference_column)}
        if self.metrics:
            self._report_metrics(console, queries, columns, [side for side in (candidate, baseline) if side])
        if self.judge is not None and baselines is not None:
            sides = ({"completion_has_eos": candidate.has_stop}, {"completion_has_eos": baseline.has_stop})
            outcomes = self.judge.judge(queries, candidates, baselines, columns, sides)
            result = win_rate(outcomes)
            write_decisions(Path(self.output_dir), queries, candidates, baselines, outcomes, result, names)
            console.print(f"{names[0]} vs {names[1]}: {result.describe()}", soft_wrap=True)
            console.print(f"decisions: {Path(self.output_dir) / 'decisions.html'}")

    def _report_metrics(self, console: Console, queries: list[str], columns: dict[str, list[Any]],
                        sides: list[Completions]) -> None:
        """Score each side's completions with every metric; print and write `metrics.json` (mean and 95% interval
        per side and metric) and `completions.jsonl` (each prompt's completions and their values)."""
        import json

        from training_wizard.evaluation.winrate import mean_score

        folder = Path(self.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        summary: dict[str, dict[str, Any]] = {}
        per_row: list[dict[str, Any]] = [{"prompt": q} for q in queries]
        for side, completions in zip(("candidate", "baseline"), sides):
            summary[side] = {"model": completions.name}
            for metric, spec in self.metrics.items():
                values, _ = spec.score(queries, completions.texts, completions.reward_columns(columns, spec),
                                       label=f"metrics.{metric}")
                result = mean_score(values)
                summary[side][metric] = {"mean": result.mean, "ci95_low": result.low, "ci95_high": result.high,
                                         "n": result.n}
                console.print(f"{side} {completions.name}: {metric} {result.describe()}", soft_wrap=True)
                for row, value in zip(per_row, values):
                    row[f"{side}_{metric}"] = value
            for metric, values in completions.episode_values.items():
                result = mean_score(values)
                summary[side][metric] = {"mean": result.mean, "ci95_low": result.low, "ci95_high": result.high,
                                         "n": result.n}
                console.print(f"{side} {completions.name}: {metric} {result.describe()}", soft_wrap=True)
            for row, completion in zip(per_row, completions.texts):
                row[side] = completion
        (folder / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        with (folder / "completions.jsonl").open("w", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in per_row)
        console.print(f"metrics: {folder / 'metrics.json'}")

    @torch.no_grad()
    def _completions(self, spec: TransformerSpec, rows: list[dict[str, Any]]) -> Completions:
        """One completion per row from the model `spec` names, in batches, keyed by row."""
        from training_wizard.rollout.backends import DecodeLoopBackend, sample_completions
        from training_wizard.rollout.generation import GenerationParams, default_stop_token_ids
        from training_wizard.rollout.prompts import EncodedPrompts, row_seed

        from training_wizard.specs.chat_rendering import bind_chat_template_kwargs

        tokenizer = spec.load_tokenizer()
        bind_chat_template_kwargs(tokenizer, self.chat_template_kwargs)
        model = spec.load_causal_lm(self.dtype, tokenizer).eval()
        if self.environment is not None:
            return self._episodes(spec.pretrained_name, tokenizer, model, rows)
        encoded = EncodedPrompts.from_rows(rows, tokenizer)
        pad, stop = tokenizer.pad_token_id, default_stop_token_ids(tokenizer, model)
        params = GenerationParams(self.response_length, self.temperature, stop, pad)
        backend = DecodeLoopBackend(self.batch_size)
        result = Completions(spec.pretrained_name, encoded.queries, encoded.prompts, tokenizer)
        for first in range(0, len(rows), self.batch_size):
            indices = list(range(first, min(first + self.batch_size, len(rows))))
            ids, mask = encoded.left_pad(indices, pad)
            sampled = sample_completions(backend, model, ids, mask, params, [row_seed(self.seed, 0, i) for i in indices])
            kept = torch.where(sampled.mask, sampled.responses, torch.full_like(sampled.responses, pad))
            result.texts += tokenizer.batch_decode(kept, skip_special_tokens=True)
            result.has_stop += sampled.has_stop.tolist()
            # as the trainer passes them to TRL-form rewards: without padding, with the stop token when sampled
            result.token_ids += [row[keep].tolist() for row, keep in zip(sampled.responses, sampled.mask)]
        return result

    def _episodes(self, name: str, tokenizer, model, rows: list[dict[str, Any]]) -> Completions:
        """One episode per row, played as training plays them (rollout/episodes.py), keyed by row."""
        from training_wizard.rollout.backends import DecodeLoopBackend
        from training_wizard.rollout.collector import SamplingSettings
        from training_wizard.rollout.episodes import episode_player, prepare_episodes
        from training_wizard.rollout.generation import default_stop_token_ids
        from training_wizard.rollout.prompts import EncodedPrompts, row_seed
        from training_wizard.rollout.trajectory import StopReason

        environment = self.environment
        factory, settings = environment.load(), environment.settings()
        settings = prepare_episodes(tokenizer, factory, (), settings)
        encoded = EncodedPrompts.from_rows(rows, tokenizer)
        sampling = SamplingSettings(self.response_length, self.temperature, default_stop_token_ids(tokenizer, model),
                                    tokenizer.pad_token_id, forward_batch_size=self.batch_size)
        player = episode_player(tokenizer, DecodeLoopBackend(self.batch_size), sampling, factory, settings, self)
        result = Completions(name, encoded.queries, encoded.prompts, tokenizer)
        episodes = []
        for first in range(0, len(rows), self.batch_size):
            indices = list(range(first, min(first + self.batch_size, len(rows))))
            seeds = [row_seed(self.seed, 0, i) for i in indices]  # as a single reply's: the first turn is one
            played = player.play(model, encoded, indices, seeds, next(model.parameters()).device)
            error = player.finish(indices, played)
            if error is not None:
                raise UserError(error)
            episodes += played
        scoring = player.scoring(episodes)
        result.texts, result.episode_columns = scoring.texts, scoring.columns
        result.has_stop = [episode.stop != StopReason.LENGTH for episode in episodes]
        result.token_ids = [episode.ids for episode in episodes]
        result.episode_values = {f"rewards/{key}": values for key, values in scoring.rewards.items()}
        calls = scoring.stats["calls"]
        result.episode_values["tools/episodes_with_call"] = [float(count > 0) for count in calls]
        result.episode_values["tools/call_frequency"] = list(calls)
        return result

    def _reference_completions(self, rows: list[dict[str, Any]], candidate: Completions) -> Completions:
        """The rows' own reference completions as the baseline side; finished, and tokenised with the candidate's
        tokenizer for rewards that read token ids."""
        tokenizer = candidate.tokenizer
        texts = [str(row[self.reference_column]) for row in rows]
        token_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        return Completions(f"column {self.reference_column}", candidate.queries, candidate.prompts, tokenizer,
                           texts, [True] * len(rows), token_ids)
