"""A new run that stops with a user error before it trained anything removes the files it wrote; one that trained
an iteration keeps them, logged or not; a deletion that fails leaves files that still read as a run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from training_wizard.errors import UserError
from training_wizard.run_folder import user_files, written_by_a_run

from tests.helpers import distinct, make_rloo_trainer


def _reward_failing_at(iteration: int):
    calls = []

    def reward(prompts, completions, **columns):
        calls.append(1)
        if len(calls) == iteration:
            raise UserError("reward: the scoring server answered 503")
        return distinct(prompts, completions)

    return reward


def _run(tokenizer, out, fail_at: int, **options):
    trainer = make_rloo_trainer(tokenizer, out, reward=_reward_failing_at(fail_at), total_episodes=8 * 3,
                                **options)
    trainer.lifecycle.open(None, print)
    (out / "resolved_config.toml").write_text("# the recipe writes it after the lifecycle's open\n")
    with pytest.raises(UserError, match="503"):
        with trainer.lifecycle.undone_if_it_stops_before_training():
            trainer.train()
    return trainer


def test_a_trained_but_unlogged_iteration_keeps_the_run_files(tokenizer, tmp_path):
    trainer = _run(tokenizer, tmp_path, fail_at=2, logging_steps=5)
    assert trainer.state.iteration == 1
    metrics = tmp_path / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()  # nothing logged yet
    assert (tmp_path / "run.json").is_file() and "run.json" in written_by_a_run(tmp_path)


def test_a_run_that_trained_nothing_removes_its_files(tokenizer, tmp_path):
    _run(tokenizer, tmp_path, fail_at=1, logging_steps=5)
    assert written_by_a_run(tmp_path) == [] and not (tmp_path / "run.json").exists()
    assert not (tmp_path / "resolved_config.toml").exists()


def test_a_failed_deletion_leaves_run_json_and_the_run_error(tokenizer, tmp_path, monkeypatch):
    real_unlink = Path.unlink

    def unlink(path, *args, **kwargs):
        if path.name == "resolved_config.toml":
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    _run(tokenizer, tmp_path, fail_at=1)
    assert (tmp_path / "run.json").is_file() and user_files(tmp_path) == []
