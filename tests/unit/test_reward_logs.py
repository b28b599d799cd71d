"""What reward functions log through TRL 1.16's `log_metric` and `log_extra` reaches metrics.jsonl (the mean of
every call on every process, under the name given) and samples.jsonl (a column beside query and response), in the
synchronous and the sampled-ahead loop; `num_completions_to_print` sets the rows of the sample table."""

from __future__ import annotations

import json
import types

import pytest
import torch

from tests.helpers import make_grpo_trainer, make_rloo_trainer
from training_wizard.collectives import Collectives
from training_wizard.errors import UserError
from training_wizard.specs.reward import CallableRewardSpec
from training_wizard.specs.reward_functions import RewardObjectsSpec
from training_wizard.tracking.metrics import read_metrics
from training_wizard.tracking.samples import SampleTable
from training_wizard.trainers.loop.iteration_metrics import reward_log_metrics


def logging_length(completions, log_extra, log_metric, **kwargs):
    """The completion's length as the reward; logs each length as a column and two calls of one metric."""
    log_extra("length", [len(text) for text in completions])
    log_metric("custom/calls", 1.0)
    log_metric("custom/calls", 3.0)
    return [float(len(text)) for text in completions]


def one_value_column(completions, log_extra, **kwargs):
    log_extra("length", [len(completions[0])])
    return [0.0] * len(completions)


def samples(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("make, options", [(make_grpo_trainer, {}), (make_rloo_trainer, {"async_rollouts": True})],
                         ids=["grpo", "rloo-async"])
def test_log_metric_and_log_extra_reach_metrics_and_samples(make, options, tokenizer, tmp_path):
    reward = RewardObjectsSpec(reward_funcs=[logging_length])
    make(tokenizer, tmp_path, reward=reward, num_sample_generations=2, **options).train()
    records = read_metrics(tmp_path)
    assert len(records) == 2 and all(record["custom/calls"] == 2.0 for record in records)
    rows = [row for row in samples(tmp_path) if not row.get("probe")]
    assert len(rows) == 8  # two sample events of 4 rows
    assert all(row["length"] == len(row["response"]) and "rewards/length" not in row for row in rows)
    probes = [row for row in samples(tmp_path) if row.get("probe")]
    assert probes and all(row["length"] == len(row["response"]) for row in probes)


@pytest.mark.parametrize("printed", [None, 2])
def test_num_completions_to_print_sets_the_rows_of_the_sample_table(printed, tokenizer, tmp_path):
    make_grpo_trainer(tokenizer, tmp_path, num_sample_generations=2, num_completions_to_print=printed).train()
    rows = [row for row in samples(tmp_path) if not row.get("probe")]
    assert sorted({row["step"] for row in rows}) == [1, 2]
    assert all(sum(row["step"] == step for row in rows) == (printed or 4) for step in (1, 2))


def test_a_log_extra_column_without_one_value_per_completion_is_one_line(tokenizer, tmp_path):
    trainer = make_rloo_trainer(tokenizer, tmp_path, reward=RewardObjectsSpec(reward_funcs=[one_value_column]))
    with pytest.raises(UserError) as raised:
        trainer.train()
    assert str(raised.value) == ("reward RewardObjectsSpec at step 1: log_extra('length', values) was given 1 values "
                                 "for 8 completions; give one value per completion")


class RecordedProcess(Collectives):
    """Collectives of one process of two, run one after the other: the first run records what its process sends,
    the second receives it as the other process's part. `width`: the agreed payload width. Its `gather_json`
    is the real one, over these two collectives."""

    single = False

    def __init__(self, width: int, other: torch.Tensor | None = None):
        self.width, self.other, self.sent, self.calls = width, other, None, []

    def max_int(self, value: int) -> int:
        self.calls.append("max_int")
        assert value <= self.width
        return self.width

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append("gather")
        self.sent = tensor
        return torch.cat([tensor, self.other if self.other is not None else tensor])


def test_metrics_average_every_call_of_every_process_in_two_collectives():
    first = types.SimpleNamespace(logged_metrics={"a": [1.0, 2.0], "only_first": [5.0], "b": [0.0]})
    second = types.SimpleNamespace(logged_metrics={"a": [6.0], "b": [1.0], "kl": [9.0]})
    sender = RecordedProcess(512)
    reward_log_metrics(sender, second, taken={})
    receiver = RecordedProcess(512, other=sender.sent)
    metrics = reward_log_metrics(receiver, first, taken={"kl": 0.1})
    assert metrics == {"a": 3.0, "b": 0.5, "only_first": 5.0}  # the trainer's own "kl" keeps its value
    assert list(metrics) == ["a", "b", "only_first"]
    assert receiver.calls == ["max_int", "gather"]


def test_a_process_without_metrics_still_takes_part():
    sender = RecordedProcess(64)
    reward_log_metrics(sender, types.SimpleNamespace(logged_metrics={"a": [4.0]}), taken={})
    receiver = RecordedProcess(64, other=sender.sent)
    assert reward_log_metrics(receiver, types.SimpleNamespace(logged_metrics={}), taken={}) == {"a": 4.0}
    assert receiver.calls == ["max_int", "gather"]


def test_a_logged_column_beside_the_record_keeps_the_records_own_keys(tmp_path):
    SampleTable(tmp_path).record(3, 24, ["q"], ["r"], [0.5], {"fmt": [1.0]},
                                 columns={"score": [9], "rewards/fmt": [7], "verdict": ["ok"], "gap": [float("nan")]})
    (row,) = samples(tmp_path)
    assert row == {"step": 3, "episode": 24, "query": "q", "response": "r", "score": 0.5, "rewards/fmt": 1.0,
                   "verdict": "ok", "gap": None}


def test_a_reward_that_cannot_log_costs_no_collective():
    logs = types.SimpleNamespace(logged_metrics={})
    for reward in (torch.nn.Linear(1, 1), CallableRewardSpec(fn=one_value_column)):
        quiet = RecordedProcess(64)
        assert reward_log_metrics(quiet, logs, {}, reward) == {} and quiet.calls == []
    asked = RecordedProcess(64)
    reward_log_metrics(asked, logs, {}, RewardObjectsSpec(reward_funcs=[logging_length]))
    assert asked.calls == ["max_int", "gather"]


def test_a_logged_value_json_cannot_hold_is_written_as_its_text(tmp_path):
    keyed = {(1, 2): 0.5}
    SampleTable(tmp_path).record(1, 8, ["q"], ["r"], [0.5], columns={"pairs": [keyed], "kind": [{1, 2}],
                                                                      "plain": [{"a": [1, None]}]})
    (row,) = samples(tmp_path)
    assert row["pairs"] == str(keyed) and row["kind"] == "{1, 2}" and row["plain"] == {"a": [1, None]}


def test_gather_json_on_one_process_is_the_object_itself():
    alone = Collectives(types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True, device="cpu"))
    payload = {"a": [1.0, 2]}
    assert alone.gather_json(payload) == [payload]
