"""Reward functions in TRL's form: loading, keyword calls, weights and None, async concurrency, errors, and the
collector passing completion ids and the iteration."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest
import torch

from training_wizard.rollout.prompts import RolloutRequest
from training_wizard.spec import Spec
from training_wizard.specs.reward import MultiRewardSpec, RewardSpec
from training_wizard.specs.reward_functions import RewardFunctionsSpec

MODULE = "tw_trl_rewards"


class Holder(Spec):
    """A stand-in recipe with one [reward] table."""

    reward: RewardSpec


def reward(**keys) -> RewardSpec:
    return Holder.model_validate({"reward": keys}).reward


calls: list[dict] = []


def recorder(prompts, completions, completion_ids, trainer_state, **columns):
    calls.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                      trainer_state=trainer_state, columns=columns))
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def only_even(prompts, completions, **kwargs):
    return [10.0 if i % 2 == 0 else None for i in range(len(completions))]


def never(prompts, completions, **kwargs):
    return [None] * len(completions)


def raises_on_b(prompts, completions, **kwargs):
    if "b" in completions:
        raise ValueError("no b please")
    return [1.0] * len(completions)


def too_short(prompts, completions, **kwargs):
    return [1.0]


def a_word(prompts, completions, **kwargs):
    return ["high"] * len(completions)


async def slow_one(prompts, completions, **kwargs):
    await asyncio.sleep(0.3)
    return [1.0] * len(completions)


MEETING: dict[str, asyncio.Event] = {}  # each rendezvous function's "I am running" event, made on the reward loop
MISSED: list[str] = []  # the rendezvous functions that ran alone


async def meet(me: str, other: str) -> None:
    """Say this function runs, then wait for the other one to say so: awaited one after the other, the first
    would wait out its 60 s and be recorded in MISSED, so an empty MISSED proves both ran at the same time. Each
    call's event lasts only while it runs, so a later call (a retry alone) never meets a stale one."""
    if MISSED:  # one miss already proves they did not meet: fail at once, not after another 60 s
        raise RuntimeError(f"{me}: an earlier call ran alone")
    MEETING.setdefault(me, asyncio.Event()).set()
    try:
        await asyncio.wait_for(MEETING.setdefault(other, asyncio.Event()).wait(), 60)
    except asyncio.TimeoutError:
        MISSED.append(me)
        raise RuntimeError(f"{me} ran alone: {other} never ran while it waited") from None
    finally:
        MEETING[me].clear()


async def meets_two(prompts, completions, **kwargs):
    await meet("meets_two", "meets_one")
    return [1.0] * len(completions)


async def meets_one(prompts, completions, **kwargs):
    await meet("meets_one", "meets_two")
    return [2.0] * len(completions)


LOOPS_SEEN: list = []


async def keeps_a_client(prompts, completions, **kwargs):
    """Like a reward holding an httpx.AsyncClient made at its first call: bound to that call's event loop."""
    loop = asyncio.get_running_loop()
    if LOOPS_SEEN and (LOOPS_SEEN[0] is not loop or LOOPS_SEEN[0].is_closed()):
        raise RuntimeError("Event loop is closed")  # what the client raises on a later loop
    LOOPS_SEEN.append(loop)
    return [1.0] * len(completions)


