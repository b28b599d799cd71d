"""How much of a stale batch each correction rule masks or caps, at 64 and 512 completion tokens.

The per-token log-ratio between the proximal and the behaviour policy (one update of staleness) is drawn from a
normal distribution of standard deviation SIGMA, a stand-in for the measured gaps (the RLOO blog's bf16
mismatch, AReaL's staleness curves): the rules are then compared on the same draws. The weights are the
library's own (`core.importance_sampling.sampling_correction_weights`). Prints a Markdown table: per rule, the
share of tokens whose weight is 0 (masked) and whose weight was lowered by the cap (capped).

    OMP_NUM_THREADS=1 python bench/async_correction.py [--rows 4096]
"""

from __future__ import annotations

import argparse

import torch

from training_wizard.core.importance_sampling import sampling_correction_weights

RULES = {  # name: (mode, clip_min, clip_max)
    "sequence_mask, 3 (today's default)": ("sequence_mask", None, 3.0),
    "sequence_truncate, 3": ("sequence_truncate", None, 3.0),
    "token_truncate, 3 (TRL's cap)": ("token_truncate", None, 3.0),
    "token_mask, 5 (AReaL)": ("token_mask", None, 5.0),
}
SIGMAS = (0.02, 0.05, 0.1)
LENGTHS = (64, 512)


def shares(rows: int, length: int, sigma: float, mode: str, clip_min, clip_max, seed: int) -> tuple[float, float]:
    """(share of tokens masked, share of tokens capped) for one rule on seeded draws."""
    generator = torch.Generator().manual_seed(seed)
    gap = torch.randn(rows, length, generator=generator, dtype=torch.float64) * sigma
    mask = torch.ones(rows, length, dtype=torch.bool)
    weights = sampling_correction_weights(gap, torch.zeros_like(gap), mask, mode, clip_min, clip_max)
    raw = weights.raw.unsqueeze(-1).expand(rows, length) if mode.startswith("sequence") else weights.raw
    masked = weights.token == 0
    capped = ~masked & (weights.token < raw)
    return float(masked.double().mean()), float(capped.double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    args = parser.parse_args()
    print("| rule | sigma | masked @64 | capped @64 | masked @512 | capped @512 |")
    print("|---|---|---|---|---|---|")
    for name, (mode, low, high) in RULES.items():
        for sigma in SIGMAS:
            cells = []
            for length in LENGTHS:
                masked, capped = shares(args.rows, length, sigma, mode, low, high, seed=length)
                cells += [f"{masked:.1%}", f"{capped:.1%}"]
            print(f"| {name} | {sigma} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
