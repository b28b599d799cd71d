"""What TRL's scripts read off a config after building it (trust_remote_code, eval_strategy,
resume_from_checkpoint, push_to_hub, hub_model_id) has TRL's value for what a run here does."""

from __future__ import annotations

import pytest

from training_wizard import GRPOConfig, PPOConfig, RLOOConfig


@pytest.mark.parametrize("config_class", [GRPOConfig, RLOOConfig, PPOConfig])
def test_the_attributes_trls_scripts_read_have_trls_values(config_class):
    args = config_class(output_dir="unused")
    assert args.trust_remote_code is False and args.eval_strategy == "no" and args.resume_from_checkpoint is None
    assert args.push_to_hub is False and args.hub_model_id is None
    args = config_class(output_dir="unused", eval_steps=2, model_init_kwargs={"trust_remote_code": True},
                        push_to_hub=True, hub_model_id="me/model")
    assert args.trust_remote_code is True and args.eval_strategy == "steps"
    assert args.push_to_hub is True and args.hub_model_id == "me/model"


def test_trls_eval_strategy_key_and_the_attribute_agree():
    assert GRPOConfig(eval_strategy="no", eval_steps=None).eval_strategy == "no"
    assert GRPOConfig(eval_strategy="steps", eval_steps=3).eval_strategy == "steps"


def test_a_script_reading_the_config_as_trls_grpo_script_trains_evaluates_and_pushes(
        run_trl_script, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from training_wizard.trainers.config import hub

    uploads = []
    monkeypatch.setattr(hub, "upload_to_hub",
                        lambda folder, repo, label, **options: uploads.append((folder, repo)) or (repo, None))
    trainer = run_trl_script("trl_script_reads_args.py", tiny_model_dir, tmp_path)["trainer"]
    assert trainer.eval_prompts is not None and trainer.state.global_step == 1
    assert trainer.args.model_init_kwargs["trust_remote_code"] is False
    assert (tmp_path / "model.safetensors").exists()
    assert uploads == [(tmp_path, "me/facts")] and "pushed to me/facts" in capsys.readouterr().out
