"""Episodes with tools (rollout/episodes.py, protocol "tools", TRL's environment_factory contract): calls read in
the Hermes form and run, their results spliced in as tokens outside the loss mask, and every way a call can fail
(unknown tool, bad arguments, an exception, a hang, malformed JSON) turned into an error message the episode goes
on with, counted in the tools/* metrics. Replies are scripted (each row's question picks its script), so every
case happens on the tiny random model."""

from __future__ import annotations

import copy
import json
import os
import signal
import threading

import pytest
import torch

from tests.helpers import with_logprobs
from training_wizard import GRPOConfig, GRPOTrainer
from training_wizard.errors import UserError
from training_wizard.rollout.chat_templates import HERMES
from training_wizard.rollout.chat_turns import TurnRenderer
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.rollout.tools import parse_hermes
from training_wizard.rollout.trajectory import StopReason
from training_wizard.testing import build_causal_lm, scripted_backend
from training_wizard.trainers.loop.iteration_metrics import episode_metrics


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# question -> the replies the scripted model gives, one per turn (the last repeats)
SCRIPTS = {
    "good": [call("multiply", a=6, b=7), "It is 42."],
    "unknown": [call("divide", a=6, b=7), "I could not."],
    "bad_arguments": [call("multiply", a=6), "I could not."],
    "raises": [call("explode", x=1), "I could not."],
    "hangs": [call("hang", x=1), "I could not."],
    "malformed": ['<tool_call>\n{"name": "multiply", "arguments": {"a": 6,\n</tool_call>', "I could not."],
    "loops": [call("multiply", a=2, b=3)],
    "answers": ["42, without a tool."],
}


HANG_RELEASE = threading.Event()  # set when the test that calls `hang` ends


class Calculator:
    """Tools for the scripts; the reward is the number of multiplications done."""

    def reset(self, prompt=None, **row):
        self.multiplications = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.multiplications += 1
        return a * b

    def explode(self, x: int) -> int:
        """Fail.

        Args:
            x: Anything.
        """
        raise RuntimeError("boom")

    def hang(self, x: int) -> int:
        """Take too long: answer only once the test has ended, so the call is late however slow the machine.

        Args:
            x: Anything.
        """
        HANG_RELEASE.wait(600)
        return x

    def get_reward(self) -> float:
        return float(self.multiplications)


def scripted_replies(tokenizer):
    """A sampler giving each row its script's reply for the turn it is at (the tool results it has read)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample(model, prompt_ids, prompt_mask, params, seeds, all_finished=None):
        rows = []
        for ids, keep in zip(prompt_ids, prompt_mask):
            context = tokenizer.decode(ids[keep].tolist())
            question = next(name for name in SCRIPTS if f"Case {name}." in context)
            turn = context.count("<tool_response>\n")  # the system message names the tag once
            script = SCRIPTS[question]
            rows.append(tokenizer(script[min(turn, len(script) - 1)], add_special_tokens=False)["input_ids"] + [end])
        width = max(len(row) for row in rows)
        tokens = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        for index, row in enumerate(rows):
            tokens[index, : len(row)] = torch.tensor(row)
        return with_logprobs(tokens)

    return scripted_backend(sample)


def questions(*cases):
    return [{"prompt": [{"role": "user", "content": f"Case {case}."}]} for case in cases]


def make(tokenizer, tmp_path, cases, reward=None, settings=None, tools_only=False, factory=None, policy=None,
         **options):
    tokenizer = copy.deepcopy(tokenizer)  # a trainer given a chat_template sets it on its tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = GRPOConfig(**{**dict(output_dir=str(tmp_path), per_device_train_batch_size=len(cases) * 2,
                                  num_generations=2, total_episodes=len(cases) * 2, response_length=320,
                                  num_sample_generations=0, seed=3, stop_token_ids=[end]), **options})
    environment = {"tools": [multiply]} if tools_only else {"environment_factory": factory or Calculator}
    return GRPOTrainer(config=config, tokenizer=tokenizer, policy=policy or build_causal_lm(tokenizer, seed=1),
                       reward_model=reward, train_dataset=questions(*cases),
                       generation_backend=scripted_replies(tokenizer),
                       episode_settings=settings or EpisodeSettings(chat_template="hermes"), **environment)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def tool_part(tokenizer, batch, row) -> str:
    """The environment's tokens of a row, decoded."""
    return tokenizer.decode(batch.completion_ids[row][batch.completion_mask[row] & ~batch.loss_mask[row]])


