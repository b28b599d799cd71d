"""PPO, GRPO and GRPO on episodes of several turns through the CLI: kill -9 inside generation, the update and a
save, each followed by a resume from `latest`, ends bit for bit where an uninterrupted run of the same algorithm
ends (weights, including PPO's value model, Adam state, metrics). RLOO has its own, longer schedule of kills in
test_kill_resume.py. The "-padding_free" variants run every pass over completions packed (training.padding_free)."""

import signal

import pytest

from reliability_helpers import assert_same_run, make_recipe, read_jsonl, run_cli


PADDING_FREE = "-padding_free"


def variant_recipe(folder, model_dir, name: str, variant: str):
    """(`make_recipe`'s recipe of the variant's algorithm, with padding_free where the variant says, the algorithm)."""
    algorithm = variant.removesuffix(PADDING_FREE)
    extra = "padding_free = true\nlogprobs_from_sampling = false\n" if variant.endswith(PADDING_FREE) else ""
    return make_recipe(folder, model_dir, name, extra=extra, algorithm=algorithm), algorithm


@pytest.fixture(scope="module", params=["ppo", "grpo", pytest.param("grpo-episodes", marks=pytest.mark.slow),
                                        pytest.param("ppo" + PADDING_FREE, marks=pytest.mark.slow),
                                        pytest.param("grpo-episodes" + PADDING_FREE, marks=pytest.mark.slow)])
def algorithm_reference(request, tmp_path_factory, tiny_model_dir):
    """(variant, the uninterrupted run's folder)."""
    variant = request.param
    folder = tmp_path_factory.mktemp(f"{variant}-reference")
    recipe, _ = variant_recipe(folder, tiny_model_dir, "reference", variant)
    child = run_cli([recipe], folder / "logs" / "reference")
    assert child.code == 0, child.stderr()[-3000:]
    return variant, folder / "reference"


def test_kill_9_then_resume_is_exact(tmp_path, tiny_model_dir, algorithm_reference):
    variant, reference = algorithm_reference
    recipe, algorithm = variant_recipe(tmp_path, tiny_model_dir, "killed", variant)
    argv = [recipe, "resume_from_checkpoint=latest"]
    for life, point in enumerate(["generation@1", "update@3", "save:model@6", "save:latest@9"]):
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env={"TRAINING_WIZARD_FAULT_INJECT": point})
        assert child.code == -signal.SIGKILL, (point, child.code, child.stderr()[-2000:])
    child = run_cli(argv, tmp_path / "logs" / "last")
    assert child.code == 0, child.stderr()[-3000:]
    assert_same_run(tmp_path / "killed", reference)
    if algorithm == "grpo-episodes":  # the environment answered: episodes of more than one reply were resumed
        assert min(m["episodes/replies_mean"] for m in read_jsonl(reference / "metrics.jsonl")) > 1.2
