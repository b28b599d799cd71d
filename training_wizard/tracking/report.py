"""report.html in a run's output_dir: a summary of the run first (what was trained from what, episodes, wall
time, the main metrics at the start and end, the last evaluation, where the model is), then the metric panel,
samples of the same prompts at the start, middle and end of training side by side, the last evaluation numbers
and the recipe. One static file, its image beside it."""

from __future__ import annotations

import html
import json
from pathlib import Path

from training_wizard.tracking.plots import plot_runs
from training_wizard.tracking.summary import RunSummary, format_seconds, run_summary


def write_run_outputs(output_dir: str | Path, summary: RunSummary | None = None) -> Path | None:
    """metrics.png and report.html for a finished (or stopped) run; None when nothing was logged yet. `summary`:
    the run's summary (default: read from output_dir, without the wall time only the run knows)."""
    folder = Path(output_dir)
    if not (folder / "metrics.jsonl").is_file():
        return None
    plot_runs([folder], folder / "metrics.png")
    report = folder / "report.html"
    report.write_text(_page(folder, summary or run_summary(folder)), encoding="utf-8")
    return report


def _summary(summary: RunSummary) -> str:
    """The top of the page: the headline facts, then start and end of the main metrics."""
    facts = [("trained", f"{summary.algorithm or '?'} from {summary.base_model or '?'}"
                         f"{' (LoRA adapter)' if summary.lora else ''}"),
             ("episodes", f"{summary.episodes} ({summary.iterations} logged iterations)")]
    failures = summary.failure_line()
    if failures:
        facts.append(("failed episodes", failures.removeprefix("failed episodes: ")))
    if summary.wall_seconds is not None:
        facts.append(("wall time", format_seconds(summary.wall_seconds)))
    evaluation = summary.evaluation_line()
    facts.append(("last evaluation", evaluation or "none"))
    if summary.model_dir is not None:
        facts.append(("model", f"{summary.model_dir} (its README.md is the model card)"))
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    span = (f"mean of the first / last {summary.window} logged iterations" if summary.window > 1
            else "first / last logged iteration")
    metrics = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{start:.4g}</td><td>{end:.4g}</td>"
        f"<td>{end - start:+.4g}</td></tr>" for name, start, end in summary.metrics)
    table = (f"<table class=\"metrics\"><tr><th>main metric</th><th>start</th><th>end</th><th>change</th></tr>"
             f"{metrics}</table><p><small>start and end: {span}</small></p>") if metrics else ""
    return f'<section id="summary"><h2>Summary</h2><table class="facts">{rows}</table>{table}</section>'


def _page(folder: Path, summary: RunSummary) -> str:
    recipe = (folder / "resolved_config.toml").read_text(encoding="utf-8") if (folder / "resolved_config.toml").is_file() else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>training-wizard run: {html.escape(folder.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px}} pre{{background:#f6f6f6;padding:1em;
overflow:auto}} img{{max-width:100%}} table.facts th{{text-align:left;background:#f6f6f6}}</style></head><body>
<h1>Run {html.escape(folder.name)}</h1>
{_summary(summary)}
<h2>Metrics against episodes</h2>
<p><small>Main metrics first. Faint: each logged iteration; solid: its moving average.</small></p>
<img src="metrics.png" alt="metric panel">
{_evaluation(folder)}
<h2>Samples of the same prompts during training</h2>
{_samples(folder)}
<h2>Recipe (resolved)</h2>
<pre>{html.escape(recipe)}</pre>
</body></html>
"""


def _evaluation(folder: Path) -> str:
    records = []
    if (folder / "metrics.jsonl").is_file():
        for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "eval/scores" in record:
                records.append(record)
    if not records:
        return ""
    last = records[-1]
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4g}</td></tr>" for k, v in last.items() if k != "episode")
    return f"<h2>Last evaluation (episode {last.get('episode')})</h2><table>{cells}</table>"


def _samples(folder: Path) -> str:
    """A table per probe prompt: its completion at the first, middle and last sample step."""
    path = folder / "samples.jsonl"
    if not path.is_file():
        return "<p>No samples were recorded.</p>"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("probe")] or rows
    steps = sorted({r["step"] for r in rows})
    if not steps:
        return "<p>No samples were recorded.</p>"
    chosen = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    by_query: dict[str, dict[int, dict]] = {}
    for row in rows:
        if row["step"] in chosen:
            by_query.setdefault(row["query"], {})[row["step"]] = row
    shared = [q for q, seen in by_query.items() if len(seen) == len(chosen)] or list(by_query)
    header = "".join(f"<th>step {s}</th>" for s in chosen)
    body = []
    for query in shared[:8]:
        cells = "".join(
            f"<td>{html.escape(str(by_query[query][s]['response']))}<br><small>score "
            f"{by_query[query][s].get('score', float('nan')):.3f}</small></td>" if s in by_query[query] else "<td></td>"
            for s in chosen
        )
        body.append(f"<tr><td>{html.escape(query)}</td>{cells}</tr>")
    return f"<table><tr><th>prompt</th>{header}</tr>{''.join(body)}</table>"
