"""TRL scripts that set chat_template_kwargs, tools, num_completions_to_print, log_completions and a torch dtype in
model_init_kwargs, with only the import line changed; each runs end to end on a tiny local model and 2 rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training_wizard.rollout.chat_templates import HERMES
from training_wizard.testing import save_tiny_model
from training_wizard.tracking.metrics import read_metrics

# Qwen3's switch: with enable_thinking false the template writes an empty thinking block after the generation prompt
THINKING_OFF = "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}" \
               "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> Path:
    """The tiny model with a Qwen3-like template: Hermes tools plus the enable_thinking switch."""
    from transformers import AutoTokenizer

    folder = save_tiny_model(tmp_path_factory.mktemp("thinking"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = HERMES + THINKING_OFF
    tokenizer.save_pretrained(folder)
    return folder


def rendered_prompts(trainer) -> list[str]:
    return [trainer.tokenizer.decode(ids) for ids in trainer.train_prompts.input_ids]


@pytest.mark.slow
def test_agent_script_renders_without_thinking_and_prints_two_completions(run_trl_script, thinking_model, tmp_path,
                                                                          capsys):
    trainer = run_trl_script("trl_keys_grpo_agent.py", thinking_model, tmp_path)["trainer"]
    assert all(text.endswith("<think>\n\n</think>\n\n") for text in rendered_prompts(trainer))
    assert [record["episode"] for record in read_metrics(tmp_path)] == [2, 4]
    assert trainer.config.model_dump(mode="json")["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.slow
def test_grpo_script_with_chat_template_kwargs_trains_one_epoch(run_trl_script, thinking_model, tmp_path):
    trainer = run_trl_script("trl_keys_grpo_thinking.py", thinking_model, tmp_path)["trainer"]
    assert all(text.endswith("<think>\n\n</think>\n\n") for text in rendered_prompts(trainer))
    assert [record["episode"] for record in read_metrics(tmp_path)] == [2, 4]  # num_train_epochs = 1 as set


@pytest.mark.slow
def test_rloo_script_with_a_torch_dtype_trains_trls_three_epochs(run_trl_script, tiny_model_dir, tmp_path, capsys):
    trainer = run_trl_script("trl_keys_rloo_dtype.py", tiny_model_dir, tmp_path)["trainer"]
    # TRL 1.16: 3 epochs x 2 rows x 2 completions, 2 per optimizer step, one step per generation: 6 steps
    assert (trainer.config.num_train_epochs, trainer.config.num_ppo_epochs) == (3.0, 1)
    assert [record["episode"] for record in read_metrics(tmp_path)] == [2, 4, 6, 8, 10, 12]
    # what resolved_config.toml, run.json and a checkpoint's settings are written from: the dtype by its name
    assert json.dumps(trainer.config.model_dump(mode="json")["model_init_kwargs"]) == '{"dtype": "float32"}'
    assert "defaults that differ from TRL 1.16's" in capsys.readouterr().out
