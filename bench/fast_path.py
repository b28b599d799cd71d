"""Before and after the fast path, side by side: the same RLOO run with an earlier revision of training-wizard and
with this one (default options, then `logprobs_from_sampling = true`), alternating in fresh processes.

    git worktree add --detach ../before REVISION
    OMP_NUM_THREADS=2 .venv/bin/python bench/fast_path.py --before ../before [--rounds 2] [--model 25m]
        [--length 32] [--iterations 6] [--learning-rate 1e-4]

Each run is `bench/bench_rloo.py`'s worker for our trainer (same model, prompts, reward and batch: 16 prompts x 4
completions, one epoch, one mini-batch, float32, activation checkpointing off) with PYTHONPATH pointing at the
revision under test. The learning rate is high enough for the reward (share of 'e') to move, so the scores per
iteration show whether the runs still learn alike. Prints seconds per iteration split into generation (with the
logprob passes) and update, the ratio to the earlier revision, and the scores per iteration.
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
    parser.add_argument("--model", default="25m")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    args = parser.parse_args()
    folder = build_models(args.cache)[args.model]
    variants = [("before", args.before.resolve(), []), ("after", REPO, []),
                ("after, logprobs_from_sampling", REPO, ["logprobs_from_sampling=true"])]
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for index, (name, checkout, extra) in enumerate(variants):
                wait_for_quiet()
                began = time.perf_counter()
                results[name].append(run_ours(
                    checkout, folder, args.length, Path(scratch) / f"{round_index}-{index}", warmup=1,
                    iterations=args.iterations, threads=args.threads, checkpointing="off",
                    options=[f"learning_rate={args.learning_rate}", *extra]))
                print(f"round {round_index} {name}: {time.perf_counter() - began:.0f} s", flush=True)
    base = statistics.median(statistics.mean(r["seconds"]) for r in results["before"])
    print("\n| variant | s/iteration (median of rounds) | generation + logprob passes s | update s | "
          "time vs before | scores per iteration (round 0) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        seconds = statistics.median(statistics.mean(r["seconds"]) for r in runs)
        generation = statistics.median(r["generation_s"] for r in runs)
        update = statistics.median(r["update_s"] for r in runs)
        scores = ", ".join(f"{s:.3f}" for s in runs[0]["scores"])
        print(f"| {name} | {seconds:.2f} | {generation:.2f} | {update:.2f} | {seconds / base:.2f} | {scores} |")


if __name__ == "__main__":
    main()
