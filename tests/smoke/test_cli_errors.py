"""Every recipe mistake ends in one stderr line naming the key, exit code 2, and no traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training_wizard.cli import main

GOOD = """\
recipe_class = "rloo"
output_dir = "{out}"
seed = 3

[model]
pretrained_name = "{model}"

[dataset]
data_files = "prompts.jsonl"

[reward]
spec_class = "training_wizard.specs.reward.FunctionRewardSpec"
function = "my_rewards:length_reward"

[training]
per_device_train_batch_size = 4
total_episodes = 8
response_length = 6
num_ppo_epochs = 1
num_sample_generations = 1
"""

REWARD_MODULE = '''
def length_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def recipe_dir(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # another test's module of the same name
    (tmp_path / "prompts.jsonl").write_text(
        "\n".join(json.dumps({"prompt": f"Say something about {t}.", "topic": t}) for t in ["cats", "rain", "tea", "maps"])
    )
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    (tmp_path / "empty.jsonl").write_text("\n")
    return tmp_path


def write_recipe(folder: Path, text: str, name="recipe.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def good_text(folder: Path, model_dir: Path) -> str:
    return GOOD.format(out=folder / "run", model=model_dir)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


CASES = {
    "toml_syntax": (lambda t: t.replace('seed = 3', 'seed = = 3'), ["invalid TOML", "line"]),
    "unknown_top_key": (lambda t: t.replace("seed = 3", "seed = 3\nlearning_rate = 1"),
                        [": learning_rate (line 4)", "unknown key"]),
    "unknown_training_key": (lambda t: t.replace("num_ppo_epochs = 1", "num_ppo_epoch = 1"),
                             ["training.num_ppo_epoch", "unknown key", "line 19"]),
    "unknown_nested_key": (lambda t: t.replace('data_files = "prompts.jsonl"', 'data_files = "prompts.jsonl"\ntkae = 3'),
                           ["dataset.tkae", "unknown key"]),
    "wrong_type": (lambda t: t.replace("response_length = 6", 'response_length = "long"'),
                   ["training.response_length", "integer"]),
    "missing_required": (lambda t: t.replace('output_dir = "', 'out_dir = "'), ["output_dir", "required"]),
    "zero_count": (lambda t: t.replace("per_device_train_batch_size = 4", "per_device_train_batch_size = 0"),
                   ["training.per_device_train_batch_size", "greater than 0"]),
    "negative_count": (lambda t: t.replace("total_episodes = 8", "total_episodes = -5"),
                       ["training.total_episodes", "greater than 0"]),
    "spec_class_import": (lambda t: t.replace("training_wizard.specs.reward.FunctionRewardSpec", "nope.Missing"),
                          ["reward", "could not be imported"]),
    "spec_class_not_subclass": (
        lambda t: t.replace("training_wizard.specs.reward.FunctionRewardSpec", "training_wizard.specs.dataset.DataSourceSpec"),
        ["reward", "not a subclass of RewardSpec"],
    ),
    "missing_recipe_class": (lambda t: t.replace('recipe_class = "rloo"', ""), ["recipe_class", "missing"]),
    "unknown_recipe_class": (lambda t: t.replace('"rloo"', '"rlooo"'), ["recipe_class"]),
    "missing_data_file": (lambda t: t.replace("prompts.jsonl", "nothere.jsonl"), ["dataset.data_files", "nothere.jsonl"]),
    "empty_data_file": (lambda t: t.replace("prompts.jsonl", "empty.jsonl"),
                        ["dataset.data_files", "empty.jsonl has no rows"]),
    "reward_function_malformed": (lambda t: t.replace("my_rewards:length_reward", "rw"),
                                  ["reward.function", "'rw' is not of the form 'package.module:function'"]),
    "reward_function_missing": (lambda t: t.replace("my_rewards:length_reward", "my_rewards:lenght_reward"),
                                ["reward.function", "could not be imported"]),
    "rloo_k_divisibility": (lambda t: t.replace("num_ppo_epochs = 1", "num_ppo_epochs = 1\nrloo_k = 3"),
                            ["rloo_k (3)", "local_batch_size (4"]),
    "vllm_with_sampling_logprobs": (
        lambda t: t.replace("num_ppo_epochs = 1", "num_ppo_epochs = 1\nuse_vllm = true\nlogprobs_from_sampling = true"),
        ["training", "logprobs must come from the training forward pass under vLLM"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_recipe_error_is_one_line_exit_2(case, recipe_dir, tiny_model_dir, capsys):
    mutate, needles = CASES[case]
    path = write_recipe(recipe_dir, mutate(good_text(recipe_dir, tiny_model_dir)))
    code, _, err = run_cli(capsys, path, "--dry-run")
    assert_one_line_error(code, err, str(path), *needles)


def test_override_of_unknown_key_is_named(recipe_dir, tiny_model_dir, capsys):
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, _, err = run_cli(capsys, path, "training.learning_rat=1e-5", "--dry-run")
    assert_one_line_error(code, err, "training.learning_rat", "command-line override", "unknown key")


def test_override_wrong_type_is_named(recipe_dir, tiny_model_dir, capsys):
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, _, err = run_cli(capsys, path, "training.rloo_k=two", "--dry-run")
    assert_one_line_error(code, err, "training.rloo_k", "command-line override")


def test_missing_recipe_file(tmp_path, capsys):
    code, _, err = run_cli(capsys, tmp_path / "absent.toml")
    assert_one_line_error(code, err, "absent.toml", "not found")


def test_json_recipe_and_dry_run_prints_plan_and_three_prompts(recipe_dir, tiny_model_dir, capsys):
    import tomllib

    data = tomllib.loads(good_text(recipe_dir, tiny_model_dir))
    path = recipe_dir / "recipe.json"
    path.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, path, "training.rloo_k=4", "--dry-run")
    assert code == 0, err
    assert "local_batch_size" in out and "prompts_per_iteration" in out and "num_iterations" in out
    assert "Say something about cats." in out and "Say something about tea." in out
    assert out.count("prompt ") >= 3
    assert not (recipe_dir / "run" / "metrics.jsonl").exists()  # a dry run trains nothing


def test_console_script_help_and_error_in_subprocess(recipe_dir, tiny_model_dir):
    console_script = Path(sys.executable).with_name("training-wizard")  # installed by `pip install -e .`
    for command in ([sys.executable, "-m", "training_wizard", "--help"], [str(console_script), "--help"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "usage: training-wizard" in done.stdout and "--dry-run" in done.stdout
        assert "Exit codes:" in done.stdout
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir).replace("seed = 3", "seed = 3\nsede = 1"))
    done = subprocess.run([sys.executable, "-m", "training_wizard", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        f"error: {path}: sede (line 4): unknown key (check the spelling; see docs/configuration.md for the keys this"
        " section accepts)"
    ]


def test_unwritable_output_dir_is_one_line_naming_it(recipe_dir, tiny_model_dir, capsys):
    blocker = recipe_dir / "a-file"
    blocker.write_text("not a folder")
    text = good_text(recipe_dir, tiny_model_dir).replace(str(recipe_dir / "run"), str(blocker / "run"))
    code, _, err = run_cli(capsys, write_recipe(recipe_dir, text))
    assert_one_line_error(code, err, "output_dir", "cannot create or write", str(blocker / "run"))


def test_batch_larger_than_the_run_or_the_dataset_is_said(recipe_dir, tiny_model_dir, capsys):
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, out, _ = run_cli(capsys, path, "training.total_episodes=3", "training.rloo_k=2",
                           "training.per_device_train_batch_size=16", "--dry-run")
    assert code == 0
    assert "note: one iteration is batch_size = 16 completions, more than total_episodes (3)" in out
    assert "note: each iteration takes 8 prompts but the dataset has 4: prompts repeat within an iteration" in out


def test_prompts_longer_than_the_context_are_counted_once(recipe_dir, tiny_model_dir, capsys):
    long_prompt = " ".join(["word"] * 600)  # the tiny model has 512 positions
    rows = [{"prompt": long_prompt}, {"prompt": "short"}, {"prompt": "short too"}, {"prompt": long_prompt}]
    (recipe_dir / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, out, _ = run_cli(capsys, path, "training.total_episodes=4", "training.response_length=2")
    assert code == 0
    assert out.count("warning: 2 prompt(s) are longer than max_position_embeddings (512) minus response_length (2)") == 1
    assert "filter_length" in out


@pytest.mark.parametrize("environment, needles", [
    ({"ACCELERATE_USE_FSDP": "true"}, ["accelerate config", "asks for FSDP", "came up as NO"]),
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, ["accelerate config", "DeepSpeed"]),  # installed or not
    ({"WORLD_SIZE": "2"}, ["says 2 processes (WORLD_SIZE)", "sees 1"]),
])
def test_a_launch_that_silently_fell_back_stops_with_one_line(recipe_dir, tiny_model_dir, capsys, monkeypatch,
                                                               environment, needles):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, _, err = run_cli(capsys, path, "--dry-run")
    assert_one_line_error(code, err, *needles)


def test_use_vllm_without_vllm_installed_is_one_line(recipe_dir, tiny_model_dir, capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment (tests/with_vllm cover it)")
    path = write_recipe(recipe_dir, good_text(recipe_dir, tiny_model_dir))
    code, _, err = run_cli(capsys, path, "training.use_vllm=true")
    assert_one_line_error(code, err, str(path), "training.use_vllm: vLLM is not installed", "setup_vllm.sh")
    assert not (recipe_dir / "run" / "model").exists()


def test_vllm_serve_subcommand_reaches_its_parser_without_vllm(capsys):
    """The subcommand's module is found (its home is rollout/vllm_server.py) before vLLM itself is imported."""
    with pytest.raises(SystemExit) as exit_info:
        main(["vllm-serve", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: training-wizard vllm-serve")