async def async_raises_on_b(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return raises_on_b(prompts, completions)


@pytest.fixture(autouse=True)
def module(monkeypatch):
    """This test file as an importable module under a fixed name, so recipes can name its functions."""
    monkeypatch.setitem(sys.modules, MODULE, sys.modules[__name__])
    calls.clear()


def funcs(*names, **keys) -> RewardSpec:
    return reward(reward_funcs=[f"{MODULE}:{name}" for name in names], **keys)


# --------------------------------------------------------------------------------------------------------------
# Loading


def test_reward_funcs_without_spec_class_is_this_spec():
    spec = funcs("recorder", "only_even", reward_weights=[1.0, 0.5])
    assert isinstance(spec, RewardFunctionsSpec) and spec.weights() == [1.0, 0.5]
    assert funcs("recorder").weights() == [1.0]
    # a table with neither keeps the old error
    with pytest.raises(Exception, match="spec_class is required"):
        reward()


def test_a_reward_table_with_pretrained_name_alone_is_a_reward_model():
    # as TRL's reward_model_path names one; before, `pretrained_name` without spec_class was an unknown key
    from training_wizard.specs.reward import ModelRewardSpec

    spec = reward(pretrained_name="runs/rm/model", batch_size=4)
    assert type(spec) is ModelRewardSpec and spec.pretrained_name == "runs/rm/model" and spec.batch_size == 4


@pytest.mark.parametrize("keys, expected", [
    ({"reward_funcs": [f"{MODULE}:recorder", f"{MODULE}:nope"]}, "reward_funcs[1]: 'tw_trl_rewards:nope' could not"),
    ({"reward_funcs": ["no_colon"]},
     "reward_funcs[0]: 'no_colon' is neither 'package.module:function' nor a reward model"),
    ({"reward_funcs": [f"{MODULE}:recorder"], "reward_weights": [1.0, 2.0]},
     "reward_weights: 2 weights for 1 reward_funcs"),
    ({"reward_funcs": []}, "reward_funcs"),
])
def test_loading_errors_name_the_key(keys, expected):
    with pytest.raises(Exception, match=expected.replace("[", r"\[").replace("]", r"\]")):
        reward(**keys)


# --------------------------------------------------------------------------------------------------------------
# Calls, weights and None


def test_called_by_keyword_with_columns_ids_and_state():
    spec = funcs("recorder")
    total, components = spec.score(["q1", "q2"], ["abc", "de"],
                                   {"answer": ["1", "2"], "completion_ids": [[5, 6, 2], [7]],
                                    "dataset_prompts": ["Q1", "Q2"], "completion_has_eos": [True, False]}, step=7)
    assert total == [3.0, 2.0] and components == {"recorder": [3.0, 2.0]}
    (call,) = calls
    assert call["prompts"] == ["Q1", "Q2"]  # the dataset's prompt, not the query text
    assert call["completions"] == ["abc", "de"] and call["completion_ids"] == [[5, 6, 2], [7]]
    assert call["trainer_state"].global_step == 6  # step 7's rollout (numbered as checkpoints): 6 iterations before it
    columns = {key: value for key, value in call["columns"].items() if key not in ("log_extra", "log_metric")}
    assert columns == {"answer": ["1", "2"], "completion_has_eos": [True, False]}
    assert callable(call["columns"]["log_extra"]) and callable(call["columns"]["log_metric"])  # TRL 1.16 passes both


def test_conversational_rows_get_messages():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    funcs("recorder").score(["Hi", "plain"], ["hello", "x"], {"dataset_prompts": [chat, "plain"]})
    (call,) = calls
    assert call["prompts"] == [chat, "plain"]
    assert call["completions"] == [[{"role": "assistant", "content": "hello"}], "x"]


def test_without_trainer_columns_the_query_stands_in_and_ids_are_none():
    funcs("recorder").score(["q"], ["abc"], {})
    assert calls[0]["prompts"] == ["q"] and calls[0]["completion_ids"] is None


def test_weighted_sum_leaves_out_none():
    # row 0: 1*3 + 0.5*10 = 8; row 1: only recorder scored it: 1*2 = 2; row 2: 1*1 + 0.5*10 = 6
    total, components = funcs("recorder", "only_even", reward_weights=[1.0, 0.5]).score(
        ["p"] * 3, ["abc", "de", "f"], {})
    assert total == [8.0, 2.0, 6.0]
    assert components["recorder"] == [3.0, 2.0, 1.0]
    assert components["only_even"][0] == 10.0 and math.isnan(components["only_even"][1])


def test_a_row_no_function_scored_counts_zero_with_one_warning(capsys):
    total, _ = funcs("only_even", "never").score(["p"] * 2, ["a", "b"], {}, step=4)
    assert total[1] == 0.0  # TRL's nansum: the run goes on
    assert "at step 4: every reward function returned None for 1 of 2 completions" in capsys.readouterr().err


def test_inside_a_multi_reward_the_components_nest():
    spec = MultiRewardSpec(components={"trl": {"spec": funcs("recorder", "only_even"), "weight": 2.0}})
    total, logged = spec.score(["p"] * 2, ["abc", "de"], {})
    assert total == [2 * 13.0, 2 * 2.0]
    assert set(logged) == {"trl", "trl.recorder", "trl.only_even"}


def test_repeated_function_names_get_suffixes():
    _, components = funcs("recorder", "recorder").score(["p"], ["ab"], {})
    assert list(components) == ["recorder", "recorder_2"]


# --------------------------------------------------------------------------------------------------------------
# async


def test_async_functions_run_concurrently():
    MEETING.clear()
    MISSED.clear()
    spec = funcs("meets_two", "meets_one", "recorder")
    total, components = spec.score(["p"] * 2, ["ab", "c"], {})
    assert MISSED == []  # (a failed call is retried alone, so the totals alone could hide a miss)
    assert total == [1 + 2 + 2.0, 1 + 2 + 1.0]
    assert components["meets_two"] == [1.0, 1.0] and components["meets_one"] == [2.0, 2.0]


def test_async_functions_keep_one_event_loop_across_steps():
    """A client made at the first call still works at the next steps, as in TRL (a loop per call closed it)."""
    LOOPS_SEEN.clear()
    spec = funcs("keeps_a_client")
    for step in range(3):
        assert spec.score(["p"], ["a"], {}, step=step)[0] == [1.0]
    assert len(LOOPS_SEEN) == 3


def test_async_functions_work_inside_a_running_loop():
    async def caller():
        return funcs("slow_one").score(["p"], ["a"], {})[0]

    assert asyncio.run(caller()) == [1.0]


# --------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("name, expected", [
    ("raises_on_b", "reward function 'raises_on_b' raised at step 3, row 1: ValueError: no b please"),
    ("async_raises_on_b", "reward function 'async_raises_on_b' raised at step 3, row 1: ValueError: no b please"),
    ("too_short", "reward function 'too_short' at step 3: returned 1 values for 3 completions"),
    ("a_word", "reward function 'a_word' at step 3, row 0: expected a float, got 'high'"),
])
def test_errors_are_one_line_naming_function_step_and_row(name, expected):
    with pytest.raises(Exception) as caught:
        funcs("recorder", name).score(["p"] * 3, ["a", "b", "c"], {}, step=3)
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message


