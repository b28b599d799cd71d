"""Verifiable rewards: answer extraction, accuracy modes, format, the soft overlong penalty, and their TRL forms."""

from __future__ import annotations

import pytest
from optional_extras import requires

from training_wizard.errors import UserError
from training_wizard.specs.reward_functions import RewardFunctionsSpec
from training_wizard.specs.verifiable import (
    AccuracyRewardSpec,
    FormatRewardSpec,
    OverlongRewardSpec,
    accuracy_reward,
    get_format_reward,
    get_soft_overlong_punishment,
    gold_number,
    last_boxed,
    think_format_reward,
    to_number,
)


@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7", 7.0),
    ("total: 1,234 apples", 1234.0),
    ("1234.0", 1234.0),
    ("$1234", 1234.0),
    ("-2.5 is it.", -2.5),
    ("first 5 then \\boxed{12} and 99", 12.0),  # the boxed answer wins over a later number
    ("\\boxed{1} then \\boxed{\\frac{3}{4}}", 4.0),  # the last box; its last number
    ("Natalia sold 48 clips... #### 72", 72.0),  # GSM8K's answer format
    ("no digits", None),
    (42, 42.0),
])
def test_to_number(text, expected):
    assert to_number(text) == expected


def test_last_boxed_matches_nested_braces():
    assert last_boxed("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{open") is None and last_boxed("none") is None


def test_numeric_accuracy_with_tolerance():
    spec = AccuracyRewardSpec()
    completions = ["It is 1,234.", "1234.0", "\\boxed{1233}", "1234.01", "nothing"]
    assert spec.score(["p"] * 5, completions, {"answer": ["1234"] * 5})[0] == [1.0, 1.0, 0.0, 0.0, 0.0]
    loose = AccuracyRewardSpec(tolerance=1e-5)  # 1e-5 * 1234 = 0.01234 > 0.01 > 1e-6 * 1234
    assert loose.score(["p"], ["1234.01"], {"answer": [1234]})[0] == [1.0]


def test_exact_accuracy_and_case_folding():
    completions = ["  Paris ", "paris", "The answer: \\boxed{Paris}", "Paris, France"]
    golds = {"city": ["Paris"] * 4}
    assert AccuracyRewardSpec(column="city", mode="exact").score(["p"] * 4, completions, golds)[0] == [
        1.0, 0.0, 1.0, 0.0]
    folded = AccuracyRewardSpec(column="city", mode="exact", case_sensitive=False)
    assert folded.score(["p"] * 4, completions, golds)[0] == [1.0, 1.0, 1.0, 0.0]


def test_accuracy_errors_name_column_and_row():
    with pytest.raises(UserError, match=r"reward.column: the dataset has no column 'answer' \(columns: solution\)"):
        AccuracyRewardSpec().score(["p"], ["1"], {"solution": ["1"]})
    for gold in ("n/a", "1/2"):  # a fraction is no number here: not its last digits
        with pytest.raises(UserError, match=rf"reward.column 'answer', row 1: the answer '{gold}' is not one number"):
            AccuracyRewardSpec().score(["p"] * 2, ["1", "2"], {"answer": ["1", gold]}, step=3)


@pytest.mark.parametrize("gold, expected", [
    ("1,234", 1234.0), (" $12 ", 12.0), ("-0.5", -0.5), ("\\boxed{7}", 7.0), ("72.", 72.0), (3, 3.0),
    ("1/2", None), ("\\frac{1}{2}", None), ("3-5", None), ("about 7", None), ("", None),
])
def test_gold_number_is_strict(gold, expected):
    assert gold_number(gold) == expected


@requires("math_verify")
def test_math_verify_mode_checks_equivalence():
    spec = AccuracyRewardSpec(mode="math_verify")
    completions = ["so $\\boxed{\\frac{1}{2}}$", "$\\boxed{0.5}$", "$\\boxed{3}$"]
    assert spec.score(["p"] * 3, completions, {"answer": ["$0.5$"] * 3})[0] == [1.0, 1.0, 0.0]


def test_math_verify_missing_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)  # an import of it now fails
    with pytest.raises(UserError, match=r"mode 'math_verify' needs the math-verify package \(pip install"):
        AccuracyRewardSpec(mode="math_verify").score(["p"], ["1"], {"answer": ["1"]})


