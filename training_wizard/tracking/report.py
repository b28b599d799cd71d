"""report.html in a run's output_dir: the recipe, the metric panel, samples of the same prompts at the start,
middle and end of training side by side, and the last evaluation numbers. One static file, its image beside it."""

from __future__ import annotations

import html
import json
from pathlib import Path

from training_wizard.tracking.plots import plot_runs


def write_run_outputs(output_dir: str | Path) -> Path | None:
    """metrics.png and report.html for a finished (or stopped) run; None when nothing was logged yet."""
    folder = Path(output_dir)
    if not (folder / "metrics.jsonl").is_file():
        return None
    plot_runs([folder], folder / "metrics.png")
    report = folder / "report.html"
    report.write_text(_page(folder), encoding="utf-8")
    return report


def _page(folder: Path) -> str:
    recipe = (folder / "resolved_config.toml").read_text(encoding="utf-8") if (folder / "resolved_config.toml").is_file() else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>training-wizard run: {html.escape(folder.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px}} pre{{background:#f6f6f6;padding:1em;
overflow:auto}} img{{max-width:100%}}</style></head><body>
<h1>Run {html.escape(folder.name)}</h1>
{_evaluation(folder)}
<h2>Metrics against episodes</h2>
<img src="metrics.png" alt="metric panel">
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
    return f"<h2>Final evaluation (episode {last.get('episode')})</h2><table>{cells}</table>"


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
