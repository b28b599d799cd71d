"""The evaluation's outputs: every decision as JSONL and as one static HTML table."""

from __future__ import annotations

import html
import json
from pathlib import Path

from training_wizard.evaluation.winrate import WinRate

_VERDICT = {1.0: "candidate", 0.5: "tie", 0.0: "baseline"}


def write_decisions(folder: Path, prompts: list[str], candidates: list[str], baselines: list[str],
                    outcomes: list[float], result: WinRate, names: tuple[str, str]) -> None:
    """decisions.jsonl, decisions.html and winrate.json in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "decisions.jsonl").open("w", encoding="utf-8") as out:
        for prompt, ours, theirs, outcome in zip(prompts, candidates, baselines, outcomes):
            out.write(json.dumps({"prompt": prompt, "candidate": ours, "baseline": theirs, "outcome": outcome,
                                  "verdict": _VERDICT[outcome]}) + "\n")
    summary = {"candidate": names[0], "baseline": names[1], "win_rate": result.rate, "ci95_low": result.low,
               "ci95_high": result.high, "wins": result.wins, "ties": result.ties, "losses": result.losses,
               "n": result.n}
    (folder / "winrate.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    rows = "\n".join(
        f"<tr class=\"{_VERDICT[o]}\"><td>{i}</td><td>{html.escape(p)}</td><td>{html.escape(a)}</td>"
        f"<td>{html.escape(b)}</td><td>{_VERDICT[o]}</td></tr>"
        for i, (p, a, b, o) in enumerate(zip(prompts, candidates, baselines, outcomes))
    )
    (folder / "decisions.html").write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Evaluation: {html.escape(names[0])} vs {html.escape(names[1])}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;
padding:4px 8px;vertical-align:top}} tr.candidate td:last-child{{background:#d9f2d9}}
tr.baseline td:last-child{{background:#f7d9d9}} tr.tie td:last-child{{background:#eee}}</style></head><body>
<h1>{html.escape(names[0])} vs {html.escape(names[1])}</h1>
<p>{html.escape(result.describe())}</p>
<table><tr><th>#</th><th>prompt</th><th>{html.escape(names[0])}</th><th>{html.escape(names[1])}</th><th>verdict</th></tr>
{rows}
</table></body></html>
""", encoding="utf-8")
