"""The sample table: query, model response, score and each reward component, printed and saved to JSONL."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table


# the keys every samples.jsonl record has, which a logged column of the same name does not replace
RECORD_KEYS = ("step", "episode", "query", "response", "score", "probe")


class SampleTable:
    def __init__(self, output_dir: str | Path, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(output_dir) / "samples.jsonl"

    def record(
        self,
        step: int,
        episode: int,
        queries: list[str],
        responses: list[str],
        scores: list[float],
        components: dict[str, list[float]] | None = None,
        probe: bool = False,
        columns: dict[str, list[Any]] | None = None,
    ) -> Table | None:
        """Append the rows to samples.jsonl and return a rich table of them (None on non-main processes).
        `probe`: the fixed prompts sampled at every sample event (marked `"probe": true`). `columns`: what the
        reward's functions logged per completion (`log_extra`), each written under its own name; a name the
        record already holds (step, query, score, ...) keeps the record's value."""
        if not self.enabled:
            return None
        components = components or {}
        columns = {name: values for name, values in (columns or {}).items()
                   if name not in RECORD_KEYS and not name.startswith("rewards/")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = Table(title=f"samples at episode {episode}", show_lines=True)
        for column in ("query", "model response", "score", *components, *columns):
            table.add_column(column, overflow="fold")
        with self.path.open("a", encoding="utf-8") as handle:
            for row, (query, response, score) in enumerate(zip(queries, responses, scores)):
                parts = {name: _number_or_none(values[row]) for name, values in components.items()}
                logged = {name: _json_or_text(_number_or_none(values[row])) for name, values in columns.items()}
                record: dict[str, Any] = {
                    "step": step, "episode": episode, "query": query, "response": response, "score": score,
                    **{f"rewards/{name}": value for name, value in parts.items()},
                    **logged,
                    **({"probe": True} if probe else {}),
                }
                handle.write(json.dumps(record) + "\n")
                shown = ("-" if value is None else f"{value:.4f}" for value in parts.values())
                texts = ("-" if value is None else str(value) for value in logged.values())
                table.add_row(query, response, f"{score:.4f}", *shown, *texts)
        return table


def _number_or_none(value: float) -> float | None:
    """None for NaN, which JSON cannot hold: a reward function in TRL's form returned None (it did not score)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _json_or_text(value: Any) -> Any:
    """`value` where JSON can hold it, else its str(): a logged value may be anything (a sympy number, a dict with
    tuple keys, which json.dumps refuses even with a `default`), and one odd value must not end the run."""
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return str(value)
    return value


class PromptLog:
    """prompts.jsonl: which dataset prompts (indices in the training set, global order) each training iteration
    trained on, one line per iteration: {"step", "prompts", "reissued"}. `reissued`: the prompts were sampled
    again this iteration (their batch sampled ahead was dropped as too stale). Truncated with metrics.jsonl on
    resume, so after any number of resumes it lists the run's prompts once each, in order."""

    def __init__(self, output_dir: str | Path, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(output_dir) / "prompts.jsonl"

    def record(self, step: int, prompts: list[int], reissued: bool = False) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "prompts": prompts, "reissued": reissued}) + "\n")
