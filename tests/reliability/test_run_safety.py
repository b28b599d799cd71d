"""A run never mixes with or destroys another run's output, and a reward that never returns cannot hang a run.

Each refusal is checked as the user meets it (the CLI in a forked child: exit 2, one stderr line) and by hashing
every file of the earlier run before and after: byte for byte unchanged.
"""

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from training_wizard.checkpoint import find_checkpoint, read_manifest

from reliability_helpers import fork_cli, make_recipe, read_jsonl, run_cli, wait_for

SFT = """\
recipe_class = "sft"
output_dir = "{out}"
seed = 3
[model]
pretrained_name = "{model}"
[dataset]
data_files = "{data}"
[training]
per_device_train_batch_size = 2
max_steps = 3
learning_rate = 2e-3
save_steps = 1
save_total_limit = 1
"""

# TRL-form reward functions that hang at step 3 (trainer_state.global_step == 2) while HANG is set; just before
# hanging, each creates the file HANGING names (when set), so a test knows the hang has begun.
HANGING_REWARDS = '''
import asyncio
import os
import time
from pathlib import Path


def starts_hanging(kind, trainer_state):
    if os.environ.get("HANG") != kind or trainer_state.global_step != 2:
        return False
    if os.environ.get("HANGING"):
        Path(os.environ["HANGING"]).touch()
    return True


def length(completions, trainer_state, **kwargs):
    if starts_hanging("sync", trainer_state):
        time.sleep(10**6)
    return [float(len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]


async def never(completions, trainer_state, **kwargs):
    if starts_hanging("async", trainer_state):
        await asyncio.sleep(10**6)
    return [0.0 for _ in completions]
'''


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def one_line_error(child, *fragments: str) -> str:
    lines = child.stderr().strip().splitlines()
    assert child.code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (child.code, child.stderr()[-2000:])
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture()
def finished_sft_run(tmp_path, tiny_model_dir):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Item {i}: ", "completion": "word " * (1 + i % 3)}) + "\n"
                            for i in range(8)))
    recipe = tmp_path / "sft.toml"
    out = tmp_path / "shared"
    recipe.write_text(SFT.format(out=out, model=tiny_model_dir, data=data))
    child = run_cli([recipe], tmp_path / "logs" / "sft")
    assert child.code == 0, child.stderr()[-3000:]
    assert read_manifest(find_checkpoint(out, "latest"))["identity"]["trainer"].endswith("SFTTrainer")
    return out


def test_resuming_another_recipe_class_checkpoint_is_refused_and_changes_nothing(tmp_path, tiny_model_dir,
                                                                                  finished_sft_run):
    before = folder_digest(finished_sft_run)
    for algorithm in ("grpo", "rloo"):
        recipe = make_recipe(tmp_path / algorithm, tiny_model_dir, "run", algorithm=algorithm)
        argv = [recipe, f'output_dir="{finished_sft_run}"', "resume_from_checkpoint=latest",
                "training.save_total_limit=1", "training.total_episodes=8"]
        child = run_cli(argv, tmp_path / "logs" / algorithm)
        one_line_error(child, "resume_from_checkpoint", "step-3", "written by SFTTrainer",
                       f"this run is {algorithm.upper()}Trainer")
        assert folder_digest(finished_sft_run) == before


def test_a_new_run_into_a_used_output_dir_is_refused_unless_overwrite(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path, tiny_model_dir, "run")
    short = ["training.total_episodes=16", "training.num_sample_generations=1"]
    first = run_cli([recipe, *short], tmp_path / "logs" / "first")
    assert first.code == 0, first.stderr()[-3000:]
    output = tmp_path / "run"
    before = folder_digest(output)
    # the same recipe again, and one that would fail at its second iteration: neither may touch the first run
    again = run_cli([recipe, *short], tmp_path / "logs" / "again")
    one_line_error(again, f"'{output}'", "metrics.jsonl", "resume_from_checkpoint", "another output_dir")
    failing = run_cli([recipe, *short, "training.learning_rate=1e30"], tmp_path / "logs" / "failing")
    one_line_error(failing, "holds another run's files")
    assert folder_digest(output) == before
    # a checkpoint of another folder starts a new run: it may not take over a used output_dir either
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"episode": 8}\n')
    elsewhere = run_cli([recipe, *short, f'output_dir="{other}"',
                         f'resume_from_checkpoint="{output / "checkpoints" / "step-1"}"'], tmp_path / "logs" / "other")
    one_line_error(elsewhere, f"'{other}'", "holds another run's files")
    assert (other / "metrics.jsonl").read_text() == '{"episode": 8}\n' and folder_digest(output) == before
    # on the user's word the earlier run's files go first: one run's records, not two
    (output / "notes.txt").write_text("the user's own file")
    replaced = run_cli([recipe, *short, "overwrite_output_dir=true", "training.total_episodes=8"],
                       tmp_path / "logs" / "replaced")
    assert replaced.code == 0, replaced.stderr()[-3000:]
    assert [record["episode"] for record in read_jsonl(output / "metrics.jsonl")] == [8]
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["latest", "step-1"]
    assert (output / "notes.txt").read_text() == "the user's own file"  # not a run's file: never touched


