"""What a script written for TRL's trainers reads after train() (trl/results.py, trl/callbacks.py)
and TRL 1.16's metric names beside ours (trainers/loop/iteration_metrics.py)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerState
from transformers.trainer_utils import TrainOutput

from tests.helpers import distinct, make_grpo_trainer, make_rloo_trainer
from training_wizard.core.losses import clipped_surrogate_sequence
from training_wizard.errors import UserError
from training_wizard.tracking.metrics import read_metrics
from training_wizard.trainers.loop.iteration_metrics import completion_metrics, reward_metrics, tokens_read
from training_wizard.trainers.algorithms.rloo import clip_ratios
from training_wizard.trainers.loop.run_state import RunState
from training_wizard.trl.trainers import RLOOTrainer

ONE_PROCESS = SimpleNamespace(sum=lambda tensor: tensor, max=lambda tensor: tensor)


def batch(lengths: list[int], stopped: list[bool], scores: list[float] | None = None, prompt: int = 2):
    """A stand-in trajectory batch: each row's first `length` tokens real and trained on."""
    width = max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return SimpleNamespace(loss_mask=mask, completion_mask=torch.ones_like(mask), has_stop=torch.tensor(stopped),
                           prompt_mask=torch.ones(len(lengths), prompt, dtype=torch.bool),
                           scores=torch.tensor(scores or [0.0] * len(lengths)))


def test_completion_metrics_follow_trls_definitions():
    rows = batch([3, 5, 2], [True, False, True])
    metrics = completion_metrics(ONE_PROCESS, "cpu", rows)
    assert metrics == {
        "completions/mean_length": pytest.approx(10 / 3), "completions/min_length": 2.0,
        "completions/max_length": 5.0, "completions/clipped_ratio": pytest.approx(1 / 3),
        "completions/mean_terminated_length": 2.5, "completions/min_terminated_length": 2.0,
        "completions/max_terminated_length": 3.0,
    }
    assert tokens_read(ONE_PROCESS, "cpu", rows) == 10 + 3 * 2  # sampled tokens and prompts
    none_ended = completion_metrics(ONE_PROCESS, "cpu", batch([4, 4], [False, False]))
    assert none_ended["completions/mean_terminated_length"] == none_ended["completions/max_terminated_length"] == 0.0


def test_reward_metrics_are_means_unbiased_std_and_token_mean_kl():
    rows = batch([2, 2, 4, 4], [True] * 4, scores=[1.0, 1.0, 2.0, 4.0])
    kl = torch.tensor([0.2, 0.2, 0.4, 0.4])  # summed over each row's tokens
    metrics = reward_metrics(ONE_PROCESS, "cpu", rows, torch.tensor([True, True, False, False]), kl)
    assert metrics["reward"] == 2.0
    assert metrics["reward_std"] == pytest.approx(float(torch.tensor([1.0, 1.0, 2.0, 4.0]).std()))
    assert metrics["frac_reward_zero_std"] == 0.5 and metrics["kl"] == pytest.approx(1.2 / 12)
    assert "kl" not in reward_metrics(ONE_PROCESS, "cpu", rows, torch.zeros(4, dtype=torch.bool), None)


def test_rloo_clip_ratios_count_clipped_completions_by_advantage_sign():
    config = SimpleNamespace(cliprange=0.2, epsilon_high=None)
    ratio, advantages = torch.tensor([0.5, 0.5, 1.5, 1.0]), torch.tensor([-1.0, 1.0, 1.0, 1.0])
    shares = clip_ratios(ratio, advantages, torch.ones(4, 3, dtype=torch.bool), config)
    assert [float(shares[f"clip_ratio/{name}_mean"]) for name in ("low", "high", "region")] == [0.25, 0.25, 0.5]


def test_rloo_clip_ratios_count_a_truncated_completion_as_unclipped_like_trl():
    """TRL 1.16's mask_truncated_completions zeroes the row's completion_mask: its ratio is exp(0 - 0) = 1, never
    clipped, and its row stays in the gathered nanmean's denominator."""
    config = SimpleNamespace(cliprange=0.2, epsilon_high=None)
    mask = torch.tensor([[True, True], [False, False]])
    logprobs = torch.tensor([[-1.0, -1.0], [-3.0, -0.5]])
    out = clipped_surrogate_sequence(logprobs, logprobs + 0.5, torch.tensor([-1.0, -1.0]), mask, 0.2)
    assert out.ratio.tolist() == pytest.approx([math.exp(-1.0), 1.0])
    shares = clip_ratios(out.ratio, torch.tensor([-1.0, -1.0]), mask, config)
    assert float(shares["clip_ratio/low_mean"]) == float(shares["clip_ratio/region_mean"]) == 0.5


