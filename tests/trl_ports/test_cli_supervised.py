"""`training-wizard sft|reward --config x.yaml`: TRL's `trl sft` / `trl reward` YAML keys and flags run as the
equivalent recipe (output_dir/model, metrics.jsonl), and a key without a counterpart is one line, exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training_wizard.cli import main as cli_main
from training_wizard.tracking.metrics import read_metrics

REPO = Path(__file__).parents[2]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_yaml(path: Path, values: dict) -> Path:
    path.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))
    return path


def prompt_completion_rows(count: int = 4) -> list[dict]:
    return [{"prompt": f"Count to {i}:", "completion": " " + " ".join(map(str, range(i + 1)))} for i in range(count)]


def preference_rows(count: int = 4) -> list[dict]:
    return [{"prompt": f"Say {i}.", "chosen": f" {i}", "rejected": f" not {i} at all"} for i in range(count)]


def yaml_config(tmp_path: Path, model: Path, data: Path, **extra) -> Path:
    values = {"model_name_or_path": str(model), "dataset_name": str(data), "output_dir": str(tmp_path / "out"),
              "max_steps": 2, "per_device_train_batch_size": 2, "logging_steps": 1, **extra}
    return write_yaml(tmp_path / "config.yaml", values)


def run_command(command: str, config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training_wizard", command, "--config", str(config)], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_sft_command_trains_the_sft_recipe_from_a_yaml(tiny_model_dir, tmp_path):
    data = write_rows(tmp_path / "sft.jsonl", prompt_completion_rows())
    done = run_command("sft", yaml_config(tmp_path, tiny_model_dir, data, learning_rate=1e-4), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(read_metrics(tmp_path / "out")) >= 1
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()


@pytest.mark.slow
def test_reward_command_trains_a_lora_reward_model_from_a_yaml(tiny_model_dir, tmp_path):
    data = write_rows(tmp_path / "pairs.jsonl", preference_rows())
    config = yaml_config(tmp_path, tiny_model_dir, data, use_peft=True, lora_r=4, lora_alpha=8,
                         lora_task_type="SEQ_CLS")
    done = run_command("reward", config, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(read_metrics(tmp_path / "out")) >= 1
    assert (tmp_path / "out" / "model" / "config.json").exists()


@pytest.mark.parametrize("command, extra, expected", [
    ("sft", {"eval_strategy": "steps"}, "unknown keys eval_strategy"),
    ("sft", {"use_peft": True, "use_dora": True}, "error: ModelConfig.use_dora: not supported by training-wizard sft"),
    ("sft", {"dataset_streaming": True}, "error: dataset_streaming: not supported"),
    ("reward", {"eval_steps": 1}, "error: dataset_test_split: "),
    ("reward", {"load_in_4bit": True}, "error: ModelConfig.load_in_4bit: quantized models are not supported"),
])
def test_a_key_without_a_counterpart_is_one_line_and_exit_code_2(tmp_path, capsys, command, extra, expected):
    data = write_rows(tmp_path / "rows.jsonl", preference_rows())
    config = yaml_config(tmp_path, tmp_path / "no-model", data, **extra)
    assert cli_main([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
