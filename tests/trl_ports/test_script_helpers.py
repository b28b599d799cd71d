"""TRL's script helpers (TrlParser, ScriptArguments, ModelConfig, get_peft_config, ...) and the
`training-wizard grpo --config x.yaml` command: unit checks of the parser, and the port scripts
(trl_script_*.py, written as TRL's scripts are, importing from training_wizard) run end to end on a tiny model."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from training_wizard import GRPOConfig, ModelConfig, RLOOConfig, ScriptArguments, TrlParser
from training_wizard import get_kbit_device_map, get_peft_config, get_quantization_config
from training_wizard.cli import main as cli_main
from training_wizard.errors import UserError
from training_wizard.tracking.metrics import read_metrics

HERE = Path(__file__).parent
REPO = HERE.parents[1]
SMALL = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "6",
         "--num_sample_generations", "0"]


def write_yaml(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def dataset_folder(folder: Path, rows: int = 4) -> Path:
    """A local dataset folder as load_dataset opens one: train.jsonl of standard prompts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Tell me about {i}."}) + "\n"
                                                for i in range(rows)))
    return folder


# -- TrlParser -----------------------------------------------------------------------------------------------------
def test_yaml_sets_values_flags_override_them_and_env_is_exported(tmp_path, monkeypatch):
    monkeypatch.delenv("TW_SCRIPT_VAR", raising=False)
    config = write_yaml(tmp_path / "grpo.yaml", [
        "env:", "  TW_SCRIPT_VAR: 7", "model_name_or_path: some/model", "dataset_name: data",
        "learning_rate: 1.0e-5", "max_steps: 5", "report_to: none", "lora_target_modules: [q_proj, v_proj]"])
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(
        ["--config", str(config), "--max_steps", "3", "--output_dir", "out", "--use_peft", "--dtype", "bfloat16"])
    assert script_args.dataset_name == "data" and script_args.dataset_train_split == "train"
    assert (training_args.learning_rate, training_args.max_steps, training_args.output_dir) == (1e-5, 3, "out")
    assert model_args.use_peft and model_args.lora_target_modules == ["q_proj", "v_proj"]
    assert model_args.dtype == training_args.dtype == "bfloat16"  # a name both classes declare goes to both
    assert os.environ["TW_SCRIPT_VAR"] == "7"


def test_config_aliases_booleans_and_lists_parse_from_flags():
    parser = TrlParser((RLOOConfig, ModelConfig))
    training_args, model_args = parser.parse_args_into_dataclasses(
        ["--num_iterations", "2", "--bf16", "false", "--lora_target_modules", "all-linear", "--lora_r", "4"])
    assert training_args.num_ppo_epochs == 2 and training_args.bf16 is False
    assert model_args.lora_target_modules == "all-linear" and model_args.lora_r == 4  # one name: TRL's string


@pytest.mark.parametrize("argv, expected", [
    (["--learning_rate", "abc"], "error: argument --learning_rate: invalid float value: 'abc'"),
    (["--learning_rate", "-1"], "error: GRPOConfig: learning_rate: Input should be greater than 0"),
    (["--hub_token", "t"], 'error: GRPOConfig: hub_token: "t" is not supported'),
    (["--no_such_flag", "1"], "error: unknown arguments: --no_such_flag 1"),
    (["--lora_r", "x"], "error: argument --lora_r: invalid int value: 'x'"),
    (["--config", "missing.yaml"], "error: --config missing.yaml: cannot read"),
])
def test_a_mistake_is_one_line_and_exit_code_2(argv, expected, capsys):
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args_and_config(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(expected) and err.count("\n") == 1


def test_unknown_yaml_keys_are_refused_or_left_out_with_a_warning(tmp_path, capsys):
    config = write_yaml(tmp_path / "c.yaml", ["dataset_name: data", "no_such_key: 1"])
    with pytest.raises(SystemExit):
        TrlParser((ScriptArguments,)).parse_args_and_config(["--config", str(config)])
    assert "unknown keys no_such_key (no argument of ScriptArguments takes them)" in capsys.readouterr().err
    (script_args,) = TrlParser((ScriptArguments,)).parse_args_and_config(["--config", str(config)],
                                                                        fail_with_unknown_args=False)
    assert script_args.dataset_name == "data" and "left out: no_such_key" in capsys.readouterr().err


# -- ModelConfig helpers --------------------------------------------------------------------------------------------
def test_peft_config_from_model_config():
    assert get_peft_config(ModelConfig()) is None
    lora = get_peft_config(ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules=["q_proj"]))
    assert (lora.r, lora.lora_alpha, lora.target_modules, lora.bias) == (4, 8, "q_proj", "none")