def rows_of(batch, case):
    return [row for row, query in enumerate(batch.queries) if query == f"Case {case}."]


def test_a_call_is_run_and_its_result_spliced_in_as_the_templates_ids(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, ["good", "answers"])
    batch = trainer.collect_rollout()
    renderer = TurnRenderer(trainer.tokenizer, with_tools=True)
    end = trainer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = renderer.message_ids([{"role": "tool", "name": "multiply", "content": "42"}], end)
    for row in rows_of(batch, "good"):
        real = batch.completion_mask[row]
        ids, model = batch.completion_ids[row][real].tolist(), batch.loss_mask[row][real].tolist()
        first_reply = trainer.tokenizer(SCRIPTS["good"][0], add_special_tokens=False)["input_ids"] + [end]
        assert ids[: len(first_reply)] == first_reply and all(model[: len(first_reply)])
        tool = ids[len(first_reply): len(first_reply) + len(expected)]
        assert tool == expected and not any(model[len(first_reply): len(first_reply) + len(expected)])
        assert all(model[len(first_reply) + len(expected):])  # the answer after the result is the model's
        assert batch.stop_reason[row] == StopReason.STOP_TOKEN
        assert batch.components["Calculator"][row] == 1.0 and batch.completions[row] == "It is 42."
    for row in rows_of(batch, "answers"):  # no call: the first reply is the answer
        assert batch.loss_mask[row][batch.completion_mask[row]].all() and batch.components["Calculator"][row] == 0.0
    assert batch.episode_stats["calls"].tolist() == [1.0 if q == "Case good." else 0.0 for q in batch.queries]
    assert batch.episode_stats["drift"].sum() == 0


@pytest.mark.parametrize("case,error", [
    ("unknown", "unknown tool 'divide'"), ("bad_arguments", "bad arguments for multiply"),
    ("raises", "RuntimeError: boom"), ("hangs", "no answer within environment_timeout (0.5 s)")])
def test_a_failing_call_is_an_error_message_and_the_episode_goes_on(case, error, tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, [case, "good"], environment_timeout=0.5)
    HANG_RELEASE.clear()
    try:
        batch = trainer.collect_rollout()
    finally:
        HANG_RELEASE.set()  # the calls left behind return, so their threads end
    for row in rows_of(batch, case):
        assert error in tool_part(trainer.tokenizer, batch, row)
        assert batch.completions[row] == "I could not." and batch.stop_reason[row] == StopReason.STOP_TOKEN
        assert batch.episode_stats["failures"][row] == 1 and batch.episode_stats["calls"][row] == 1
    metrics = episode_metrics(trainer.collectives, "cpu", batch)
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failure_frequency"] == 0.5


def test_a_malformed_call_is_counted_apart_and_answered_with_an_error(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, ["malformed", "good"])
    batch = trainer.collect_rollout()
    for row in rows_of(batch, "malformed"):
        assert "a tool call could not be read" in tool_part(trainer.tokenizer, batch, row)
        assert batch.episode_stats["malformed"][row] == 1 and batch.episode_stats["failures"][row] == 0
        assert batch.completions[row] == "I could not."
    metrics = episode_metrics(trainer.collectives, "cpu", batch)
    assert metrics["tools/malformed_frequency"] == 0.5 and metrics["tools/failure_frequency"] == 0.0


def test_calls_past_max_tool_calling_iterations_end_the_episode(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, ["loops"], max_tool_calling_iterations=2)
    batch = trainer.collect_rollout()
    assert batch.stop_reason.tolist() == [int(StopReason.TOOL_BUDGET)] * 2
    assert batch.episode_stats["calls"].tolist() == [2.0, 2.0] and batch.components["Calculator"] == [2.0, 2.0]
    for row in range(2):
        assert tool_part(trainer.tokenizer, batch, row).count("<tool_response>") == 2


