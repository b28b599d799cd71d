"""The metric panel of a run (the TRL docs' panel, plus every reward component) as one PNG; several runs overlay."""

from __future__ import annotations

import json
import math
from pathlib import Path

PANEL = [
    "objective/rlhf_reward", "objective/scores", "objective/kl", "objective/non_score_reward", "objective/entropy",
    "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg",
    "val/ratio", "val/num_eos_tokens", "lr", "eps",
    # the supervised stages (SFT, reward model): training metrics, then the held-out ones
    "loss", "mean_token_accuracy", "accuracy", "margin", "grad_norm", "eval/loss", "eval/mean_token_accuracy",
    "eval/accuracy", "eval/margin",
]
# A record of these keys is plotted: on-policy training records, and the supervised stages' training and held-out
# records (on-policy evaluation records, eval/scores, are left to report.html).
PLOTTED_RECORD_KEYS = ("objective/scores", "loss", "eval/loss")


def read_records(run_dir: Path) -> list[dict]:
    """The records of metrics.jsonl that the panel plots (see PLOTTED_RECORD_KEYS)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(record, dict) and any(key in record for key in PLOTTED_RECORD_KEYS):
            records.append(record)
    return records


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """One panel per metric against episodes; each run a line with its folder name in the legend."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    runs = {Path(d).name or str(d): read_records(Path(d)) for d in run_dirs}
    present = set().union(*(set(r) for records in runs.values() for r in records)) if runs else set()
    components = sorted(k for k in present if k.startswith("rewards/"))
    names = [k for k in PANEL if k in present] + components
    columns = 4
    rows = max(1, math.ceil(len(names) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for axis, name in zip(axes.flat, names):
        for label, records in runs.items():
            points = [(r["episode"], r[name]) for r in records if name in r and r[name] is not None]
            if points:
                axis.plot(*zip(*points), label=label, linewidth=1.2)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("episode", fontsize=8)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="upper right", fontsize=8)
    figure.tight_layout(rect=(0, 0, 0.97, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    plt.close(figure)
    return out
