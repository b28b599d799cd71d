"""reasoning-gym as prompts, a reward and a retry environment (training_wizard/envs/reasoning_gym.py): the items
are the library's own for a seed, the parts never share a question, the reward is the task's own scorer, and the
retry environment gives the scorer's verdict until its attempt limit."""

from __future__ import annotations

import json
import sys

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

from reasoning_gym.utils import extract_answer  # noqa: E402

from tests.helpers import GRPO_RECIPE_HEAD  # noqa: E402
from training_wizard.envs.reasoning_gym import (  # noqa: E402
    ReasoningGymDataSpec, ReasoningGymRewardSpec, RetryWithFeedback, reasoning_gym_reward,
)
from training_wizard.errors import UserError  # noqa: E402
from training_wizard.tracking.metrics import read_metrics  # noqa: E402

SPEC = dict(task="leg_counting", config={"max_animals": 3}, size=40, seed=7, hold_out=10, system_prompt="direct")


def test_the_same_seed_gives_the_library_s_items_and_the_parts_share_no_question():
    train = ReasoningGymDataSpec(**SPEC).load()
    again = ReasoningGymDataSpec(**SPEC).load()
    held_out = ReasoningGymDataSpec(**SPEC, part="held_out").load()
    assert train.to_list() == again.to_list()
    assert (len(train), len(held_out)) == (30, 10)
    assert not set(train["question"]) & set(held_out["question"])
    library = reasoning_gym.create_dataset("leg_counting", seed=7, size=800, max_animals=3)
    for row in train.to_list()[:5] + held_out.to_list()[:5]:
        item = library[json.loads(row["reasoning_gym"])["index"]]
        assert (row["question"], row["answer"]) == (item["question"], str(item["answer"]))
        assert row["prompt"] == [{"role": "system", "content": reasoning_gym.utils.SYSTEM_PROMPTS["direct"]},
                                 {"role": "user", "content": item["question"]}]
    other_seed = ReasoningGymDataSpec(**{**SPEC, "seed": 8}).load()
    assert other_seed["question"] != train["question"]


def test_a_task_with_few_distinct_questions_is_refused_with_the_count_found():
    with pytest.raises(UserError, match=r"dataset.size: task 'leg_counting' gave \d+ distinct questions"):
        ReasoningGymDataSpec(task="leg_counting", config={"min_animals": 1, "max_animals": 1,
                                                         "max_instances": 1}, size=500).load()


def test_a_wrong_task_or_config_fails_when_the_recipe_loads():
    with pytest.raises(ValueError, match="not a reasoning-gym task.*leg_counting"):
        ReasoningGymDataSpec(task="legcounting", size=4)
    with pytest.raises(ValueError, match="config of task 'leg_counting'"):
        ReasoningGymDataSpec(task="leg_counting", config={"no_such_field": 1}, size=4)
    with pytest.raises(ValueError, match="'seed' is a key of its own"):
        ReasoningGymDataSpec(task="leg_counting", config={"seed": 1}, size=4)


def test_the_reward_is_the_task_s_own_score_of_the_extracted_answer():
    rows = ReasoningGymDataSpec(**SPEC).load().to_list()[:4]
    right = rows[0]["answer"]
    replies = [f"I count. <answer>{right}</answer>", f"<answer>{right} legs</answer>", "no tags: " + right,
               "<answer>1</answer> then <answer>2</answer>"]
    keys = [row["reasoning_gym"] for row in rows]
    library = reasoning_gym.create_dataset("leg_counting", seed=7, size=800, max_animals=3)
    expected = [library.score_answer(extract_answer(reply), library[json.loads(key)["index"]])
                for reply, key in zip(replies, keys)]
    ours = ReasoningGymRewardSpec().compute_reward([""] * 4, replies, reasoning_gym=keys)
    assert ours == expected
    assert (ours[0], ours[2]) == (1.0, 0.0)  # right; no tag is no answer, even with the right number in the text
    # fallback "last_number": a reply without the tag is scored on its last number; the tag still wins
    lenient = ReasoningGymRewardSpec(fallback="last_number").compute_reward(
        [""] * 3, [f"There are {right} legs.", f"<answer>1</answer> or {right}", "none"], reasoning_gym=keys[:3])
    assert lenient == [1.0, 0.0, 0.0]
    messages = [[{"role": "assistant", "content": reply}] for reply in replies]
    assert reasoning_gym_reward(messages, reasoning_gym=keys) == expected  # the TRL-form function


