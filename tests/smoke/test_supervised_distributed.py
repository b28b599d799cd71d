"""The supervised loop on two CPU processes (gloo) ends where one process with the same global batch ends: the
loss is divided by the step's completion tokens over every process, and evaluation splits the held-out rows."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from test_distributed import free_port

RECIPE = """\
recipe_class = "sft"
output_dir = "{out}"
seed = 5
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
hold_out = 5
[training]
per_device_train_batch_size = 2
gradient_accumulation_steps = {accumulation}
max_steps = 4
learning_rate = 2e-3
eval_steps = 2
"""


def run(tmp_path, model, name, processes):
    data = tmp_path / "rows.jsonl"
    if not data.exists():  # completions of 1 to 6 words: micro-batches hold different numbers of tokens
        data.write_text("\n".join(json.dumps({"prompt": f"Item {i}: ", "completion": "word " * (1 + i % 6)})
                                  for i in range(21)) + "\n")
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(RECIPE.format(out=tmp_path / name, model=model, data=data, accumulation=2 // processes))
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "training_wizard", str(recipe)]
    if processes > 1:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(free_port()), "-m", "training_wizard", str(recipe)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.slow  # about a minute: two launches of two processes
def test_two_processes_match_one_process(tmp_path, tiny_model_dir):
    for name, processes in (("single", 1), ("double", 2)):
        done = run(tmp_path, tiny_model_dir, name, processes)
        assert done.returncode == 0, done.stderr[-3000:]
    a = load_file(str(tmp_path / "single" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "double" / "model" / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    m1, m2 = ([json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
              for n in ("single", "double"))
    assert len(m1) == len(m2) == 4 + 2  # 4 steps, evaluations at steps 2 and 4 (5 held-out rows: 3 + 2)
    for x, y in zip(m1, m2):
        assert x.keys() == y.keys()
        for key in ("loss", "mean_token_accuracy", "num_tokens", "eval/loss", "eval/mean_token_accuracy", "episode"):
            if key in x:
                assert abs(x[key] - y[key]) < 1e-5, (key, x[key], y[key])
