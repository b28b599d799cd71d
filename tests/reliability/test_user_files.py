"""A user's files in output_dir are never deleted, truncated or appended to; checkpoints that do not verify are
said to exist; --dry-run refuses an output_dir the run would refuse, writing nothing.

prompts.jsonl is both a run file (the prompts each iteration trained on) and the usual name of a prompt dataset:
the runs below point output_dir at the folder that holds the recipe's own data, or at one holding a user's file
of that name, and every byte of the folder must be the same afterwards.
"""

import json
import os
from pathlib import Path

import pytest

from training_wizard.checkpoint import find_checkpoint
from training_wizard.errors import UserError
from training_wizard.run_folder import (
    claim_new_run, refuse_used_folder, user_files, write_run_identity, written_by_a_run,
)

from reliability_helpers import make_recipe, run_cli
from test_run_safety import folder_digest, one_line_error

MODES = {"new run": [], "overwrite_output_dir": ["overwrite_output_dir=true"],
         "resume latest": ["resume_from_checkpoint=latest"]}
PROMPT_ROWS = "".join(json.dumps({"prompt": f"Tell me about item {i}."}) + "\n" for i in range(6))


@pytest.mark.parametrize("mode", MODES)
def test_output_dir_at_the_data_folder_changes_no_byte(tmp_path, tiny_model_dir, mode):
    data = tmp_path / "data"
    recipe = make_recipe(data, tiny_model_dir, "run")  # data/prompts.jsonl is the recipe's dataset
    before = folder_digest(data)
    child = run_cli([recipe, f'output_dir="{data}"', *MODES[mode]], tmp_path / "logs" / "run")
    one_line_error(child, "dataset.data_files", f"'{data / 'prompts.jsonl'}' is inside output_dir '{data}'")
    assert folder_digest(data) == before


@pytest.mark.parametrize("mode", MODES)
def test_a_users_file_named_like_a_run_file_stops_the_run_and_is_kept(tmp_path, tiny_model_dir, mode):
    recipe = make_recipe(tmp_path / "data", tiny_model_dir, "run")
    output = tmp_path / "out"
    output.mkdir()
    (output / "prompts.jsonl").write_text(PROMPT_ROWS)  # a dataset kept here, not the recipe's
    (output / "notes.txt").write_text("the user's own file")
    before = folder_digest(output)
    child = run_cli([recipe, f'output_dir="{output}"', *MODES[mode]], tmp_path / "logs" / "run")
    line = one_line_error(child, f"'{output}' holds prompts.jsonl, which no run wrote", "overwrite or append")
    assert "another run's files" not in line
    assert folder_digest(output) == before


def test_the_python_trainer_keeps_a_users_file_with_overwrite_output_dir(tokenizer, tmp_path):
    from tests.helpers import make_rloo_trainer, prompts

    (tmp_path / "prompts.jsonl").write_text(PROMPT_ROWS)
    trainer = make_rloo_trainer(tokenizer, tmp_path, dataset=prompts(4, "Item {i}."), rloo_k=2, total_episodes=8,
                                per_device_train_batch_size=4, response_length=3, overwrite_output_dir=True)
    with pytest.raises(UserError, match="holds prompts.jsonl, which no run wrote"):
        trainer.train()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl"]
    assert (tmp_path / "prompts.jsonl").read_text() == PROMPT_ROWS


