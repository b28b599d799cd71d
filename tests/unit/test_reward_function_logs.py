"""Reward functions in TRL's form as TRL 1.16 calls them: a completion every function left unscored counts 0
with a warning (TRL's nansum), and `log_extra` / `log_metric` reach the trainer through the store each
`score_logging` call is given, so two threads scoring with one spec keep their logs apart."""

from __future__ import annotations

import math
import threading
import types

from training_wizard.collectives import Collectives
from training_wizard.rollout.collector import RolloutCollector
from training_wizard.specs.reward import FunctionLogs, MultiRewardSpec
from training_wizard.specs.reward_functions import RewardObjectsSpec


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
    logs = FunctionLogs()
    totals, components = spec.score_logging(["p"] * 4, ["a", "b", "c", "d"], {}, logs, step=3)
    assert totals == [2.0, 0.0, 0.0, 0.0]
    assert math.isnan(components["never"][0]) and components["only_first"][0] == 1.0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["warning: reward RewardObjectsSpec at step 3: every reward function returned None for 3 of 4 "
                     "completions; GRPO and RLOO give them advantage 0 outside their group's baseline, as TRL 1.16 "
                     "does, PPO counts them 0"]
    assert logs.metrics == {"frac_reward_all_none": [0.75]}


def test_a_batch_every_row_scored_warns_nothing(capsys):
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec.score(["p"] * 2, ["ab", "abcd"], {})
    assert capsys.readouterr().err == ""


def test_log_extra_and_log_metric_go_to_the_calls_own_store():
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    logs = FunctionLogs()
    spec.score_logging(["p"] * 2, ["ab", "abcd"], {}, logs)
    assert logs.columns == {"length": [2, 4]}
    assert logs.metrics == {"custom/mean_length": [3.0, 1.0], "frac_reward_all_none": [0.0]}


def test_each_batch_starts_empty():
    spec = RewardObjectsSpec(reward_funcs=[logging_reward])
    spec.score(["p"], ["abc"], {})  # a caller that keeps no logs (evaluation) leaves nothing behind
    logs = FunctionLogs()
    spec.score_logging(["p"], ["a"], {}, logs)
    assert logs.columns == {"length": [1]}


def test_a_multi_reward_hands_over_its_components_logs():
    inner = RewardObjectsSpec(reward_funcs=[logging_reward])
    nested = MultiRewardSpec(components={"trl": {"spec": RewardObjectsSpec(reward_funcs=[logging_reward])}})
    spec = MultiRewardSpec(components={"trl": {"spec": inner}, "nested": {"spec": nested}})
    logs = FunctionLogs()
    spec.score_logging(["p"] * 2, ["ab", "abcd"], {}, logs)
    assert logs.columns == {"length": [2, 4, 2, 4]}


def test_two_threads_scoring_with_one_spec_keep_their_logs_apart():
    """The async producer scores a batch of 8 while the training thread scores a probe of 4 with the same spec:
    each batch gets its own column, and neither is refused for the other's length."""
    started, release = threading.Event(), threading.Event()

    def held_length(completions, log_extra, **kwargs):
        log_extra("length", [len(text) for text in completions])
        if len(completions) == 8:  # the producer's batch waits until the probe has been scored
            started.set()
            release.wait(10)
        return [1.0] * len(completions)

    collector = types.SimpleNamespace(reward=RewardObjectsSpec(reward_funcs=[held_length]),
                                      settings=types.SimpleNamespace(reward_timeout=float("inf")),
                                      collectives=Collectives(types.SimpleNamespace(
                                          num_processes=1, process_index=0, is_main_process=True, device="cpu")))
    scored: dict[str, object] = {}

    def produce() -> None:
        scored["batch"] = RolloutCollector._score_with_spec(collector, ["q"] * 8, ["ab"] * 8, {}, 1)

    producer = threading.Thread(target=produce)
    producer.start()
    assert started.wait(10)
    probe = RolloutCollector._score_with_spec(collector, ["q"] * 4, ["abc"] * 4, {}, 1)
    release.set()
    producer.join(10)
    assert probe[2].columns == {"length": [3] * 4}
    assert scored["batch"][2].columns == {"length": [2] * 8}