def test_the_retry_environment_gives_the_verdict_and_stops_at_its_limit():
    row = ReasoningGymDataSpec(**SPEC).load()[0]
    environment = RetryWithFeedback(max_attempts=3, discount=0.5)
    assert environment.reset(**row) is None
    observation, reward, done = environment.step("I think it is many.")
    assert "No answer was found in your reply (expected <answer>...</answer>)" in observation and (reward, done) == (0.0, False)
    observation, reward, done = environment.step("<answer>1</answer>")
    assert "Your answer '1' scored 0.00 of 1" in observation and (reward, done) == (0.0, False)
    assert environment.step("<answer>2</answer>") == (None, 0.0, True)  # the third attempt is the last

    environment.reset(**row)
    environment.step("<answer>1</answer>")
    observation, reward, done = environment.step(f"<answer>{row['answer']}</answer>")
    assert (observation, reward, done) == (None, 0.5, True)  # right at the second attempt: discount ** 1

    # partial credit (letter_counting grades an answer holding the right count in part), then a wrong answer:
    # the step rewards sum to the last answer's discounted score
    row = ReasoningGymDataSpec(task="letter_counting", size=1, seed=1).load()[0]
    environment = RetryWithFeedback(max_attempts=2, discount=1.0)
    environment.reset(**row)
    first = environment.step(f"<answer>{row['answer']} x</answer>")
    second = environment.step("<answer>1</answer>")
    assert first[1] > 0.0 and first[2] is False and second[2] is True
    assert first[1] + second[1] == pytest.approx(0.0)


def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch):
    from training_wizard.envs import reasoning_gym as adapter

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(UserError, match=r"reasoning-gym is not installed: pip install -e '\.\[envs\]'"):
        adapter.reasoning_gym_module()


RECIPE = GRPO_RECIPE_HEAD.replace('data_files = "{data}"', """\
spec_class = "training_wizard.envs.reasoning_gym.ReasoningGymDataSpec"
task = "leg_counting"
config = {{ min_animals = 2, max_animals = 2 }}
size = 4
system_prompt = ""
""") + """
[environment]
factory = "training_wizard.envs.reasoning_gym:RetryWithFeedback"
protocol = "text"
factory_kwargs = {{ max_attempts = 2 }}

[training]
num_generations = 2
per_device_train_batch_size = 4
total_episodes = 8
num_sample_generations = 0
response_length = 160
max_turns = 3
stop_token_ids = {stops}
"""


def test_a_recipe_trains_on_a_task_with_the_retry_environment(tiny_model_dir, tmp_path):
    """The tiny model never answers right: every episode is two attempts with the verdict between them (the
    environment's limit, below the run's max_turns), each reward 0."""
    from training_wizard.cli import main

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(out=tmp_path / "out", model=tiny_model_dir, stops=list(range(40, 300, 2))))
    assert main([str(recipe)]) == 0
    records = read_metrics(tmp_path / "out")
    assert len(records) == 2
    for record in records:
        assert record["rewards/RetryWithFeedback"] == 0.0
        assert record["episodes/environment_tokens_mean"] > 20  # the verdict, spliced in
        assert (record["episodes/replies_mean"], record["episodes/stopped_by_environment"]) == (2.0, 1.0)


def test_a_recipe_naming_an_unknown_task_is_one_line(tiny_model_dir, tmp_path, capsys):
    from training_wizard.cli import main

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.replace('"leg_counting"', '"no_such_task"').format(
        out=tmp_path / "out", model=tiny_model_dir, stops=[40]))
    assert main([str(recipe), "--dry-run"]) == 2
    error = capsys.readouterr().err.strip()
    assert "dataset" in error and "no_such_task" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "out").exists()
