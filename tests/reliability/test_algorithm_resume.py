"""PPO through the CLI: kill -9 inside generation, the update and a save, each followed by a resume from `latest`,
ends bit for bit where an uninterrupted PPO run ends (policy, value model, Adam state of both, metrics)."""

import signal

import pytest

from reliability_helpers import assert_same_run, make_recipe, run_cli


@pytest.fixture(scope="module")
def ppo_reference(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("ppo-reference")
    recipe = make_recipe(folder, tiny_model_dir, "reference", algorithm="ppo")
    child = run_cli([recipe], folder / "logs" / "reference")
    assert child.code == 0, child.stderr()[-3000:]
    return folder / "reference"


def test_ppo_kill_9_then_resume_is_exact(tmp_path, tiny_model_dir, ppo_reference):
    recipe = make_recipe(tmp_path, tiny_model_dir, "killed", algorithm="ppo")
    argv = [recipe, "resume_from_checkpoint=latest"]
    for life, point in enumerate(["generation@1", "update@3", "save:model@6", "save:latest@9"]):
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env={"TRAINING_WIZARD_FAULT_INJECT": point})
        assert child.code == -signal.SIGKILL, (point, child.code, child.stderr()[-2000:])
    child = run_cli(argv, tmp_path / "logs" / "last")
    assert child.code == 0, child.stderr()[-3000:]
    assert_same_run(tmp_path / "killed", ppo_reference)
