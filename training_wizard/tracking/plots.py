"""The metric panel of a run (the TRL docs' panel, plus every reward component) as one PNG; several runs overlay.

The main metrics come first (tracking/summary.py). Each curve is drawn raw and faint, with its exponential moving
average on top (TensorBoard's smoothing, debiased at the start), since one iteration's batch mean is noisy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from training_wizard.tracking.summary import main_metric_names

PANEL = [
    "objective/rlhf_reward", "objective/scores", "objective/kl", "objective/non_score_reward", "objective/entropy",
    "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg",
    "val/ratio", "val/num_eos_tokens", "lr", "eps",
    # the supervised stages (SFT, reward model): training metrics, then the held-out ones
    "loss", "mean_token_accuracy", "accuracy", "margin", "grad_norm", "eval/loss", "eval/mean_token_accuracy",
    "eval/accuracy", "eval/margin",
]
UNSMOOTHED = ("lr",)  # a schedule, not a noisy estimate
# By default a record of these keys is plotted: on-policy training records, and the supervised stages' training and
# held-out records (on-policy evaluation records, eval/scores, are read by name).
PLOTTED_RECORD_KEYS = ("objective/scores", "loss", "eval/loss")


def read_records(run_dir: Path, kind: str | None = None) -> list[dict]:
    """The records of metrics.jsonl holding `kind` ("eval/scores" for evaluations), by default those the panel
    plots (PLOTTED_RECORD_KEYS)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(record, dict) and any(key in record for key in ((kind,) if kind else PLOTTED_RECORD_KEYS)):
            records.append(record)
    return records


def smoothing_weight(count: int) -> float:
    """The moving average's weight for a curve of `count` points: an effective window of about a fifth of the run
    (1 / (1 - w) points), no smoothing up to 5 points, at most 0.95."""
    return 0.0 if count <= 5 else min(0.95, 1.0 - 5.0 / count)


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, debiased (TensorBoard's scalar smoothing): s_i = m_i / (1 - weight^n) with
    m_i = weight * m_(i-1) + (1 - weight) * v_i over the n finite values so far; a non-finite value stays as it is
    and leaves the average alone. weight 0 returns the values."""
    smoothed, running, seen = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            smoothed.append(value)
            continue
        running = weight * running + (1.0 - weight) * value
        seen += 1
        smoothed.append(running / (1.0 - weight**seen))
    return smoothed


def panel_names(present: set[str]) -> list[str]:
    """Main metrics first, then the rest of the TRL panel."""
    main = main_metric_names(present)
    return main + [name for name in PANEL if name in present and name not in main]


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """One panel per metric against episodes; each run a colour with its folder name in the legend."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    runs = {Path(d).name or str(d): (read_records(Path(d)), read_records(Path(d), "eval/scores")) for d in run_dirs}
    present = set().union(*(set(r) for records, _ in runs.values() for r in records)) if runs else set()
    names = panel_names(present)
    if any(evals for _, evals in runs.values()):
        names.insert(len(main_metric_names(present)), "eval/scores")
    columns = 4
    rows = max(1, math.ceil(len(names) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, name in zip(axes.flat, names):
        for index, (label, (records, evals)) in enumerate(runs.items()):
            source = evals if name.startswith("eval/") else records
            points = [(r["episode"], r[name]) for r in source if isinstance(r.get(name), (int, float))]
            if points:
                _draw(axis, points, name, label, colours[index % len(colours)])
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("episode", fontsize=8)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="upper right", fontsize=8)
    figure.suptitle("faint: each logged iteration; solid: its moving average", fontsize=9, x=0.01, ha="left")
    figure.tight_layout(rect=(0, 0, 0.97, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    plt.close(figure)
    return out


def _draw(axis, points: list[tuple[float, float]], name: str, label: str, colour: str) -> None:
    episodes, values = zip(*points)
    weight = 0.0 if name in UNSMOOTHED or name.startswith("eval/") else smoothing_weight(len(values))
    if weight > 0:
        axis.plot(episodes, values, color=colour, alpha=0.25, linewidth=0.8)
        axis.plot(episodes, smooth(list(values), weight), color=colour, linewidth=1.6, label=label)
    else:
        axis.plot(episodes, values, color=colour, linewidth=1.4, label=label,
                  marker="o" if name.startswith("eval/") else None, markersize=3)
