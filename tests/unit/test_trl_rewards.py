"""training_wizard.rewards gives what TRL 1.16's trl.rewards gives, under the same names.

tests/fixtures/trl_rewards.json holds TRL's outputs on its docstring examples and on 50 generated inputs per
function and setting (written by scripts/trl_reward_fixture.py with TRL installed); TRL itself is not needed here.
"""

import json
import pickle
import threading
from pathlib import Path

import pytest

from training_wizard import rewards
from training_wizard.errors import UserError
from training_wizard.specs import verifiable

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "trl_rewards.json").read_text())
CASES = FIXTURE["cases"]


def case_id(case: dict) -> str:
    return f"{case['case']}-{case['function']}-{json.dumps(case['factory'])}"


def build(case: dict):
    """The case's reward function here: the function itself, or what its factory builds from the case's setting."""
    function = getattr(rewards, case["function"])
    return function(**case["factory"]) if case["factory"] is not None else function


def test_the_module_has_trl_s_names_and_the_fixture_covers_them():
    assert sorted(rewards.__all__) == ["accuracy_reward", "get_cosine_scaled_reward", "get_repetition_penalty_reward",
                                       "get_soft_overlong_punishment", "reasoning_accuracy_reward",
                                       "think_format_reward"]
    assert FIXTURE["trl"].startswith("1.16.") and FIXTURE["math_verify"] == "0.9.0"
    assert {case["function"] for case in CASES if case["case"] == "docstring"} == set(rewards.__all__)
    generated = [case for case in CASES if case["case"] == "generated"]
    assert {case["function"] for case in generated} == set(rewards.__all__)
    assert all(len(case["output"]) == 50 for case in generated)


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_outputs_and_name_equal_trl_s(case):
    reward = build(case)
    logged: dict[str, list] = {}
    kwargs = dict(case["kwargs"])
    if "log_extra" in case:
        kwargs["log_extra"] = logged.__setitem__
    output = reward(*case["args"], **kwargs)
    differing = [(row, ours, theirs) for row, (ours, theirs) in enumerate(zip(output, case["output"]))
                 if ours != theirs]
    assert len(output) == len(case["output"]) and not differing, f"(row, here, TRL): {differing[:5]}"
    assert reward.__name__ == case["name"]
    assert logged == case.get("log_extra", {})


def test_plain_string_completions_score_as_one_message():
    case = next(c for c in CASES if c["case"] == "generated" and c["function"] == "accuracy_reward")
    texts = [completion[0]["content"] for completion in case["kwargs"]["completions"]]
    assert rewards.accuracy_reward(texts, case["kwargs"]["solution"]) == case["output"]


def test_accuracy_gives_no_credit_to_plain_text_and_reads_fractions():
    # the two cases: a fraction is an answer (not None), a bare number in prose earns nothing
    completions = [[{"role": "assistant", "content": r"\boxed{\frac{1}{3}}"}],
                   [{"role": "assistant", "content": "The answer is 3"}]]
    assert rewards.accuracy_reward(completions, [r"\frac{1}{3}", "3"]) == [1.0, 0.0]
    # a number-typed gold is read as its text (TRL skips the row)
    assert rewards.accuracy_reward([r"\boxed{3}", r"\boxed{4}"], [3, 3]) == [1.0, 0.0]


def test_the_functions_log_as_trl_s_and_pickle():
    overlong = rewards.get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    assert overlong.__name__ == "soft_overlong_punishment_reward"
    assert pickle.loads(pickle.dumps(overlong))([[1] * 90]) == [-0.5]
    assert rewards.get_soft_overlong_punishment is verifiable.get_soft_overlong_punishment
    cosine = pickle.loads(pickle.dumps(rewards.get_cosine_scaled_reward(max_len=100)))
    assert cosine([r"\boxed{3}"], ["3"], [[1] * 50]) == [0.75]


def test_math_verify_missing_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)  # an import of it now fails
    for function in (rewards.accuracy_reward, rewards.reasoning_accuracy_reward):
        with pytest.raises(UserError, match=rf"^{function.__name__} needs the math-verify package \(pip install "
                                            r"'training-wizard\[math\]'\)$"):
            function(["</think> 1"], ["1"])


def test_missing_or_miscounted_inputs_are_one_line():
    with pytest.raises(UserError, match="^accuracy_reward needs the gold answers in a column named 'solution'"):
        rewards.accuracy_reward(["1"], answer=["1"])
    with pytest.raises(UserError, match="^reasoning_accuracy_reward: 2 completions but 1 solutions"):
        rewards.reasoning_accuracy_reward(["1", "2"], ["1"])
    cosine = rewards.get_cosine_scaled_reward(max_len=10)
    with pytest.raises(UserError, match="^cosine_scaled_reward needs completion_ids"):
        cosine(["1"], ["1"])
    with pytest.raises(UserError, match="^cosine_scaled_reward: 1 completions but 2 completion_ids"):
        cosine(["1"], ["1"], [[1], [2]])
    with pytest.raises(UserError, match="^soft_overlong_punishment_reward needs completion_ids"):
        rewards.get_soft_overlong_punishment(10, 2)(completions=["1"])


def test_factory_settings_that_cannot_score_are_refused():
    with pytest.raises(ValueError, match="max_penalty must not be positive; got 0.5"):
        rewards.get_repetition_penalty_reward(max_penalty=0.5)
    with pytest.raises(ValueError, match="ngram_size must be at least 1; got 0"):
        rewards.get_repetition_penalty_reward(ngram_size=0)
    with pytest.raises(ValueError, match="max_len must be positive; got 0"):
        rewards.get_cosine_scaled_reward(max_len=0)


def test_accuracy_off_the_main_thread_runs_without_timeouts():
    # math-verify's timeouts are signal alarms, which a worker thread cannot set: there they are off
    results = []
    worker = threading.Thread(target=lambda: results.append(
        rewards.accuracy_reward([r"\boxed{\frac{2}{6}}"], [r"\frac{1}{3}"])))
    worker.start()
    worker.join()
    assert results == [[1.0]]