def test_quantization_is_refused_in_one_line_and_cpu_has_no_device_map():
    assert get_quantization_config(ModelConfig()) is None
    with pytest.raises(UserError, match=r"^ModelConfig.load_in_4bit: quantized models are not supported"):
        get_quantization_config(ModelConfig(load_in_4bit=True))
    with pytest.raises(UserError, match="load_in_8bit and load_in_4bit are both true"):
        ModelConfig(load_in_4bit=True, load_in_8bit=True)
    if not __import__("torch").cuda.is_available():
        assert get_kbit_device_map() is None


# -- the CLI's TRL form ---------------------------------------------------------------------------------------------
def test_cli_reads_sft_configs_and_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    assert cli_main(["sft", "--config", "x.yaml"]) == 2  # parsed as TRL's sft script parses (test_cli_supervised.py)
    assert capsys.readouterr().err.startswith("error: --config x.yaml: cannot read")
    assert cli_main(["reward", "--dataset_name", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: model_name_or_path: required (a model folder or a cached Hub id)\n"
    data = dataset_folder(tmp_path / "data")
    assert cli_main(["grpo", "--dataset_name", str(data), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "error: model_name_or_path: required (a model folder or a cached Hub id)\n"
    assert cli_main(["grpo", "--model_name_or_path", "m", "--reward_funcs", "nothing"]) == 2
    assert "reward_funcs: 'nothing' is neither one of accuracy_reward" in capsys.readouterr().err


# -- the port scripts, end to end -----------------------------------------------------------------------------------
def run_script(script: str, argv: list[str]) -> None:
    saved = sys.argv
    sys.argv = [script, *argv]
    try:
        runpy.run_path(str(HERE / script), run_name="__main__")
    finally:
        sys.argv = saved


@pytest.mark.slow
def test_grpo_script_with_a_yaml_config(tiny_model_dir, tmp_path):
    data = dataset_folder(tmp_path / "data")
    config = write_yaml(tmp_path / "grpo.yaml", [
        f"model_name_or_path: {tiny_model_dir}", f"dataset_name: {data}", f"output_dir: {tmp_path / 'out'}",
        "max_steps: 2", "per_device_train_batch_size: 4", "num_generations: 4", "max_completion_length: 6",
        "num_sample_generations: 0", "report_to: none", "logging_steps: 1"])
    run_script("trl_script_grpo.py", ["--config", str(config), "--learning_rate", "1e-5"])
    records = read_metrics(tmp_path / "out")
    assert [r["episode"] for r in records] == [4, 8] and all("rewards/reward_brevity" in r for r in records)
    assert (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.slow
def test_grpo_lora_script_trains_an_adapter(tiny_model_dir, tmp_path):
    data = dataset_folder(tmp_path / "data")
    run_script("trl_script_grpo_lora.py", [
        "--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(data), "--output_dir", str(tmp_path),
        "--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj",
        "--num_generations", "4", *SMALL])
    assert [r["episode"] for r in read_metrics(tmp_path)] == [4, 8]
    assert json.loads((tmp_path / "adapter_config.json").read_text())["r"] == 4


@pytest.mark.slow
def test_rloo_script_from_flags(tiny_model_dir, tmp_path):
    data = dataset_folder(tmp_path / "data")
    run_script("trl_script_rloo.py", [
        "--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(data), "--output_dir", str(tmp_path),
        "--num_generations", "2", "--num_iterations", "1", *SMALL])
    records = read_metrics(tmp_path)
    assert len(records) == 2 and all("rewards/reward_vowels" in r for r in records)


@pytest.mark.slow
def test_training_wizard_grpo_config_command(tiny_model_dir, tmp_path):
    data = dataset_folder(tmp_path / "data")
    config = write_yaml(tmp_path / "grpo.yaml", [
        f"model_name_or_path: {tiny_model_dir}", f"dataset_name: {data}", f"output_dir: {tmp_path / 'out'}",
        "reward_funcs: [trl_script_grpo.reward_brevity, think_format_reward]", "max_steps: 2",
        "per_device_train_batch_size: 4", "num_generations: 4", "max_completion_length: 6",
        "num_sample_generations: 0", "report_to: none"])
    command = [sys.executable, "-m", "training_wizard", "grpo", "--config", str(config), "--learning_rate", "1e-5"]
    done = subprocess.run(command, cwd=HERE, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_metrics(tmp_path / "out")
    assert [r["episode"] for r in records] == [4, 8]
    assert all("rewards/reward_brevity" in r and "rewards/think_format_reward" in r for r in records)
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()
