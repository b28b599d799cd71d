"""Reward functions in TRL's form, under the names of `trl.rewards` (TRL 1.16), so that a script that imports them
ports by changing the import: `from training_wizard.rewards import accuracy_reward, ...`. Name them in a recipe's
`reward_funcs` as "training_wizard.rewards:<name>" (the factories from a module of your own). Each gives what
TRL's gives, and is logged under the same `__name__` (tests/fixtures/trl_rewards.json holds TRL's outputs, written
by scripts/trl_reward_fixture.py).

- `accuracy_reward(completions, solution)`: math-verify decides whether the completion's LaTeX answer (the first
  \\boxed{...}, else the first $...$ or \\(...\\)) equals the `solution`; plain text earns 0.0; None where
  math-verify finds no answer in the solution. Needs math-verify (pip install 'training-wizard[math]').
- `reasoning_accuracy_reward(completions, solution, reasoning_delimiters=None)`: the same on the text after the
  first of `reasoning_delimiters` ("</think>" by default) that the completion holds; 0.0 when none does.
- `think_format_reward(completions)`: 1.0 for "<think>...</think>" then the answer.
- `get_cosine_scaled_reward(max_len, ...)`: correctness scaled by the completion's length in tokens on a cosine
  schedule (short right answers earn most, short wrong ones lose most), "Demystifying Long Chain-of-Thought
  Reasoning" (Yeo et al. 2025), appendix C.1.
- `get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)`: the share of repeated token n-grams times
  max_penalty, the same paper's appendix C.2.
- `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)`: DAPO's length penalty.

A completion is TRL's list of messages (its first message is read, as TRL reads it) or a plain string. A gold
answer that is a number rather than text is read as its text (TRL skips such a row).
`training_wizard.specs.verifiable.accuracy_reward` and AccuracyRewardSpec are other checks: numeric, on an
`answer` column.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable

from training_wizard.errors import UserError
from training_wizard.specs import verifiable
from training_wizard.specs.verifiable import get_soft_overlong_punishment, import_math_verify

__all__ = ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
           "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward"]

LogExtra = Callable[[str, list], None]


def message_text(completion: Any) -> str:
    """A completion's text as TRL's functions read it: the first message's content, or a plain string as it is."""
    if isinstance(completion, str):
        return completion
    return str(completion[0]["content"]) if completion else ""


