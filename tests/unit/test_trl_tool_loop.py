"""Episodes played as TRL 1.16's `GRPOTrainer._tool_call_loop` plays them on the same inputs (the expected numbers
are TRL's, worked out from its code): arguments typed by the tool's schema, results given as str(), a tool result
past the token budget rolled back, the reset text appended to the prompt as it is, and TRL-form rewards given the
played prompt and the replies' `tool_calls`."""

from __future__ import annotations

import importlib

import pytest

from tests.unit import test_tool_episodes as tool_episodes
from tests.unit.test_tool_episodes import Calculator, call, make, rows_of, tool_part
from training_wizard.errors import UserError
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.rollout.environments import EMPTY_PROMPT, environment_rows
from training_wizard.rollout.tools import ToolCall, call_tool
from training_wizard.rollout.trajectory import StopReason
from training_wizard.specs.reward_functions import RewardFunctionsSpec

SEEN: dict[str, list] = {}


def seen() -> dict[str, list]:
    """What `remember` saw: the reward spec imports this module by its dotted name, which may be a second copy."""
    return importlib.import_module("tests.unit.test_trl_tool_loop").SEEN


@pytest.fixture(autouse=True)
def scripts(monkeypatch):
    monkeypatch.setitem(tool_episodes.SCRIPTS, "typed", [call("multiply", a="6", b=7), "Done."])
    monkeypatch.setitem(tool_episodes.SCRIPTS, "table", [call("table", a=6), "Done."])
    seen().clear()


class Observing(Calculator):
    """The calculator whose reset supplies an observation, and a tool giving a dict."""

    def reset(self, prompt=None, **row):
        super().reset()
        return " Observation."

    def table(self, a: int) -> dict:
        """The product table of a number.

        Args:
            a: The number.
        """
        return {"double": 2 * a}


def remember(prompts, completions, **columns):
    SEEN.setdefault("prompts", []).extend(prompts)
    SEEN.setdefault("completions", []).extend(completions)
    return [0.0] * len(completions)


def trl_reward():
    return RewardFunctionsSpec(reward_funcs=["tests.unit.test_trl_tool_loop:remember"])


def test_arguments_are_typed_by_the_tools_schema_as_trl_types_them(tokenizer, tmp_path):
    # TRL: parse_response(..., tools=) reads {"a": "6"} for `a: int` as 6, so multiply gives 42 (here it was
    # "6" * 7 = "6666666")
    batch = make(tokenizer, tmp_path, ["typed"]).collect_rollout()
    assert "<tool_response>\n42\n</tool_response>" in tool_part(tokenizer, batch, 0)
    assert call_tool({"echo": lambda_text}, ToolCall("echo", {"text": "6"}))[0] == "6"  # a str parameter stays text


def lambda_text(text: str) -> str:
    """Give the text back.

    Args:
        text: Anything.
    """
    return text


def test_a_result_that_is_not_text_is_given_as_trl_gives_it(tokenizer, tmp_path):
    # TRL: str(result), so the dict reads {'double': 12} (json.dumps gave {"double": 12})
    batch = make(tokenizer, tmp_path, ["table"], factory=Observing).collect_rollout()
    assert "<tool_response>\n{'double': 12}\n</tool_response>" in tool_part(tokenizer, batch, 0)


def test_a_tool_result_past_the_budget_is_rolled_back_and_the_row_is_not_truncated(tokenizer, tmp_path):
    renderer = TurnRenderer(make(tokenizer, tmp_path, ["good"]).tokenizer, with_tools=True)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = tokenizer(tool_episodes.SCRIPTS["good"][0], add_special_tokens=False)["input_ids"] + [end]
    result = renderer.message_ids([{"role": "tool", "name": "multiply", "content": "42"}], end)
    # one token short of reply + result: TRL's check `len(completion + suffix) > max_completion_length` drops the
    # result, and the completion is the reply alone, ending with its stop token (not truncated)
    trainer = make(tokenizer, tmp_path, ["good"], reward=trl_reward(), response_length=len(reply) + len(result) - 1,
                   mask_truncated_completions=True, missing_eos_penalty=1.0)
    batch = trainer.collect_rollout()
    for row in rows_of(batch, "good"):
        real = batch.completion_mask[row]
        assert batch.completion_ids[row][real].tolist() == reply
        # TRL keeps every token of the reply in the loss (72 in the probe's model; this tokenizer's count here)
        assert int(batch.loss_mask[row].sum()) == len(reply)
        assert batch.stop_reason[row] == StopReason.STOP_TOKEN and bool(batch.has_stop[row])
    assert batch.scores.tolist() == [1.0, 1.0]  # Calculator's get_reward: the call ran; no missing_eos_penalty
    assert [message["role"] for message in seen()["completions"][0]] == ["assistant"]


def test_rewards_get_the_prompt_with_the_reset_text_and_the_calls(tokenizer, tmp_path):
    # TRL appends reset's text to the last user message as it is, and gives reward functions that prompt and the
    # parsed replies (tool_calls typed by the schema)
    batch = make(tokenizer, tmp_path, ["typed"], factory=Observing, reward=trl_reward()).collect_rollout()
    assert batch.queries == ["Case typed. Observation."] * 2
    assert seen()["prompts"][0] == [{"role": "user", "content": "Case typed. Observation."}]
    first = seen()["completions"][0][0]
    assert first["tool_calls"] == [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 6,
                                                                                                      "b": 7}}}]
    assert first["content"] == "" and seen()["completions"][0][1] == {"role": "tool", "name": "multiply",
                                                                      "content": "42"}


def test_rows_for_an_environment_that_supplies_the_prompt():
    assert environment_rows(None, Calculator, 2) == [{"prompt": list(EMPTY_PROMPT)}] * 2
    assert environment_rows([{"environment": "a"}], {"a": Calculator}, 2) == [
        {"environment": "a", "prompt": list(EMPTY_PROMPT)}]
    rows = [{"prompt": "Hi"}]
    assert environment_rows(rows, Calculator, 2) == rows and environment_rows(rows, None, 2) is rows
    with pytest.raises(UserError, match="train_dataset: required with a dict of environment factories"):
        environment_rows(None, {"a": Calculator}, 2)