# --------------------------------------------------------------------------------------------------------------
# Through the trainer


seen: list[dict] = []


def keep_ids(prompts, completions, completion_ids, trainer_state, **columns):
    seen.append({"ids": completion_ids, "step": trainer_state.global_step, "prompts": prompts})
    return [None if i == 0 else float(len(ids)) for i, ids in enumerate(completion_ids)]


def count_x(prompts, completions, **columns):
    return [float(c.count("x")) for c in completions]


def test_trainer_passes_sampled_ids_and_iteration(tmp_path):
    from training_wizard import RLOOConfig, RLOOTrainer
    from training_wizard.testing import build_causal_lm, build_tokenizer
    from training_wizard.tracking.metrics import read_metrics

    seen.clear()
    tokenizer = build_tokenizer()
    config = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=8, response_length=5,
                        num_sample_generations=0, rloo_k=2)
    spec = funcs("keep_ids", "count_x")
    trainer = RLOOTrainer(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer), reward_model=spec,
                          train_dataset=[{"prompt": f"Say {i}."} for i in range(4)])
    trainer.train()
    assert [s["step"] for s in seen] == [0, 1]  # two iterations, counted from 0 like TRL's global_step
    assert seen[0]["prompts"][0].startswith("Say ")
    rollout = trainer.collector.collect(RolloutRequest(trainer.train_prompts, [0, 1], [11, 12], [0, 1], step=5,
                                                      policy_version=0))
    assert seen[-1]["step"] == 4  # step 5 as checkpoints count: 4 iterations completed before it
    sampled = [ids[keep].tolist() for ids, keep in zip(rollout.completion_ids, rollout.completion_mask)]
    assert seen[-1]["ids"] == sampled and all(len(ids) > 0 for ids in sampled)
    assert math.isnan(rollout.components["keep_ids"][0]) and rollout.components["keep_ids"][1] == len(sampled[1])
    assert rollout.scores.tolist() == [rollout.components["count_x"][0],
                                       len(sampled[1]) + rollout.components["count_x"][1]]
    # the logged component is the mean over the completions the function scored (row 0 of each batch is None)
    first = read_metrics(tmp_path)[0]
    lengths = [len(ids) for ids in seen[0]["ids"][1:]]
    assert first["rewards/keep_ids"] == pytest.approx(sum(lengths) / len(lengths))
    assert math.isfinite(first["objective/scores"])
    assert torch.isfinite(rollout.scores).all()


def id_checksum(prompts, completions, completion_ids, **columns):
    seen.append({"ids": completion_ids})
    return [None if i == 0 else float(sum(ids) % 11) for i, ids in enumerate(completion_ids)]


def test_grpo_logs_each_functions_mean_and_std_over_the_completions_it_scored(tmp_path):
    import statistics

    from training_wizard import GRPOConfig, GRPOTrainer
    from training_wizard.testing import build_causal_lm, build_tokenizer
    from training_wizard.tracking.metrics import read_metrics

    seen.clear()
    tokenizer = build_tokenizer()
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=4, response_length=5,
                        num_sample_generations=0, num_generations=2, logprobs_from_sampling=False)
    trainer = GRPOTrainer(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer),
                          reward_model=funcs("id_checksum", "count_x"),
                          train_dataset=[{"prompt": "Say 1."}, {"prompt": "Say 2."}])
    trainer.train()
    logged = read_metrics(tmp_path)[0]
    values = [float(sum(ids) % 11) for ids in seen[0]["ids"][1:]]  # row 0 returned None: not scored
    assert len(set(values)) > 1  # unequal values: n - 1 and n give different deviations
    assert logged["rewards/id_checksum/mean"] == pytest.approx(statistics.mean(values))
    assert logged["rewards/id_checksum/std"] == pytest.approx(statistics.stdev(values))  # n - 1, as TRL's nanstd
