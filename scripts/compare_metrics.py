"""Compare two folders of metrics.jsonl snapshots (tests/conftest.py's METRICS_SNAPSHOT_DIR, or run folders):
every logged value must be identical, except wall-clock ones (eps, time/*, tokens_per_s).

    METRICS_SNAPSHOT_DIR=/tmp/before .venv/bin/python -m pytest -q      # at the earlier revision
    METRICS_SNAPSHOT_DIR=/tmp/after .venv/bin/python -m pytest -q       # at this one
    .venv/bin/python scripts/compare_metrics.py /tmp/before /tmp/after

Exits 1 and lists the differing files, steps and keys when any value differs or a file is missing on one side.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

WALL_CLOCK = ("eps", "tokens_per_s", "time/", "memory/", "async/producer_idle_s", "async/trainer_idle_s")


def records(path: Path) -> list[dict]:
    """The file's records without their wall-clock keys; a line a killed run left half-written (the kill-and-resume
    tests do) is an empty record."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = {}
        rows.append({k: v for k, v in row.items() if not k.startswith(WALL_CLOCK)})
    return rows


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def main(before: Path, after: Path) -> int:
    names = {p.name for p in before.glob("*.jsonl")} | {p.name for p in after.glob("*.jsonl")}
    problems = 0
    for name in sorted(names):
        if not (before / name).exists() or not (after / name).exists():
            print(f"{name}: only in {'after' if (after / name).exists() else 'before'}")
            problems += 1
            continue
        old, new = records(before / name), records(after / name)
        if len(old) != len(new):
            print(f"{name}: {len(old)} records before, {len(new)} after")
            problems += 1
            continue
        for step, (a, b) in enumerate(zip(old, new)):
            keys = sorted(set(a) | set(b))
            differing = [k for k in keys if not same(a.get(k), b.get(k))]
            if differing:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in differing[:4])
                print(f"{name} record {step}: {shown}{' ...' if len(differing) > 4 else ''}")
                problems += 1
                break
    print(f"{len(names)} files compared, {problems} differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