def test_latest_without_a_checkpoint_does_not_restart_over_a_finished_run(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path, tiny_model_dir, "run")
    argv = [recipe, "training.total_episodes=16", "training.save_steps=100"]  # finishes without a checkpoint
    first = run_cli(argv, tmp_path / "logs" / "first")
    assert first.code == 0, first.stderr()[-3000:]
    output = tmp_path / "run"
    before = folder_digest(output)
    child = run_cli([*argv, "resume_from_checkpoint=latest"], tmp_path / "logs" / "latest")
    one_line_error(child, "no checkpoint to resume", "finished run", "model")
    assert folder_digest(output) == before


def test_changed_settings_are_listed_with_the_table_name(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path, tiny_model_dir, "run")
    first = run_cli([recipe, "training.total_episodes=16"], tmp_path / "logs" / "first")
    assert first.code == 0, first.stderr()[-3000:]
    more = run_cli([recipe, "training.total_episodes=24", "training.learning_rate=1e-3",
                    "resume_from_checkpoint=latest"], tmp_path / "logs" / "more")
    assert more.code == 0, more.stderr()[-3000:]
    note = next(line for line in more.stdout().splitlines() if line.startswith("note: the [training] settings"))
    assert "learning_rate 0.002 -> 0.001" in note and "total_episodes 16 -> 24" in note
    assert [record["episode"] for record in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [8, 16, 24]


def hanging_recipe(folder: Path, model_dir: Path, timeout: float) -> Path:
    """The reliability recipe with two TRL-form reward functions, one sync and one async, either of which
    hangs at step 3 when HANG says so; 4 iterations, a checkpoint after each."""
    recipe = make_recipe(folder, model_dir, "run", algorithm="grpo")
    (folder / "hanging_rewards.py").write_text(HANGING_REWARDS)
    text = recipe.read_text().replace(
        '[reward]\nspec_class = "training_wizard.specs.reward.FunctionRewardSpec"\nfunction = "rel_rewards:distinct"',
        '[reward]\nreward_funcs = ["hanging_rewards:length", "hanging_rewards:never"]')
    recipe.write_text(text.replace("total_episodes = 96", "total_episodes = 32")
                      + f"reward_timeout = {timeout}\n")
    return recipe


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hanging_reward_ends_the_run_after_reward_timeout(tmp_path, tiny_model_dir, kind):
    recipe = hanging_recipe(tmp_path, tiny_model_dir, timeout=1.5)
    child = run_cli([recipe], tmp_path / "logs" / "hang", env={"HANG": kind}, timeout=120)  # 120 s: the hang guard
    name = "reward function 'length'" if kind == "sync" else "async reward function(s) 'never'"
    one_line_error(child, name, "training.reward_timeout = 1.5 s", "at step 3")
    assert read_manifest(find_checkpoint(tmp_path / "run", "latest"))["step"] == 2  # the last one, intact


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_while_a_reward_hangs_stops_before_its_timeout_and_resumes(tmp_path, tiny_model_dir, kind):
    recipe = hanging_recipe(tmp_path, tiny_model_dir, timeout=600)
    output, hanging = tmp_path / "run", tmp_path / "hanging"
    child = fork_cli([recipe], tmp_path / "logs" / "hang", env={"HANG": kind, "HANGING": str(hanging)})
    wait_for(hanging.exists, lambda: child.poll() is not None, "step 3's reward began its hang", child.stderr)
    os.kill(child.pid, signal.SIGTERM)
    code = child.wait(timeout=120)  # a run that waited for the reward would still be running at 600 s
    assert code == 143, child.stderr()[-2000:]
    assert child.stderr().strip().splitlines()[-1].startswith("training-wizard: stopped by SIGTERM at step 2;")
    resumed = run_cli([recipe, "resume_from_checkpoint=latest"], tmp_path / "logs" / "resumed")
    assert resumed.code == 0, resumed.stderr()[-3000:]
    assert [record["episode"] for record in read_jsonl(output / "metrics.jsonl")] == [8, 16, 24, 32]
