"""Verifiable rewards: answer accuracy, format and the soft overlong penalty, as TRL-form functions (for
`reward_funcs`) and as specs with parameters.

Functions (name them in `reward_funcs` as 'training_wizard.specs.verifiable:<name>'):
- `accuracy_reward(completions, answer, **kwargs)`: 1.0 when the completion's final answer equals the `answer`
  column (or TRL's `solution`) numerically, else 0.0; None where the gold answer is not one number (the function
  then skips that row; symbolic answers such as fractions need `AccuracyRewardSpec` with mode "math_verify", or
  TRL's LaTeX check, `training_wizard.rewards.accuracy_reward`).
- `think_format_reward(completions, **kwargs)`: 1.0 when the completion starts with '<think>', holds no second
  '<think>' and closes the block with '</think>' (the answer may follow), else 0.0; as TRL's function.
- `get_format_reward(pattern, search=False)` and `get_soft_overlong_punishment(max_completion_len,
  soft_punish_cache)`: factories of such functions for a module of your own, as in TRL (the second logged as
  TRL logs it, `soft_overlong_punishment_reward`).

Specs: `AccuracyRewardSpec` (numeric, exact or math_verify), `FormatRewardSpec`, `OverlongRewardSpec`.
The final answer of a text is the content of its last `\\boxed{...}` when it has one, else its last number;
"1,234", "1234.0" and "$1234" are all 1234.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from training_wizard.errors import UserError
from training_wizard.specs.reward import RewardSpec
from training_wizard.specs.text_metrics import valid_regex

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")
_THINK = re.compile(r"<think>(?!.*<think>).*?</think>.*", re.DOTALL)


def completion_text(completion: Any) -> str:
    """The text of a completion in either TRL form: a string, or a list of messages (the last one's content)."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None  # unclosed: no answer


def to_number(value: Any) -> float | None:
    """A number from a value or a text's final answer (last \\boxed{...}, else last number); None if there is none."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    boxed = last_boxed(text)
    found = last_number_text(boxed if boxed is not None else text)
    return float(found) if found is not None else None


def last_number_text(text: str) -> str | None:
    """The last number written in a text, thousands separators removed ("1,234" -> "1234"); None if it has none."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def gold_number(value: Any) -> float | None:
    """The gold answer as a number when it is exactly one (a number, or a text such as "1,234", "$12", "-0.5" or
    "\\boxed{7}"), else None: "1/2" or "3-5" is no number here, rather than its last digits."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    boxed = last_boxed(text)
    text = (boxed if boxed is not None else text).strip().strip("$").strip().rstrip(".")
    if _NUMBER.fullmatch(text) is None:
        return None
    return float(text.replace(",", ""))


def numbers_equal(predicted: float | None, gold: float, tolerance: float) -> bool:
    """Equal within `tolerance` relative to the gold answer's size (absolute below 1)."""
    return predicted is not None and abs(predicted - gold) <= tolerance * max(1.0, abs(gold))


def final_text(text: str) -> str:
    """What exact mode compares: the last \\boxed{...} content if present, else the whole text; stripped."""
    boxed = last_boxed(text)
    return (boxed if boxed is not None else text).strip()


def accuracy_reward(completions: list[Any], answer: list[Any] | None = None, solution: list[Any] | None = None,
                    **kwargs: Any) -> list[float | None]:
    """TRL form: 1.0 when the final answer equals the gold answer numerically (relative tolerance 1e-6), 0.0 when
    not, None where the gold answer is not one number. The gold is the `answer` column, or `solution` (the column
    TRL's accuracy_reward reads)."""
    golds = answer if answer is not None else solution
    if golds is None:
        raise UserError("accuracy_reward needs the correct answers in a column named 'answer' (or 'solution')")
    out: list[float | None] = []
    for completion, gold in zip(completions, golds):
        target = gold_number(gold)
        out.append(None if target is None else
                   float(numbers_equal(to_number(completion_text(completion)), target, 1e-6)))
    return out


def get_format_reward(pattern: str, search: bool = False) -> Callable[..., list[float]]:
    """A TRL-form function: 1.0 when the stripped completion fully matches `pattern` (or contains a match, with
    `search`), else 0.0. Dot matches newlines."""
    compiled = re.compile(pattern, re.DOTALL)
    test = compiled.search if search else compiled.fullmatch

    def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(test(completion_text(c).strip()) is not None) for c in completions]

    return format_reward


def think_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion, unstripped, opens with '<think>', holds no second '<think>' and closes the block
    (anything may follow), else 0.0: TRL's check for reasoning models."""
    return [float(_THINK.fullmatch(completion_text(c)) is not None) for c in completions]


