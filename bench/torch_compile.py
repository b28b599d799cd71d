"""`torch_compile = true` against the eager update, side by side: the same RLOO run alternating in fresh processes.

    OMP_NUM_THREADS=2 .venv/bin/python bench/torch_compile.py [--rounds 2] [--model 25m] [--length 32]
        [--iterations 8] [--gradient-checkpointing on|off]

Each run is `bench/bench_rloo.py`'s worker for our trainer (16 prompts x 4 completions, one epoch, one mini-batch,
float32, `logprobs_from_sampling = true`), with no untimed warm-up, so the first iteration carries the compilation.
Prints per variant: the first iteration, the median of the others (seconds per iteration and update seconds), the
ratio compiled / eager of those medians, and the first scores of both (they must agree: compiling changes no
result beyond rounding).
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
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="25m")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--cache", type=Path, default=Path("~/.cache/training-wizard/bench").expanduser())
    args = parser.parse_args()
    folder = build_models(args.cache)[args.model]
    variants = {"eager": [], "torch_compile": ["torch_compile=true"]}
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for name, extra in variants.items():
                wait_for_quiet()
                began = time.perf_counter()
                results[name].append(run_ours(
                    REPO, folder, args.length, Path(scratch) / f"{round_index}-{name}", warmup=0,
                    iterations=args.iterations, threads=args.threads, checkpointing=args.gradient_checkpointing,
                    options=["logprobs_from_sampling=true", *extra]))
                print(f"round {round_index} {name}: {time.perf_counter() - began:.0f} s", flush=True)
    print("\n| variant | first iteration s (median of rounds) | later iterations s/iteration | their update s | "
          "later iterations vs eager | scores of the first 3 iterations (round 0) |")
    print("| --- | --- | --- | --- | --- | --- |")
    steady = {name: statistics.median(statistics.median(r["seconds"][1:]) for r in runs)
              for name, runs in results.items()}
    for name, runs in results.items():
        first = statistics.median(r["seconds"][0] for r in runs)
        update = statistics.median(statistics.median(r["update_each_s"][1:]) for r in runs)
        scores = ", ".join(f"{s:.4f}" for s in runs[0]["scores"][:3])
        print(f"| {name} | {first:.1f} | {steady[name]:.2f} | {update:.2f} | {steady[name] / steady['eager']:.2f} "
              f"| {scores} |")


if __name__ == "__main__":
    main()