def think_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when a completion opens with '<think>', holds no second '<think>' and closes the block (the answer may
    follow), else 0.0."""
    return verifiable.think_format_reward([message_text(completion) for completion in completions])


def accuracy_reward(completions: list[Any], solution: list[Any] | None = None, log_extra: LogExtra | None = None,
                    **kwargs: Any) -> list[float | None]:
    """1.0 when math-verify finds the completion's LaTeX answer equal to the solution, else 0.0; None (the row is
    not scored) where math-verify finds no answer in the solution. `log_extra(column, values)`, which TRL's
    trainer passes, receives the solutions and what math-verify read from each side."""
    golds = paired_solutions("accuracy_reward", completions, solution)
    return verified_rewards("accuracy_reward", [message_text(c) for c in completions], golds, log_extra)


def reasoning_accuracy_reward(completions: list[Any], solution: list[Any] | None = None,
                              reasoning_delimiters: list[str] | None = None, log_extra: LogExtra | None = None,
                              **kwargs: Any) -> list[float | None]:
    """accuracy_reward on what follows the reasoning: the text after the last occurrence of the first of
    `reasoning_delimiters` (default ["</think>"]) that the completion holds. 0.0 for a completion that holds none
    (an answer inside unfinished reasoning earns nothing), even where the solution has no answer."""
    golds = paired_solutions("reasoning_accuracy_reward", completions, solution)
    delimiters = reasoning_delimiters if reasoning_delimiters is not None else ["</think>"]
    answers: list[str | None] = []
    for completion in completions:
        text = message_text(completion)
        found = next((delimiter for delimiter in delimiters if delimiter in text), None)
        answers.append(None if found is None else text.rpartition(found)[2])
    return verified_rewards("reasoning_accuracy_reward", answers, golds, log_extra)


def paired_solutions(user: str, completions: list[Any], solution: list[Any] | None) -> list[Any]:
    """The gold answers, one per completion; one line naming `user` when they are missing or miscounted."""
    if solution is None:
        raise UserError(f"{user} needs the gold answers in a column named 'solution' (TRL's name for it)")
    if len(solution) != len(completions):
        raise UserError(f"{user}: {len(completions)} completions but {len(solution)} solutions; expected one "
                        "solution per completion")
    return list(solution)


def math_verify_timeouts() -> tuple[int | None, int | None]:
    """(parsing, verifying) limits in seconds. math-verify times out with signal alarms, which only the main
    thread may set, so elsewhere there are none (and its warning that they are off, repeated at every call, is
    silenced)."""
    if threading.current_thread() is threading.main_thread():
        return 10, 5
    for logger in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    return None, None


def verified_rewards(user: str, answers: list[str | None], golds: list[Any], log_extra: LogExtra | None,
                     ) -> list[float | None]:
    """Each answer text against its gold with math-verify; an answer of None (unfinished reasoning) earns 0.0."""
    math_verify = import_math_verify(user)
    from latex2sympy2_extended import NormalizationConfig  # installed with math-verify

    parse_limit, verify_limit = math_verify_timeouts()
    # Only LaTeX counts as an answer, the first \boxed{} before any other; a bare "3" in prose earns nothing.
    answer_config = [math_verify.LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
                                                       boxed_match_priority=0, try_extract_without_anchor=False)]
    rewards: list[float | None] = []
    gold_read, answer_read = [], []
    for answer, gold in zip(answers, golds):
        if answer is None:
            rewards.append(0.0)
            gold_read.append("[incomplete reasoning]")
            answer_read.append("[incomplete reasoning]")
            continue
        gold_parsed = math_verify.parse(gold if isinstance(gold, str) else str(gold), parsing_timeout=parse_limit)
        if not gold_parsed:
            rewards.append(None)
            gold_read.append("[unparseable]")
            answer_read.append("[skipped]")
            continue
        answer_parsed = math_verify.parse(answer, extraction_config=answer_config, extraction_mode="first_match",
                                          parsing_timeout=parse_limit)
        rewards.append(float(math_verify.verify(gold_parsed, answer_parsed, timeout_seconds=verify_limit)))
        gold_read.append(str(gold_parsed))
        answer_read.append(str(answer_parsed) if answer_parsed else "[unparseable]")
    if log_extra is not None:
        for column, values in (("solution", golds), ("gold_parsed", gold_read), ("answer_parsed", answer_read)):
            log_extra(column, values)
    return rewards


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
            raise UserError(f"{self.__name__} needs completion_ids (the trainer and training-wizard eval pass them)")
        if len(completion_ids) != len(completions):
            raise UserError(f"{self.__name__}: {len(completions)} completions but {len(completion_ids)} "
                            "completion_ids; expected one token list per completion")
        rewards: list[float | None] = []
        for right, ids in zip(accuracy_reward(completions, solution), completion_ids):
            if right is None:
                rewards.append(None)
                continue
            # past max_len the schedule stays at its long end (cos would climb back up)
            progress = min(len(ids) / self.max_len, 1.0)
            long_end, short_end = self.correct if right else self.wrong
            rewards.append(float(long_end + 0.5 * (short_end - long_end) * (1.0 + math.cos(progress * math.pi))))
        return rewards


def get_cosine_scaled_reward(max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                             min_value_correct: float = 0.5, max_value_correct: float = 1.0) -> Callable:
    """A right completion of n tokens earns from max_value_correct (n = 0) down to min_value_correct (n >=
    max_len); a wrong one from min_value_wrong (n = 0) up to max_value_wrong (n >= max_len); None where
    math-verify finds no answer in the solution. TRL's defaults."""
    return CosineScaledReward(max_len, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)


class RepetitionPenalty:
    """get_repetition_penalty_reward's function (a class: picklable, unlike a closure)."""

    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float):
        if max_penalty > 0:
            raise ValueError(f"max_penalty must not be positive; got {max_penalty}")
        if ngram_size < 1:
            raise ValueError(f"ngram_size must be at least 1; got {ngram_size}")
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