def soft_overlong_penalty(length: int, max_completion_len: int, soft_punish_cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025): 0 up to max - cache tokens, then linearly down to -1 at
    max tokens, -1 beyond."""
    start = max_completion_len - soft_punish_cache
    if length <= start:
        return 0.0
    if length <= max_completion_len:
        return (start - length) / soft_punish_cache
    return -1.0


class SoftOverlongPunishment:
    """get_soft_overlong_punishment's function (a class: picklable, unlike a closure)."""

    __name__ = "soft_overlong_punishment_reward"  # TRL 1.16's name, so it logs as rewards/<this>

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids: list[list[int]] | None = None, **kwargs: Any) -> list[float]:
        if completion_ids is None:
            raise UserError(f"{self.__name__} needs completion_ids (the trainer and training-wizard eval pass them)")
        return [soft_overlong_penalty(len(ids), self.max_completion_len, self.soft_punish_cache)
                for ids in completion_ids]


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable[..., list[float]]:
    """A TRL-form function of the completion token counts (`completion_ids`), as TRL's factory of this name: any
    cache as TRL takes it (0 cuts off past max_completion_len; OverlongRewardSpec asks for 0 <= cache <= max)."""
    return SoftOverlongPunishment(max_completion_len, soft_punish_cache)


def import_math_verify(user: str) -> Any:
    """The math_verify module, or one line naming `user` (what needs it) and the extra that installs it."""
    try:
        import math_verify
    except ImportError:
        raise UserError(f"{user} needs the math-verify package (pip install 'training-wizard[math]')") from None
    return math_verify


# --------------------------------------------------------------------------------------------------------------
# Specs


class AccuracyRewardSpec(RewardSpec):
    """1.0 when the completion's final answer equals the row's answer column, else 0.0."""

    column: str = Field("answer", description="Dataset column holding the correct answer.")
    mode: Literal["numeric", "exact", "math_verify"] = Field(
        "numeric", description="'numeric': the final answer (last \\boxed{...}, else last number) equals the "
        "column's number within tolerance; 'exact': the final answer (last \\boxed{...}, else the whole text) "
        "equals the column's text, stripped; 'math_verify': the math-verify package decides (symbolic "
        "equivalence; pip install 'training-wizard[math]')."
    )
    tolerance: float = Field(1e-6, ge=0.0, description="numeric: allowed difference, relative to the answer's "
                             "size (absolute below 1).")
    case_sensitive: bool = Field(True, description="exact: false compares case-folded text.")

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if self.column not in columns:
            raise UserError(f"reward.column: the dataset has no column '{self.column}' "
                            f"(columns: {', '.join(sorted(columns)) or 'none'})")
        golds = columns[self.column]
        if self.mode == "math_verify":
            return [self._math_verify(c, g, row) for row, (c, g) in enumerate(zip(completions, golds))]
        if self.mode == "exact":
            fold = (lambda s: s) if self.case_sensitive else str.casefold
            return [float(fold(final_text(c)) == fold(str(g).strip())) for c, g in zip(completions, golds)]
        out = []
        for row, (completion, gold) in enumerate(zip(completions, golds)):
            target = gold_number(gold)
            if target is None:
                raise UserError(f"reward.column '{self.column}', row {row}: the answer {gold!r} is not one number "
                                "(mode 'numeric'; use mode 'math_verify' for symbolic answers, 'exact' for text)")
            out.append(float(numbers_equal(to_number(completion), target, self.tolerance)))
        return out

    def _math_verify(self, completion: str, gold: Any, row: int) -> float:
        math_verify = import_math_verify("reward.mode 'math_verify'")
        parse, verify = math_verify.parse, math_verify.verify
        # math-verify's own timeouts use signal alarms, which work only on the main thread
        limits = {} if threading.current_thread() is threading.main_thread() else {"parsing_timeout": None}
        gold_parsed = parse(str(gold), **limits)
        if not gold_parsed:
            raise UserError(f"reward.column '{self.column}', row {row}: math-verify found no answer in {gold!r}")
        verify_limits = {} if not limits else {"timeout_seconds": None}
        return float(verify(gold_parsed, parse(completion, **limits), **verify_limits))


class FormatRewardSpec(RewardSpec):
    """1.0 when the stripped completion matches `pattern` (the whole of it, or anywhere with `search`), else 0.0."""

    pattern: str = Field(description="Python regular expression; '.' also matches newlines.")
    search: bool = Field(False, description="true: a match anywhere counts; false: the whole completion must match.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        return valid_regex(pattern)

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return get_format_reward(self.pattern, self.search)(completions)


class OverlongRewardSpec(RewardSpec):
    """DAPO's soft overlong punishment on the completion's token count: 0 up to max_completion_length -
    soft_punish_cache tokens, then linearly down to -1 at max_completion_length, -1 beyond."""

    needs_trl_inputs: ClassVar[bool] = True

    max_completion_length: int = Field(gt=0, description="Token count at which the penalty reaches -1 (usually the "
                                       "training's response_length).")
    soft_punish_cache: int = Field(ge=0, description="Width in tokens of the linear ramp before "
                                   "max_completion_length.")

    @model_validator(mode="after")
    def _cache_fits(self) -> OverlongRewardSpec:
        if self.soft_punish_cache > self.max_completion_length:
            raise ValueError(f"soft_punish_cache: {self.soft_punish_cache} is more than max_completion_length "
                             f"{self.max_completion_length}")
        return self

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        punish = get_soft_overlong_punishment(self.max_completion_length, self.soft_punish_cache)
        return punish(completion_ids=columns.get("completion_ids"))

