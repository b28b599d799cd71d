"""Reward functions in TRL's form, under the names of `trl.rewards` (TRL 1.16), so that a script that imports them
ports by changing the import: `from training_wizard.rewards import accuracy_reward, ...`. Name them in a recipe's
`reward_funcs` as "training_wizard.rewards:<name>" (the factories from a module of your own).

- `accuracy_reward(completions, solution | answer)`: the final answer equals the gold one numerically (TRL checks
  with math-verify; AccuracyRewardSpec with mode "math_verify" does that here); None where the gold is no number.
- `reasoning_accuracy_reward(completions, solution, reasoning_delimiters=None)`: the same on the text after the last
  reasoning delimiter ("</think>" by default); 0.0 when no delimiter closes the reasoning.
- `think_format_reward(completions)`: 1.0 for "<think>...</think>" then the answer.
- `get_cosine_scaled_reward(max_len, ...)`: correctness scaled by the completion's length in tokens on a cosine
  schedule (short right answers earn most, short wrong ones lose most), "Demystifying Long Chain-of-Thought
  Reasoning" (Yeo et al. 2025), appendix C.1.
- `get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)`: the share of repeated token n-grams times
  max_penalty, the same paper's appendix C.2.
- `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)`: DAPO's length penalty.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from training_wizard.specs.verifiable import (
    accuracy_reward, completion_text, get_soft_overlong_punishment, think_format_reward,
)

__all__ = ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
           "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward"]


def reasoning_accuracy_reward(completions: list[Any], solution: list[Any] | None = None,
                              reasoning_delimiters: list[str] | None = None, **kwargs: Any) -> list[float | None]:
    """accuracy_reward on what follows the last reasoning delimiter of each completion; 0.0 for a completion whose
    reasoning never ends (an answer inside the reasoning does not count); None where the gold is no number."""
    delimiters = reasoning_delimiters if reasoning_delimiters is not None else ["</think>"]
    answers = []
    for completion in completions:
        text = completion_text(completion)
        ends = [text.rfind(delimiter) + len(delimiter) for delimiter in delimiters if delimiter in text]
        answers.append(text[max(ends):] if ends else None)
    scored = accuracy_reward([answer or "" for answer in answers], solution=solution, **kwargs)
    return [score if score is None or answer is not None else 0.0 for score, answer in zip(scored, answers)]


class CosineScaledReward:
    """get_cosine_scaled_reward's function (a class: picklable, unlike a closure)."""

    __name__ = "cosine_scaled_reward"

    def __init__(self, max_len: int, min_value_wrong: float, max_value_wrong: float, min_value_correct: float,
                 max_value_correct: float):
        if max_len <= 0:
            raise ValueError(f"max_len must be positive; got {max_len}")
        self.max_len = max_len
        self.wrong = (max_value_wrong, min_value_wrong)  # (at the longest, at the shortest)
        self.correct = (min_value_correct, max_value_correct)

    def __call__(self, completions: list[Any], solution: list[Any] | None = None,
                 completion_ids: list[list[int]] | None = None, **kwargs: Any) -> list[float | None]:
        if completion_ids is None:
            raise ValueError("cosine_scaled_reward needs completion_ids (the trainer passes them)")
        rewards: list[float | None] = []
        for right, ids in zip(accuracy_reward(completions, solution=solution, **kwargs), completion_ids):
            if right is None:
                rewards.append(None)
                continue
            # past max_len the schedule stays at its long end (cos would climb back up)
            progress = min(len(ids) / self.max_len, 1.0)
            long_end, short_end = self.correct if right else self.wrong
            rewards.append(long_end + 0.5 * (short_end - long_end) * (1.0 + math.cos(progress * math.pi)))
        return rewards


def get_cosine_scaled_reward(max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                             min_value_correct: float = 0.5, max_value_correct: float = 1.0) -> Callable:
    """A right completion of n tokens earns from max_value_correct (n = 0) down to min_value_correct (n >=
    max_len); a wrong one from min_value_wrong (n = 0) up to max_value_wrong (n >= max_len); None where the gold
    is no number. TRL's defaults."""
    return CosineScaledReward(max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)


class RepetitionPenalty:
    """get_repetition_penalty_reward's function (a class: picklable, unlike a closure)."""

    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float):
        if max_penalty > 0:
            raise ValueError(f"max_penalty must not be positive; got {max_penalty}")
        self.ngram_size, self.max_penalty = ngram_size, max_penalty

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        penalties = []
        for ids in completion_ids:
            grams = [tuple(ids[i : i + self.ngram_size]) for i in range(len(ids) - self.ngram_size + 1)]
            repeated = 1.0 - len(set(grams)) / len(grams) if grams else 0.0
            penalties.append(repeated * self.max_penalty if repeated else 0.0)
        return penalties


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable:
    """(1 - distinct n-grams / n-grams) x max_penalty over each completion's token ids: 0 without a repeat, toward
    max_penalty for a completion that only repeats; 0 for one shorter than ngram_size. TRL's defaults."""
    return RepetitionPenalty(ngram_size, max_penalty)