def test_rloo_frac_reward_zero_std_compares_rewards_after_the_kl_penalty():
    """TRL 1.16's RLOO takes the group std of score - beta * kl: equal scores with unequal KL are not a zero std."""
    rollout = SimpleNamespace(scores=torch.tensor([1.0, 1.0, 2.0, 3.0]), group_ids=torch.tensor([0, 0, 1, 1]))
    shaped = SimpleNamespace(rlhf_reward=torch.tensor([0.9, 0.8, 2.5, 2.5]), scored=None)
    rloo = SimpleNamespace(config=SimpleNamespace(kl_coef=0.0))
    assert RLOOTrainer.trl_reward_inputs(rloo, rollout, shaped).std_is_zero.tolist() == [False, False, True, True]
    lone = SimpleNamespace(rlhf_reward=shaped.rlhf_reward, scored=torch.tensor([True, False, True, True]))
    assert RLOOTrainer.trl_reward_inputs(rloo, rollout, lone).std_is_zero.tolist() == [False, False, True, True]


def test_the_token_count_is_part_of_a_checkpoint():
    state = RunState(seed=0, num_rows=4)
    state.num_input_tokens_seen = 123
    resumed = RunState(seed=0, num_rows=4)
    resumed.load_state_dict(state.state_dict())
    assert isinstance(resumed, TrainerState) and resumed.num_input_tokens_seen == 123


@pytest.fixture(scope="module")
def trained(tokenizer, tmp_path_factory):
    """An RLOO run of two iterations (two optimizer steps each) without callbacks, and what train() returned."""
    output_dir = tmp_path_factory.mktemp("rloo")
    trainer = make_rloo_trainer(tokenizer, output_dir, reward=distinct, num_ppo_epochs=1, num_mini_batches=2,
                                 per_device_train_batch_size=4, learning_rate=1e-4, kl_coef=0.1)
    return trainer, trainer.train(), output_dir


def test_state_log_history_and_train_output_without_callbacks(trained):
    trainer, output, output_dir = trained
    assert isinstance(trainer.state, TrainerState) and trainer.state.global_step == 4  # optimizer steps
    records = read_metrics(output_dir)
    history = trainer.state.log_history
    assert [entry["step"] for entry in history[:-1]] == [2, 4]
    assert [entry["episode"] for entry in history[:-1]] == [r["episode"] for r in records]
    assert isinstance(output, TrainOutput) and output.global_step == 4
    assert output.training_loss == pytest.approx(sum(r["loss/policy_avg"] for r in records) / 2)
    assert history[-1] == {**output.metrics, "step": 4} and output.metrics["train_loss"] == output.training_loss
    assert all(entry["step_time"] > 0 for entry in history[:-1])  # TRL's, in log_history only: a wall-clock figure
    assert trainer.args is trainer.config and trainer.model is trainer.unwrapped_policy


def test_rloo_logs_trls_names_beside_ours(trained):
    trainer, _, output_dir = trained
    records = read_metrics(output_dir)
    for record in records:
        assert record["reward"] == pytest.approx(record["objective/scores"])
        assert record["loss"] == record["loss/policy_avg"] and record["learning_rate"] == record["lr"]
        assert record["grad_norm"] > 0 and math.isfinite(record["kl"]) and "step_time" not in record
        assert record["completions/min_length"] <= record["completions/mean_length"] <= record[
            "completions/max_length"]
    tokens = [record["num_tokens"] for record in records]
    assert 0 < tokens[0] < tokens[1] == trainer.state.num_input_tokens_seen  # a running total, as TRL's


def test_save_metrics_save_state_and_log_metrics_as_transformers(trained, capsys):
    trainer, output, output_dir = trained
    trainer.log_metrics("train", output.metrics)
    assert capsys.readouterr().out.splitlines()[0] == "***** train metrics *****"
    trainer.save_metrics("train", output.metrics)
    trainer.save_metrics("eval", {"eval_reward": 1.5})
    assert json.loads((output_dir / "train_results.json").read_text()) == output.metrics
    assert json.loads((output_dir / "all_results.json").read_text()) == {**output.metrics, "eval_reward": 1.5}
    trainer.save_state()
    assert TrainerState.load_from_json(str(output_dir / "trainer_state.json")).global_step == 4


def test_push_to_hub_without_a_token_is_one_line_after_saving(tokenizer, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    trainer = make_grpo_trainer(tokenizer, tmp_path, total_episodes=8)
    with pytest.raises(UserError, match=r"^push_to_hub: no Hugging Face token \(set HF_TOKEN or run `hf auth "
                       r"login`\); nothing was uploaded; the model is saved in "):
        trainer.push_to_hub()
    assert (tmp_path / "model.safetensors").exists() and trainer.hub_model_id is None


def test_the_summary_shows_each_reward_component_once_beside_trls_mean_and_std():
    from training_wizard.tracking.summary import main_metric_names

    present = {"objective/scores", "rewards/a", "rewards/a/mean", "rewards/a/std", "reward", "reward_std"}
    assert main_metric_names(present) == ["objective/scores", "rewards/a"]


def test_a_trl_script_reads_push_to_hub_off_the_config():
    from training_wizard import GRPOConfig, RLOOConfig

    for config_class in (GRPOConfig, RLOOConfig):  # trl/scripts/grpo.py: `if training_args.push_to_hub: ...`
        args = config_class(output_dir="unused", push_to_hub=False)
        assert args.push_to_hub is False and args.hub_model_id is None