def test_plain_function_tools_need_no_environment(tokenizer, tmp_path):
    trainer = make(tokenizer, tmp_path, ["good"], reward=lambda prompts, completions, **kw: [1.0] * len(completions),
                   tools_only=True)
    batch = trainer.collect_rollout()
    assert "<tool_response>\n42\n</tool_response>" in tool_part(trainer.tokenizer, batch, 0)
    assert batch.components == {} or "Calculator" not in batch.components


class Multiplier:
    """An environment with a tool and no get_reward."""

    def reset(self, **row) -> None:
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b


def test_an_environment_without_get_reward_adds_no_reward_component(tokenizer, tmp_path):
    # as TRL: only get_reward makes a component; before, a constant 0 was logged as rewards/Multiplier
    trainer = make(tokenizer, tmp_path, ["good"], reward=lambda prompts, completions, **kw: [1.0] * len(completions),
                   factory=Multiplier)
    batch = trainer.collect_rollout()
    assert "<tool_response>\n42\n</tool_response>" in tool_part(trainer.tokenizer, batch, 0)
    assert "Multiplier" not in batch.components and batch.scores.tolist() == [1.0, 1.0]
    with pytest.raises(UserError, match="reward: none is given and the environment has no get_reward method"):
        make(tokenizer, tmp_path, ["good"], factory=Multiplier)
    with pytest.raises(UserError, match="reward: none is given"):
        make(tokenizer, tmp_path, ["good"], tools_only=True)


def episode_shape(prompts, completions, environments, **columns):
    """A TRL-form reward function paying 1 when it is given the episode as TRL gives it: the conversation after
    the prompt as messages, the tool's result among them, and the episode's environment."""
    return [float([m["role"] for m in messages] == ["assistant", "tool", "assistant"]
                  and messages[1]["content"] == "42" and type(environment).__name__ == "Calculator")
            for messages, environment in zip(completions, environments)]


def test_trl_form_rewards_get_the_episode_as_messages_and_the_environments(tokenizer, tmp_path):
    from training_wizard.specs.reward_functions import RewardFunctionsSpec

    spec = RewardFunctionsSpec(reward_funcs=["tests.unit.test_tool_episodes:episode_shape"])
    batch = make(tokenizer, tmp_path, ["good"], reward=spec).collect_rollout()
    assert batch.components["episode_shape"] == [1.0, 1.0]


def test_a_template_that_cannot_render_tools_is_refused_with_the_key_to_set(tokenizer, tmp_path):
    with pytest.raises(UserError, match="cannot render tools.*chat_template"):
        make(tokenizer, tmp_path, ["good"], settings=EpisodeSettings())  # the tiny model's ChatML has no tools


LAST_MARKED = HERMES.replace("'\\n</tool_response><|im_end|>\\n'",
                             "(' (latest)' if loop.last else '') + '\\n</tool_response><|im_end|>\\n'")


@pytest.mark.parametrize("check", ["warn", "strict"])
def test_a_template_whose_rendering_changes_with_later_turns_is_caught(check, tokenizer, tmp_path):
    """This template marks the last tool result: spliced while it was last, rendered in full when it is not."""
    assert LAST_MARKED != HERMES
    settings = EpisodeSettings(chat_template=LAST_MARKED, tokenization_check=check)
    trainer = make(tokenizer, tmp_path, ["good", "answers"], settings=settings)
    if check == "strict":
        with pytest.raises(UserError, match="tokenization_check"):
            trainer.collect_rollout()
        return
    batch = trainer.collect_rollout()
    assert batch.episode_stats["drift"].tolist() == [1.0 if q == "Case good." else 0.0 for q in batch.queries]


def test_hermes_parsing():
    parsed = parse_hermes('a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> b '
                          '<tool_call>{"name": 3}</tool_call> <tool_call>{"name": "g"')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", {"x": 1})] and parsed.malformed == 2
    assert not parse_hermes("no calls here").attempted


TOOL_TABLES = """\
[environment]
factory = "tests.unit.test_tool_episodes:Calculator"
{template}
"""


