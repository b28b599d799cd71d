"""What a run checks at its start, `--dry-run` checks too (one shared call: Recipe.check_can_start), and the
warnings and exits around it."""

import importlib.util
import json

import pytest

from tests.helpers import GRPO_RECIPE_HEAD
from training_wizard.cli import main

RECIPE = GRPO_RECIPE_HEAD + """\
[reward]
reward_funcs = ["start_rewards:length"]
[training]
num_generations = 2
per_device_train_batch_size = 2
total_episodes = 4
response_length = 4
"""


@pytest.fixture
def recipe(tmp_path, tiny_model_dir, monkeypatch):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Item {i}."}) + "\n" for i in range(4)))
    (tmp_path / "start_rewards.py").write_text("def length(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(out=tmp_path / "run", model=tiny_model_dir, data=data))
    return path


def hide_packages(monkeypatch, *names):
    """find_spec answers None for `names`, as where they are not installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


@pytest.mark.parametrize("overrides, expected", [
    (["training.use_vllm=true"], "training.use_vllm: vLLM is not installed"),
    (['training.report_to=["wandb"]'], "training.report_to: wandb requested but not installed"),
])
def test_dry_run_refuses_what_the_run_would_refuse_at_start(recipe, monkeypatch, capsys, overrides, expected):
    hide_packages(monkeypatch, "vllm", "wandb")
    for dry in (["--dry-run"], []):
        assert main([str(recipe), *overrides, *dry]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
    assert not (recipe.parent / "run" / "metrics.jsonl").exists()


def test_epsilon_high_below_epsilon_is_a_one_line_warning(recipe, capsys):
    assert main([str(recipe), "training.epsilon_high=0.1", "--dry-run"]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: training.epsilon_high (0.1) is below the lower clip range (epsilon / cliprange = "
                        "0.2): a positive advantage is clipped sooner than a negative one; DAPO's clip-higher sets "
                        "it above (0.28 with 0.2)"]
    assert main([str(recipe), "training.epsilon_high=0.28", "--dry-run"]) == 0
    assert "warning:" not in capsys.readouterr().out


def test_a_second_ctrl_c_is_one_line_and_exit_130(recipe, monkeypatch, capsys):
    from training_wizard.recipes.grpo import GRPORecipe

    def interrupted(self, dry_run=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(GRPORecipe, "main", interrupted)
    assert main([str(recipe)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("training-wizard: stopped by a second SIGINT"), err


def _listing(folder):
    return sorted((str(path.relative_to(folder)), path.stat().st_size) for path in folder.rglob("*"))


def _one_error_line(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    return err[0]


def test_dry_run_refuses_another_runs_folder_as_the_run_does_writing_nothing(recipe, capsys):
    run = recipe.parent / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"trainer": "training_wizard.trainers.algorithms.grpo.GRPOTrainer",
                                              "files": ["run.json", "metrics.jsonl"]}))
    (run / "metrics.jsonl").write_text(json.dumps({"episode": 4, "loss/policy_avg": 0.1}) + "\n")
    before = _listing(run)
    expected = f"output_dir: '{run}' holds another run's files (run.json, metrics.jsonl)"
    dry = _one_error_line(capsys, [str(recipe), "--dry-run"], expected)
    assert _listing(run) == before
    assert _one_error_line(capsys, [str(recipe)], expected) == dry


def test_dry_run_resuming_latest_over_checkpoints_none_of_which_verifies_is_one_line(recipe, capsys):
    run = recipe.parent / "run"
    step = run / "checkpoints" / "step-2"
    (step / "model").mkdir(parents=True)
    for name in ("model/model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.pt"):
        (step / name).write_bytes(b"cut short")
    files = {name: {"size": 9, "sha256": "0" * 64} for name in ("model/model.safetensors", "optimizer.pt",
                                                                "scheduler.pt", "trainer_state.pt")}
    (step / "manifest.json").write_text(json.dumps({"step": 2, "files": files}))
    before = _listing(run)
    _one_error_line(capsys, [str(recipe), 'resume_from_checkpoint="latest"', "--dry-run"],
                    "holds 1 checkpoint and none verifies (the newest, step-2: model/model.safetensors differs")
    assert _listing(run) == before


def test_dry_run_reads_the_eval_dataset_as_the_run_does(recipe, capsys):
    held_out = recipe.parent / "held_out.jsonl"
    held_out.write_text(json.dumps({"prompt": "Fine."}) + "\n" + json.dumps({"text": "no prompt"}) + "\n")
    for dry in (["--dry-run"], []):
        assert main([str(recipe), f"eval_dataset.data_files={held_out}", *dry]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "eval_dataset" in err[0], err
    assert not (recipe.parent / "run").exists()
