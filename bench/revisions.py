"""An earlier revision of training-wizard against this one, side by side: the same RLOO run at `bench_rloo.py`'s
settings with each, alternating in fresh processes.

    git worktree add --detach ../before REVISION
    OMP_NUM_THREADS=2 .venv/bin/python bench/revisions.py --before ../before [--rounds 2]
        [--configs 25m:64,smollm2-lora:32]

Each run is `bench/bench_rloo.py`'s worker for our trainer at that bench's settings (16 prompts x 4 completions,
one epoch, one mini-batch, float32, activation checkpointing on, `logprobs_from_sampling = true`), one warm-up
iteration then `--iterations` timed ones, with PYTHONPATH pointing at the revision under test. Prints per
configuration the seconds per iteration, the update's seconds, the generation's (with the reference pass) and
the process's peak RSS, each as the median over rounds and as after / before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_rloo import build_models, run_ours, wait_for_quiet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier revision")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default="25m:64,smollm2-lora:32")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    args = parser.parse_args()
    folders = build_models(args.cache)
    sides = {"before": args.before.resolve(), "after": REPO}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for config in args.configs.split(","):
            model, length = config.split(":")
            results: dict[str, list[dict]] = {side: [] for side in sides}
            for round_index in range(args.rounds):
                order = list(sides) if round_index % 2 == 0 else list(reversed(sides))  # neither side always first
                for side in order:
                    wait_for_quiet()
                    began = time.perf_counter()
                    results[side].append(run_ours(
                        sides[side], folders[model], int(length), Path(scratch) / f"{model}-{round_index}-{side}",
                        warmup=1, iterations=args.iterations, threads=args.threads, checkpointing="on",
                        options=["logprobs_from_sampling=true"], lora=model.endswith("lora")))
                    print(f"{config} round {round_index} {side}: {time.perf_counter() - began:.0f} s", flush=True)
            medians = {side: {"iteration": statistics.median(statistics.mean(r["seconds"]) for r in runs),
                              "update": statistics.median(r["update_s"] for r in runs),
                              "generation": statistics.median(r["generation_s"] for r in runs),
                              "peak": statistics.median(r["peak_mb"] for r in runs)} for side, runs in results.items()}
            rows.append((config, medians))
    print("\n| config | s/iteration before -> after | update s | generation + reference s | peak RSS MB |")
    print("| --- | --- | --- | --- | --- |")
    for config, medians in rows:
        before, after = medians["before"], medians["after"]
        cells = [f"{before[key]:.2f} -> {after[key]:.2f} ({after[key] / before[key]:.2f})"
                 for key in ("iteration", "update", "generation")]
        cells.append(f"{before['peak']:.0f} -> {after['peak']:.0f} ({after['peak'] / before['peak']:.2f})")
        print(f"| {config} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
