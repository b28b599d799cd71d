"""Win rate of a candidate over a baseline from pairwise outcomes, with a 95% confidence interval."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959963984540054  # two-sided 95% quantile of the standard normal


@dataclass(frozen=True)
class WinRate:
    """rate = (wins + ties / 2) / n, and its 95% interval [low, high]."""

    rate: float
    low: float
    high: float
    wins: int
    ties: int
    losses: int

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    def describe(self) -> str:
        return (f"win rate {self.rate:.1%} (95% CI {self.low:.1%} to {self.high:.1%}; {self.wins} wins, "
                f"{self.ties} ties, {self.losses} losses of {self.n})")


def win_rate(outcomes: list[float]) -> WinRate:
    """Outcomes per prompt: 1 a win, 0.5 a tie, 0 a loss for the candidate.

    The interval is the normal approximation on the mean outcome, with the sample standard deviation of the
    outcomes (so ties, which count half, narrow it as they should), clipped to [0, 1]. With no spread at all (every
    outcome equal) it is the Wilson score interval of that proportion, which never collapses to a point.
    """
    if not outcomes or any(o not in (0.0, 0.5, 1.0) for o in outcomes):
        raise ValueError("outcomes must be a non-empty list of 0, 0.5 and 1")
    n = len(outcomes)
    rate = sum(outcomes) / n
    counts = dict(wins=outcomes.count(1.0), ties=outcomes.count(0.5), losses=outcomes.count(0.0))
    if n > 1 and len(set(outcomes)) > 1:
        sd = math.sqrt(sum((o - rate) ** 2 for o in outcomes) / (n - 1))
        half = Z_95 * sd / math.sqrt(n)
        return WinRate(rate, max(0.0, rate - half), min(1.0, rate + half), **counts)
    low, high = wilson(rate, n)
    return WinRate(rate, low, high, **counts)


def wilson(proportion: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a proportion observed in n trials."""
    denominator = 1 + z * z / n
    centre = (proportion + z * z / (2 * n)) / denominator
    half = z * math.sqrt(proportion * (1 - proportion) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class MeanScore:
    """The mean of per-prompt scores and its 95% interval [low, high]; `is_share`: every score was 0 or 1, so the
    mean is a share (printed as a percentage; any other score, a rating or a penalty, is printed as it is)."""

    mean: float
    low: float
    high: float
    n: int
    is_share: bool = False

    def describe(self) -> str:
        if self.is_share:
            return f"{self.mean:.1%} (95% CI {self.low:.1%} to {self.high:.1%}; n={self.n})"
        return f"{self.mean:.4g} (95% CI {self.low:.4g} to {self.high:.4g}; n={self.n})"


def mean_score(values: list[float]) -> MeanScore:
    """Mean of `values` with its 95% interval: Wilson's score interval when every value is 0 or 1 (a share, such as
    answers that are right), else the normal approximation with the sample standard deviation."""
    if not values:
        raise ValueError("no values to average")
    n = len(values)
    mean = sum(values) / n
    if all(v in (0.0, 1.0) for v in values):
        low, high = wilson(mean, n)
        return MeanScore(mean, low, high, n, is_share=True)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = Z_95 * sd / math.sqrt(n)
    return MeanScore(mean, mean - half, mean + half, n)
