"""Reward functions in TRL's form as TRL 1.16 calls them: a completion every function left unscored counts 0
with a warning (TRL's nansum), and `log_extra` / `log_metric` reach the trainer through `take_logs`."""

from __future__ import annotations

import math

from training_wizard.specs.reward import MultiRewardSpec
from training_wizard.specs.reward_objects import RewardObjectsSpec


def only_first(prompts, completions, **kwargs):
    return [1.0] + [None] * (len(completions) - 1)


def never(prompts, completions, **kwargs):
    return [None] * len(completions)


def logging_reward(prompts, completions, log_extra, log_metric, **kwargs):
    log_extra("length", [len(text) for text in completions])
    log_metric("custom/mean_length", sum(map(len, completions)) / len(completions))
    log_metric("custom/mean_length", 1.0)
    return [float(len(text)) for text in completions]


def test_rows_no_function_scored_count_zero_with_one_warning_line(capsys):
    spec = RewardObjectsSpec(reward_funcs=[only_first, never], reward_weights=[2.0, 1.0])
    totals, components = spec.score(["p"] * 4, ["a", "b", "c", "d"], {}, step=3)
    assert totals == [2.0, 0.0, 0.0, 0.0]
    assert math.isnan(components["never"][0]) and components["only_first"][0] == 1.0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["warning: reward RewardObjectsSpec at step 3: every reward function returned None for 3 of 4 "
                     "completions; GRPO and RLOO give them advantage 0 outside their group's baseline, as TRL 1.16 "
                     "does, PPO counts them 0"]
    assert spec.take_logs().metrics == {"frac_reward_all_none": [0.75]}


def test_a_batch_every_row_scored_warns_nothing(capsys):
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec.score(["p"] * 2, ["ab", "abcd"], {})
    assert capsys.readouterr().err == ""


def test_log_extra_and_log_metric_are_handed_over_once():
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec.score(["p"] * 2, ["ab", "abcd"], {})
    logs = spec.take_logs()
    assert logs.columns == {"length": [2, 4]}
    assert logs.metrics == {"custom/mean_length": [3.0, 1.0], "frac_reward_all_none": [0.0]}
    assert spec.take_logs().columns == {} and spec.take_logs().metrics == {}


def test_each_batch_starts_empty():
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec.score(["p"], ["abc"], {})
    spec.score(["p"], ["a"], {})
    assert spec.take_logs().columns == {"length": [1]}


def test_a_multi_reward_hands_over_its_components_logs():
    inner = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec = MultiRewardSpec(components={"trl": {"spec": inner}})
    spec.score(["p"] * 2, ["ab", "abcd"], {})
    assert spec.take_logs().columns == {"length": [2, 4]}
