"""How much of a stale batch each correction rule masks or caps, at 64 and 512 completion tokens.

The per-token log-ratio between the proximal and the behaviour policy (one update of staleness) is drawn from a
normal distribution of standard deviation SIGMA, a stand-in for the measured gaps (the RLOO blog's bf16
mismatch, AReaL's staleness curves): the rules are then compared on the same draws. The weights are the
library's own (`core.importance_sampling.sampling_correction_weights`). Prints a Markdown table: per rule, the
share of tokens whose weight is 0 (masked) and whose weight was lowered by the cap (capped), for a token loss
(GRPO, PPO), and the same shares of completions for a sequence loss (RLOO: a token rule weighs a completion by
the product of its bounded token weights, bounded again).

    OMP_NUM_THREADS=1 python bench/async_correction.py [--rows 4096]
"""

from __future__ import annotations

import argparse

import torch

from training_wizard.core.importance_sampling import sampling_correction_weights

RULES = {  # name: (mode, clip_min, clip_max)
    "sequence_mask, 3 (earlier default)": ("sequence_mask", None, 3.0),
    "sequence_truncate, 3": ("sequence_truncate", None, 3.0),
    "token_truncate, 3 (default, TRL's cap)": ("token_truncate", None, 3.0),
    "token_mask, 5 (AReaL)": ("token_mask", None, 5.0),
}
SIGMAS = (0.02, 0.05, 0.1)
LENGTHS = (64, 512)


def shares(rows: int, length: int, sigma: float, mode: str, clip_min, clip_max, seed: int) -> tuple[float, ...]:
    """(tokens masked, tokens capped, completions masked, completions capped), as shares, for one rule on seeded
    draws."""
    generator = torch.Generator().manual_seed(seed)
    gap = torch.randn(rows, length, generator=generator, dtype=torch.float64) * sigma
    mask = torch.ones(rows, length, dtype=torch.bool)
    weights = sampling_correction_weights(gap, torch.zeros_like(gap), mask, mode, clip_min, clip_max)
    raw = weights.raw.unsqueeze(-1).expand(rows, length) if mode.startswith("sequence") else weights.raw
    masked = weights.token == 0
    capped = ~masked & (weights.token < raw)
    whole = gap.sum(-1).exp()  # a completion's unbounded weight
    dropped = weights.sequence == 0
    lowered = ~dropped & (weights.sequence < whole * (1 - 1e-9))  # below by more than rounding
    return tuple(float(share.double().mean()) for share in (masked, capped, dropped, lowered))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    args = parser.parse_args()
    print("| rule | sigma | tokens masked @64 | capped @64 | masked @512 | capped @512 | completions masked @64 "
          "| capped @64 | masked @512 | capped @512 |")
    print("|---" * 10 + "|")
    for name, (mode, low, high) in RULES.items():
        for sigma in SIGMAS:
            cells = {length: shares(args.rows, length, sigma, mode, low, high, seed=length) for length in LENGTHS}
            ordered = [cells[length][i] for part in (0, 2) for length in LENGTHS for i in (part, part + 1)]
            print(f"| {name} | {sigma} | " + " | ".join(f"{share:.1%}" for share in ordered) + " |")

if __name__ == "__main__":
    main()
