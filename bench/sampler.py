"""Per-step cost of drawing one token per row: the keyed device sampler vs the per-row generator sampler it
replaced, side by side on the same logits.

    OMP_NUM_THREADS=2 .venv/bin/python bench/sampler.py [--vocab 151936] [--batches 64 512] [--repeats 5]

"previous": each row's own `torch.Generator` draws V exponentials on the CPU in a Python loop, and the (B, V)
noise is copied to the logits' device (argmax(log p - log E)). "keyed": `rollout.sampling.sample_from_logits`,
one keyed uniform per row computed where the logits are, inverse CDF in two float64 stages. Prints the median
seconds per step of each, the ratio, and the bytes of random numbers each materialises per step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from training_wizard.rollout.prompts import row_seed
from training_wizard.rollout.sampling import sample_from_logits


def previous_sampler(logits: torch.Tensor, temperature: float, generators: list[torch.Generator]) -> torch.Tensor:
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    noise = torch.stack(
        [torch.empty(logits.shape[-1], dtype=torch.float32).exponential_(generator=g) for g in generators]
    ).to(logits.device)
    return (log_probs - noise.log()).argmax(dim=-1)


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151_936)  # Qwen2's vocabulary
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"device {args.device}, vocabulary {args.vocab}, torch threads {torch.get_num_threads()}")
    print("| rows | previous s/step | keyed s/step | previous / keyed | random bytes/step previous | keyed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rows in args.batches:
        torch.manual_seed(0)
        logits = torch.randn(rows, args.vocab, device=args.device) * 3
        seeds = [row_seed(42, 0, slot) for slot in range(rows)]
        keys = torch.tensor(seeds, dtype=torch.long, device=args.device)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]

        def sync():
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()

        previous = median_seconds(lambda: (previous_sampler(logits, 0.7, generators), sync()), args.repeats)
        keyed = median_seconds(lambda: (sample_from_logits(logits, 0.7, keys, 3), sync()), args.repeats)
        print(f"| {rows} | {previous:.3f} | {keyed:.4f} | {previous / keyed:.1f} | {rows * args.vocab * 4 / 1e6:.0f} MB "
              f"| {rows * 8 / 1e3:.1f} kB |")


if __name__ == "__main__":
    main()
