"""Scripts that read what TRL's trainers leave after `train()` (state, args, results files, the Hub upload) and
TRL 1.16's metric names, written as TRL's example scripts are, with only the import line changed; each runs end
to end on a tiny local model, 2-4 local rows and two optimizer steps."""

from __future__ import annotations

import json

import pytest

from training_wizard.errors import UserError
from training_wizard.tracking.metrics import read_metrics


def test_post_train_lines_save_results_and_state_and_push_ends_in_one_line(run_trl_script, tiny_model_dir, tmp_path,
                                                                         capsys):
    with pytest.raises(UserError) as raised:
        run_trl_script("trl_post_train.py", tiny_model_dir, tmp_path)
    assert str(raised.value) == (f"push_to_hub: the Hugging Face Hub is offline here (HF_HUB_OFFLINE=1); nothing was "
                                 f"uploaded; the model is saved in {tmp_path}")
    printed = capsys.readouterr().out
    assert "***** train metrics *****" in printed and "steps: 2, loss: " in printed
    assert f"model saved to {tmp_path}" in printed
    results = json.loads((tmp_path / "train_results.json").read_text())
    assert results["train_samples"] == 4 and {"train_runtime", "train_loss", "epoch"} <= set(results)
    assert json.loads((tmp_path / "all_results.json").read_text()) == results
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["max_steps"] == 2
    logged = [entry for entry in state["log_history"] if "reward" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    assert [entry["reward"] for entry in logged] == [r["reward"] for r in read_metrics(tmp_path)]
    assert state["log_history"][-1]["train_loss"] == results["train_loss"]
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "tokenizer_config.json").exists()


def test_rloo_with_eval_and_lora_logs_trls_names(run_trl_script, tiny_model_dir, tmp_path, capsys):
    trainer = run_trl_script("trl_post_rloo_eval_lora.py", tiny_model_dir, tmp_path)["trainer"]
    printed = capsys.readouterr().out
    assert printed.count("eval reward") == 2 and printed.count(": reward ") == 2
    assert "trainable params" in printed  # trainer.model is the PEFT model
    history = trainer.state.log_history
    train = [entry for entry in history if "reward" in entry]
    records = [record for record in read_metrics(tmp_path) if "objective/scores" in record]  # not eval's
    assert len(train) == len(records) == 2
    for entry, record in zip(train, records):
        assert entry["reward"] == pytest.approx(record["objective/scores"])
        assert entry["loss"] == record["loss/policy_avg"] and entry["learning_rate"] == record["lr"]
        assert entry["entropy"] == record["policy/entropy_avg"]
        assert entry["rewards/unique_letters/mean"] == record["rewards/unique_letters"]
    assert trainer.state.global_step == 2 and trainer.args.output_dir == str(tmp_path)
    assert trainer.processing_class is trainer.tokenizer
    assert (tmp_path / "adapter_model.safetensors").exists()


def test_grpo_log_history_has_reward_kl_tokens_and_length(run_trl_script, tiny_model_dir, tmp_path, capsys):
    trainer = run_trl_script("trl_post_grpo_metrics.py", tiny_model_dir, tmp_path)["trainer"]
    assert capsys.readouterr().out.count("step ") == 2
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    records = read_metrics(tmp_path)
    assert [entry["step"] for entry in history] == [1, 2]
    tokens = [entry["num_tokens"] for entry in history]
    assert 0 < tokens[0] < tokens[1]  # a running total, as TRL's num_input_tokens_seen
    for entry, record in zip(history, records):
        assert entry["completions/mean_length"] == record["completions/mean_length"]
        assert entry["kl"] >= 0.0 and entry["kl"] == record["kl"]
