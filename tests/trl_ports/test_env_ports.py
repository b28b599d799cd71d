"""Environment and tool scripts written as TRL 1.16's environment and tools pages write them, with only the import
line changed: each runs end to end (runpy, a tiny local model whose chat template renders tools, two optimizer
steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training_wizard.rollout.chat_templates import load_chat_template
from training_wizard.tracking.metrics import read_metrics


@pytest.fixture(scope="module")
def tools_model_dir(tmp_path_factory) -> Path:
    """The tiny model with the Hermes training template, as a model whose own template renders tools ships."""
    from transformers import AutoTokenizer

    from training_wizard.testing import save_tiny_model

    folder = save_tiny_model(tmp_path_factory.mktemp("tiny-tools"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = load_chat_template("hermes")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("script", ["trl_env_tools.py", "trl_env_openenv_echo.py"])
def test_tool_and_environment_scripts_train(run_trl_script, script, tools_model_dir, tmp_path):
    run_trl_script(script, tools_model_dir, tmp_path)
    assert [record["episode"] for record in read_metrics(tmp_path)] == [4, 8]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["trl_env_reset_prompt.py", "trl_env_routed.py"])
def test_environments_that_supply_the_prompt_train(run_trl_script, script, tools_model_dir, tmp_path):
    run_trl_script(script, tools_model_dir, tmp_path)
    assert [record["episode"] for record in read_metrics(tmp_path)] == [4, 8]
