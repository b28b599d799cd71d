"""SFT and reward-model runs on the shared lifecycle: kill -9 (inside a step and inside a save) then resume, and
SIGTERM (exit 143) then resume, end bit for bit where the uninterrupted run ends."""

import json
import signal

import pytest

from reliability_helpers import assert_bitwise_equal, checkpoint_payload, final_weights, read_jsonl, run_cli

STEPS = 8
SFT = """\
recipe_class = "sft"
output_dir = "{out}"
seed = 3
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
hold_out = 4
[training]
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
max_steps = 8
learning_rate = 2e-3
warmup_steps = 2
packing = true
max_length = 96
eval_steps = 3
save_steps = 1
"""
REWARD = """\
recipe_class = "reward_model"
output_dir = "{out}"
seed = 3
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
hold_out = 4
[training]
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
max_steps = 8
learning_rate = 2e-3
eval_steps = 3
save_steps = 1
center_rewards_coefficient = 0.1
"""


def write_run(folder, model, kind):
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "rows.jsonl"
    if kind == "sft":
        rows = [{"prompt": f"Item {i}: ", "completion": "word " * (1 + i % 4)} for i in range(14)]
    else:
        rows = [{"prompt": f"Item {i}: ", "chosen": "sun " * (1 + i % 3), "rejected": "dog", "margin": i % 2}
                for i in range(14)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = folder / "recipe.toml"
    recipe.write_text((SFT if kind == "sft" else REWARD).format(out=folder / "out", model=model, data=data))
    return recipe, folder / "out"


def assert_same(run, reference):
    assert_bitwise_equal(final_weights(run), final_weights(reference), "final model")
    last = f"step-{STEPS}"
    assert_bitwise_equal(checkpoint_payload(run / "checkpoints" / last),
                         checkpoint_payload(reference / "checkpoints" / last), last)
    ours, theirs = read_jsonl(run / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    assert len(ours) == len(theirs) == STEPS + 3  # every step once, evaluations at steps 3, 6 and 8
    for a, b in zip(ours, theirs):
        assert {k: v for k, v in a.items() if k != "eps"} == {k: v for k, v in b.items() if k != "eps"}


@pytest.mark.parametrize("kind", ["sft", pytest.param("reward_model", marks=pytest.mark.slow)])
def test_kill_9_and_sigterm_then_resume_are_exact(tmp_path, tiny_model_dir, kind):
    recipe, reference = write_run(tmp_path / "reference", tiny_model_dir, kind)
    child = run_cli([recipe], tmp_path / "logs" / "reference")
    assert child.code == 0, child.stderr()[-3000:]

    recipe, killed = write_run(tmp_path / "killed", tiny_model_dir, kind)
    argv = [recipe, "resume_from_checkpoint=latest"]
    for life, point in enumerate(["update@2", "save:optimizer@4", "iteration@6=term"]):
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env={"TRAINING_WIZARD_FAULT_INJECT": point})
        expected = 143 if point.endswith("term") else -signal.SIGKILL
        assert child.code == expected, (point, child.code, child.stderr()[-3000:])
    assert "stopped by SIGTERM at step 6" in child.stderr()
    child = run_cli(argv, tmp_path / "logs" / "last")
    assert child.code == 0, child.stderr()[-3000:]
    assert "resumed from" in child.stdout()
    assert_same(killed, reference)
