"""On-policy distillation runs end to end through the CLI (slow): a run killed three times and resumed equals the
uninterrupted one bit for bit, and two processes train the weights one process trains (full student and LoRA
student), as tests/unit/test_turn_credit_runs.py and tests/smoke/test_distributed.py check the RL recipes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = """\
recipe_class = "distill"
output_dir = "{out}"
seed = 5

[model]
pretrained_name = "{model}"
{lora}

[teacher_model]
pretrained_name = "{teacher}"

[dataset]
data_files = "{data}"

[training]
distillation_loss = "{form}"
beta = 0.5
per_device_train_batch_size = {batch}
gradient_accumulation_steps = {accumulation}
num_mini_batches = {mini_batches}
num_ppo_epochs = 2
total_episodes = {episodes}
max_completion_length = 6
learning_rate = 2e-3
warmup_steps = 2
num_sample_generations = 3
save_steps = 1
"""


def write_recipe(folder: Path, model_dir: Path, name: str, form: str, batch: int = 2, accumulation: int = 2,
                 episodes: int = 96, lora: str = "", mini_batches: int = 2) -> Path:
    """8 completions per iteration by default (2 x 2 accumulation x 2 mini-batches), 12 iterations over 6
    prompts; the teacher is another tiny model of the same tokenizer."""
    from training_wizard.testing import save_tiny_model

    data, teacher = folder / "prompts.jsonl", folder / "teacher"
    if not data.exists():
        data.write_text("\n".join(json.dumps({"prompt": f"Tell me about item {i}."}) for i in range(6)) + "\n")
        save_tiny_model(teacher, seed=3)
    recipe = folder / f"{name}.toml"
    recipe.write_text(RECIPE.format(out=folder / name, model=model_dir, teacher=teacher, data=data, form=form,
                                    batch=batch, accumulation=accumulation, episodes=episodes, lora=lora,
                                    mini_batches=mini_batches))
    return recipe


@pytest.mark.slow
@pytest.mark.parametrize("form", ["jsd", "sampled_k3"])
def test_kill_then_resume_is_exact(tmp_path, tiny_model_dir, form):
    from tests.reliability.reliability_helpers import assert_same_run, read_jsonl, run_cli

    child = run_cli([str(write_recipe(tmp_path, tiny_model_dir, "reference", form))], tmp_path / "logs" / "reference",
                    timeout=900)
    assert child.code == 0, child.stderr()[-3000:]
    argv = [str(write_recipe(tmp_path, tiny_model_dir, "killed", form)), "resume_from_checkpoint=latest"]
    for life, point in enumerate(["generation@1", "update@3", "save:latest@6"]):
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env={"TRAINING_WIZARD_FAULT_INJECT": point},
                        timeout=900)
        assert child.code == -signal.SIGKILL, (point, child.code, child.stderr()[-2000:])
    child = run_cli(argv, tmp_path / "logs" / "last", timeout=900)
    assert child.code == 0, child.stderr()[-3000:]
    assert_same_run(tmp_path / "killed", tmp_path / "reference")
    killed, reference = read_jsonl(tmp_path / "killed" / "metrics.jsonl"), read_jsonl(tmp_path / "reference" /
                                                                                        "metrics.jsonl")
    assert [r["distill/divergence"] for r in killed] == [r["distill/divergence"] for r in reference]


def launch(folder: Path, model_dir: Path, name: str, processes: int, form: str, lora: str) -> Path:
    """The same global batch of 8 either way: 1 process x 4 x 2 accumulation, or 2 processes x 4 x 1; one
    mini-batch, so each optimizer step holds the same rows however they are split."""
    from tests.smoke.test_distributed import free_port

    recipe = write_recipe(folder, model_dir, name, form, batch=4, accumulation=2 // processes, episodes=24,
                          lora=lora, mini_batches=1)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    launcher = [] if processes == 1 else [
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    child = subprocess.run([sys.executable, *launcher, "-m", "training_wizard", str(recipe)], capture_output=True,
                           text=True, timeout=900, env=env, cwd=folder)
    assert child.returncode == 0, child.stderr[-3000:]
    return folder / name


@pytest.mark.slow
@pytest.mark.parametrize("form,lora", [
    ("jsd", ""), ("sampled_k1", ""),
    ("jsd", 'lora = { r = 4, alpha = 8, target_modules = "all-linear" }'),
], ids=["jsd", "sampled_k1", "jsd_lora"])
def test_two_processes_match_one_process(tmp_path, tiny_model_dir, form, lora):
    from safetensors.torch import load_file

    from tests.reliability.reliability_helpers import read_jsonl

    one, two = (launch(tmp_path, tiny_model_dir, name, processes, form, lora)
                for name, processes in (("single", 1), ("double", 2)))
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    a, b = load_file(str(one / "model" / weights)), load_file(str(two / "model" / weights))
    assert a.keys() == b.keys() and len(a) > 0
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    m1, m2 = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert len(m1) == len(m2) == 3
    for r1, r2 in zip(m1, m2):
        for key in ["distill/divergence", "distill/teacher_logprob", "distill/student_logprob", "loss/policy_avg"]:
            assert r1[key] == pytest.approx(r2[key], abs=1e-5), key
