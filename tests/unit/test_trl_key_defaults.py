"""TRL keys this library now honours: a torch dtype in model_init_kwargs written by name, chat_template_kwargs
bound to the tokenizer, TRL's step-count defaults on the TRL-form constructor only, trackio's Space."""

from __future__ import annotations

import copy
import importlib.machinery
import json
import sys
import types

import torch

from training_wizard import GRPOConfig, RLOOConfig
from training_wizard.specs.chat_rendering import bind_chat_template_kwargs, chat_ids
from training_wizard.tracking.metrics import MetricsLogger
from training_wizard.trl.arguments import follow_trl_defaults


def test_a_torch_dtype_in_model_init_kwargs_is_written_by_name(tmp_path):
    config = RLOOConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": torch.bfloat16})
    assert json.dumps(config.model_dump(mode="json")["model_init_kwargs"]) == '{"dtype": "bfloat16"}'


def test_chat_template_kwargs_reach_the_template(tokenizer):
    tokenizer = copy.deepcopy(tokenizer)  # the session's tokenizer must stay as built: later tests render with it
    tokenizer.chat_template = "{{ messages[0]['content'] }}{% if enable_thinking is defined %}|off{% endif %}"
    message = [{"role": "user", "content": "hi"}]
    assert tokenizer.decode(chat_ids(tokenizer, message)) == "hi"
    bind_chat_template_kwargs(tokenizer, {"enable_thinking": False})
    assert tokenizer.decode(chat_ids(tokenizer, message)) == "hi|off"


def test_trl_form_follows_trls_epochs_and_names_what_still_differs(tmp_path, capsys):
    config = RLOOConfig(output_dir=str(tmp_path), temperature=1.0)
    follow_trl_defaults(config, "RLOO")
    assert (config.num_train_epochs, config.num_ppo_epochs) == (3.0, 1)
    printed = capsys.readouterr().out
    assert "response_length 53 (TRL 512)" in printed and "temperature" not in printed
    chosen = GRPOConfig(output_dir=str(tmp_path), num_train_epochs=2)
    follow_trl_defaults(chosen, "GRPO")
    assert chosen.num_train_epochs == 2.0  # what the caller set stays
    assert RLOOConfig(output_dir=str(tmp_path)).num_train_epochs == 1.0  # a recipe's config keeps ours


def test_trackio_space_id_is_passed_to_trackio(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("trackio")
    fake.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
    fake.init, fake.log, fake.finish = (lambda **kwargs: calls.append(kwargs)), (lambda *a, **k: None), lambda: None
    monkeypatch.setitem(sys.modules, "trackio", fake)
    logger = MetricsLogger(tmp_path, ["trackio"], True, {"trackio_space_id": "me/space"})
    logger.log({"loss": 1.0}, 1)
    logger.close()
    assert calls and calls[0]["space_id"] == "me/space"


def test_ppo_binds_chat_template_kwargs_as_grpo_and_rloo_do(tokenizer, tmp_path):
    from tests.helpers import make_ppo_trainer
    from training_wizard.specs.chat_rendering import chat_template_kwargs

    trainer = make_ppo_trainer(tokenizer, tmp_path, chat_template_kwargs={"enable_thinking": False})
    assert chat_template_kwargs(trainer.tokenizer) == {"enable_thinking": False}