def test_which_files_a_run_wrote(tmp_path):
    records = "".join(json.dumps({"step": s, "prompts": [s], "reissued": False}) + "\n" for s in (1, 2))
    # no run.json: content alone shows a run's logs; a dataset, a model folder, an empty file show nothing
    (tmp_path / "prompts.jsonl").write_text(PROMPT_ROWS)
    (tmp_path / "metrics.jsonl").write_text('{"episode": 8}\n{"episode": 16')  # a torn last line
    (tmp_path / "model").mkdir()
    (tmp_path / "samples.jsonl").write_text("")
    assert written_by_a_run(tmp_path) == ["metrics.jsonl"]
    assert user_files(tmp_path) == ["samples.jsonl", "prompts.jsonl", "model"]
    # an older run's run.json (no list of files) vouches for the names it knew; prompts.jsonl needs its content
    (tmp_path / "run.json").write_text(json.dumps({"trainer": "training_wizard.trainers.algorithms.rloo.RLOOTrainer"}))
    assert user_files(tmp_path) == ["prompts.jsonl"]
    (tmp_path / "prompts.jsonl").write_text(records)
    assert user_files(tmp_path) == [] and "prompts.jsonl" in written_by_a_run(tmp_path)
    (tmp_path / "trainer_state.json").write_text("{}")  # a name older runs never wrote: the user's
    assert user_files(tmp_path) == ["trainer_state.json"]
    # a run.json with its list: only what it lists
    write_run_identity(tmp_path, {"trainer": "x", "models": {}})
    assert written_by_a_run(tmp_path) == ["run.json", "metrics.jsonl", "samples.jsonl", "prompts.jsonl", "model",
                                          "trainer_state.json"]


def test_overwrite_deletes_only_what_a_run_wrote(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"episode": 8}\n')
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    assert claim_new_run(tmp_path, overwrite=True) == ["metrics.jsonl", "checkpoints"]
    (tmp_path / "model").mkdir()  # no run.json: a user's model folder, not a run's final model
    with pytest.raises(UserError, match=r"holds model, which no run wrote"):
        claim_new_run(tmp_path, overwrite=True)
    with pytest.raises(UserError, match=r"holds model, which no run wrote"):
        refuse_used_folder(tmp_path)
    assert (tmp_path / "model").is_dir()


def _fake_checkpoint(root: Path, step: int) -> None:
    folder = root / f"step-{step}"
    (folder / "model").mkdir(parents=True)
    names = ("model/model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.pt")
    for name in names:
        (folder / name).write_bytes(b"cut short")
    files = {name: {"size": 1000, "sha256": "0" * 64} for name in names}
    (folder / "manifest.json").write_text(json.dumps({"step": step, "files": files}))


def test_latest_says_how_many_checkpoints_exist_when_none_verifies(tmp_path):
    root = tmp_path / "checkpoints"
    for step in range(1, 9):
        _fake_checkpoint(root, step)
    (root / "latest").write_text("step-8")
    with pytest.raises(UserError) as failure:
        find_checkpoint(tmp_path, "latest")
    message = str(failure.value)
    assert "holds 8 checkpoints and none verifies" in message and "the newest, step-8:" in message
    assert "differs from the size or sha256" in message and "no checkpoint" not in message
    assert find_checkpoint(tmp_path / "fresh", "latest") is None  # nothing committed yet: a fresh start


def _dry_run_and_run(recipe: Path, output_dir: Path, logs: Path) -> tuple[str, str]:
    dry = run_cli([recipe, f'output_dir="{output_dir}"', "--dry-run"], logs / "dry")
    real = run_cli([recipe, f'output_dir="{output_dir}"'], logs / "real")
    return one_line_error(dry, "output_dir", f"'{output_dir}'"), one_line_error(real, "output_dir")


def test_dry_run_refuses_an_output_dir_that_is_a_file_writing_nothing(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path / "data", tiny_model_dir, "run")
    target = tmp_path / "taken"
    target.write_text("a file")
    dry, real = _dry_run_and_run(recipe, target, tmp_path / "logs" / "file")
    assert dry == real and "(it is a file)" in dry
    under = target / "run"
    dry, real = _dry_run_and_run(recipe, under, tmp_path / "logs" / "under")
    assert dry == real and f"('{target}' is a file)" in dry
    assert target.read_text() == "a file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_dry_run_refuses_an_unwritable_output_dir_writing_nothing(tmp_path, tiny_model_dir):
    recipe = make_recipe(tmp_path / "data", tiny_model_dir, "run")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        dry, real = _dry_run_and_run(recipe, locked / "run", tmp_path / "logs" / "locked")
        assert dry == real and "permission denied" in dry and list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)
