"""The async schedule's keys in a recipe: --dry-run refuses what the run would refuse at its start (the batch plan
derives the schedule's depth), and a key that only the async schedule reads is refused without it."""

import pytest

from tests.smoke.test_start_checks import recipe  # noqa: F401 - the fixture: a GRPO recipe, 2 completions/iteration
from training_wizard.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_dry_run_refuses_max_inflight_tasks_that_is_not_whole_iterations(recipe, capsys):  # noqa: F811
    assert main([str(recipe), "training.async_rollouts=true", "training.max_inflight_tasks=3", "--dry-run"]) == 2
    assert one_error_line(capsys) == (
        f"error: {recipe}: training.max_inflight_tasks: 3 is not a multiple of the 2 completions of one iteration "
        "(batches are sampled ahead whole); use a multiple of 2, or -1 for max_staleness iterations' worth")
    assert not (recipe.parent / "run").exists()
    assert main([str(recipe), "training.async_rollouts=true", "training.max_inflight_tasks=4", "--dry-run"]) == 0


@pytest.mark.parametrize("override, key, shown", [
    ("training.max_staleness=3", "max_staleness", "3"),
    ("training.weight_sync_steps=2", "weight_sync_steps", "2"),
    ("training.max_inflight_tasks=8", "max_inflight_tasks", "8"),
    ('training.async_producer="inline"', "async_producer", '"inline"'),
])
def test_an_async_key_without_async_rollouts_is_refused_by_name(recipe, capsys, override, key, shown):  # noqa: F811
    assert main([str(recipe), override, "--dry-run"]) == 2
    assert one_error_line(capsys) == (
        f"error: {recipe}: training.{key} (command-line override): {shown} takes effect only with async_rollouts = "
        f"true (sampling ahead of the update); set async_rollouts = true, or remove {key}")


def test_an_async_key_at_its_default_without_async_rollouts_passes(recipe):  # noqa: F811
    assert main([str(recipe), "training.max_staleness=1", "training.max_inflight_tasks=-1", "--dry-run"]) == 0