def test_accuracy_reward_function_trl_form():
    completions = ["7", [{"role": "assistant", "content": "\\boxed{8}"}], "9"]
    assert accuracy_reward(completions, answer=["7", "9", "no number"], trainer_state=None) == [1.0, 0.0, None]
    # "1/2" is not one number: the row is skipped, not scored against its last digit (the completion "2")
    assert accuracy_reward(["2", "0.5"], answer=["1/2", "1/2"]) == [None, None]
    assert accuracy_reward(["7", "8"], solution=["7", "7"]) == [1.0, 0.0]  # TRL's column name
    with pytest.raises(UserError, match="accuracy_reward needs the correct answers in a column named 'answer'"):
        accuracy_reward(["7"], gold=["7"])


def test_format_reward_fullmatch_and_search():
    spec = FormatRewardSpec(pattern=r"<answer>\d+</answer>")
    completions = [" <answer>12</answer>\n", "x <answer>12</answer>", "<answer>a</answer>"]
    assert spec.score(["p"] * 3, completions, {})[0] == [1.0, 0.0, 0.0]
    assert FormatRewardSpec(pattern=r"<answer>\d+</answer>", search=True).score(["p"] * 3, completions, {})[0] == [
        1.0, 1.0, 0.0]
    with pytest.raises(Exception, match="(?s)pattern.*invalid regular expression"):
        FormatRewardSpec(pattern="(unclosed")
    assert get_format_reward(r"\d+")(completions=["12", "a1"]) == [1.0, 0.0]


def test_think_format_reward():
    completions = ["<think>\nhmm\n</think>\nThe answer is 4.", "The answer is 4.", "<think>a<think>b</think> 4",
                   "<think>a</think> 4 <think>b</think>", "  <think>a</think> 4", "<think>open 4"]
    assert think_format_reward(completions=completions) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # as TRL's


def test_soft_overlong_penalty_values():
    # max 10, cache 4: 0 up to 6 tokens, then (6 - L) / 4 down to -1 at 10, -1 beyond
    punish = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    lengths = [3, 6, 7, 8, 10, 11]
    assert punish(completion_ids=[[0] * n for n in lengths]) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    spec = OverlongRewardSpec(max_completion_length=10, soft_punish_cache=4)
    assert spec.uses_trl_inputs()
    assert spec.score(["p"] * 2, ["a", "b"], {"completion_ids": [[1] * 8, [1] * 2]})[0] == [-0.5, 0.0]
    with pytest.raises(UserError, match="needs completion_ids \\(the trainer and training-wizard eval"):
        spec.score(["p"], ["a"], {})
    with pytest.raises(Exception, match="soft_punish_cache: 5 is more than max_completion_length 4"):
        OverlongRewardSpec(max_completion_length=4, soft_punish_cache=5)


def test_builtin_functions_in_reward_funcs():
    spec = RewardFunctionsSpec(reward_funcs=["training_wizard.specs.verifiable:accuracy_reward",
                                             "training_wizard.specs.verifiable:think_format_reward"],
                               reward_weights=[1.0, 0.5])
    total, components = spec.score(["p"] * 2, ["<think>x</think> 7", "8"], {"answer": ["7", "7"]})
    assert total == [1.5, 0.0] and list(components) == ["accuracy_reward", "think_format_reward"]


OVERLONG = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)


def test_soft_overlong_punishment_is_logged_under_trl_s_name():
    # TRL 1.16 logs it as rewards/soft_overlong_punishment_reward; a cache wider than the maximum is TRL's ramp
    spec = RewardFunctionsSpec(reward_funcs=["tests.unit.test_verifiable:OVERLONG"])
    total, components = spec.score(["p"] * 2, ["a", "b"], {"completion_ids": [[1] * 8, [1] * 2]})
    assert total == [-0.5, 0.0] and list(components) == ["soft_overlong_punishment_reward"]
    assert get_soft_overlong_punishment(max_completion_len=4, soft_punish_cache=6)([[1] * 0, [1] * 3]) == [
        -0.3333333333333333, -0.8333333333333334]