def test_a_recipe_whose_template_cannot_render_tools_stops_with_one_line(tiny_model_dir, tmp_path, capsys):
    from tests.helpers import write_episode_recipe
    from training_wizard.cli import main

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Case good."], TOOL_TABLES.format(template=""))
    assert main([str(recipe), "--dry-run"]) == 2
    error = capsys.readouterr().err.strip()
    assert "cannot render tools" in error and "chat_template" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_recipe_with_tools_and_no_reward_table_trains_on_the_environments_reward(tiny_model_dir, tmp_path):
    """The random model writes no calls: every episode is its first reply, scored 0 by get_reward; the run's
    metrics carry the tool metrics and the environment's component."""
    from tests.helpers import write_episode_recipe
    from training_wizard.cli import main
    from training_wizard.tracking.metrics import read_metrics

    recipe = write_episode_recipe(tmp_path, tiny_model_dir, ["Case good.", "Case answers."],
                                  TOOL_TABLES.format(template='chat_template = "hermes"'),
                                  "response_length = 24\nmax_tool_calling_iterations = 2")
    assert main([str(recipe)]) == 0
    first = read_metrics(tmp_path / "out")[0]
    assert first["rewards/Calculator"] == 0.0 and first["tools/call_frequency"] == 0.0
    assert first["episodes/stopped_by_stop_token"] + first["episodes/stopped_by_length"] == pytest.approx(1.0)


def test_sigterm_while_a_tool_hangs_stops_the_run_at_once_and_keeps_the_iterations_start(tokenizer, tmp_path):
    # Before, the run waited out environment_timeout for the tool (here 300 s), then played the episode on.
    from training_wizard.checkpoint import find_checkpoint, read_manifest
    from training_wizard.signals import TrainingInterrupted

    stalling, release, returned = threading.Event(), threading.Event(), []

    class Stalls(Calculator):
        def stall(self, x: int) -> int:
            """Wait until the test ends, or 120 s.

            Args:
                x: Anything.
            """
            stalling.set()
            returned.append(release.wait(120))
            return x

    def stop_once_a_call_stalls():  # one signal only: a second SIGTERM would act as before (kill the process)
        if stalling.wait(120):
            os.kill(os.getpid(), signal.SIGTERM)

    SCRIPTS["stalls"] = [call("stall", x=1), "I could not."]
    trainer = make(tokenizer, tmp_path, ["stalls"], factory=Stalls, environment_timeout=300)
    threading.Thread(target=stop_once_a_call_stalls, daemon=True).start()
    try:
        with pytest.raises(TrainingInterrupted) as stopped:
            trainer.train()
        still_stalling = not returned  # a run that waited for the calls would see them give up first (120 s)
    finally:
        release.set()
        del SCRIPTS["stalls"]
    assert still_stalling and stopped.value.exit_code == 143
    assert read_manifest(find_checkpoint(tmp_path, "latest"))["step"] == 0  # the iteration's start, nothing trained
    assert not (tmp_path / "metrics.jsonl").exists() or (tmp_path / "metrics.jsonl").read_text() == ""


def test_lora_episodes_train_the_adapter_only_with_the_disabled_adapter_as_reference(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    from training_wizard.tracking.metrics import read_metrics

    policy = get_peft_model(build_causal_lm(copy.deepcopy(tokenizer), seed=1),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    before = {name: value.detach().clone() for name, value in policy.named_parameters()}
    spread = torch.Generator().manual_seed(0)  # rewards that differ inside each group, so advantages are not zero

    def noisy(prompts, completions, **columns):
        return torch.rand(len(completions), generator=spread).tolist()

    trainer = make(tokenizer, tmp_path, ["good", "answers"], reward=noisy, policy=policy, beta=0.1,
                   logprobs_from_sampling=False,  # the scripted replies carry no real sampling logprobs
                   learning_rate=1e-2, total_episodes=16)
    assert trainer.ref_policy is None and trainer.uses_adapter_as_reference
    trainer.train()
    moved = {name for name, value in policy.named_parameters() if not torch.equal(value, before[name])}
    assert moved and all("lora_" in name for name in moved)  # the base weights are the reference: untouched
    metrics = read_metrics(tmp_path)
    assert metrics[0]["objective/kl"] == 0.0 and metrics[-1]["objective/kl"] > 0.0
    assert all(m["tools/call_frequency"] == 0.5 for m in metrics)  # "good" calls once, "answers" never
