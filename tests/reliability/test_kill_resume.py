"""kill -9 at deterministic "random" points (inside generation, the update, and every stage of a save) and at
random times; each time the run resumes from `latest`. The end result equals an uninterrupted run bit for bit, and
no half-written checkpoint is ever chosen."""

import os
import random
import re
import signal
import time

import pytest

from training_wizard.checkpoint import find_checkpoint, is_valid_checkpoint, read_manifest

from reliability_helpers import ITERATIONS, assert_same_run, fork_cli, make_recipe, read_jsonl, run_cli

POINTS_IN_ITERATION = ["generation", "update"]  # fire during iteration s (0-based)
POINTS_AFTER_ITERATION = ["iteration", "save:start", "save:model", "save:optimizer", "save:before-rename",
                          "save:renamed", "save:latest"]  # fire once iteration s is done, before/inside its save
HOOK_KILLS = 12
TIMED_KILLS = 3


def committed_step(output):
    folder = find_checkpoint(output, "latest")
    return -1 if folder is None else read_manifest(folder)["step"]


def test_kill_9_anywhere_then_resume_is_exact(tmp_path, tiny_model_dir, reference_run):
    rng = random.Random(20240611)
    recipe = make_recipe(tmp_path, tiny_model_dir, "killed")
    output = tmp_path / "killed"
    argv = [recipe, "resume_from_checkpoint=latest"]
    kills, lives = [], 0
    # Every hook point at least once (shuffled), then random ones, each a little past the committed step.
    schedule = POINTS_IN_ITERATION + POINTS_AFTER_ITERATION
    rng.shuffle(schedule)
    schedule += [rng.choice(POINTS_IN_ITERATION + POINTS_AFTER_ITERATION) for _ in range(HOOK_KILLS - len(schedule))]
    for point in schedule:
        done = committed_step(output)  # -1: nothing committed yet
        # at most one committed step of progress per kill, so every point stays reachable whatever the timed kills
        # left behind (they reach a machine-dependent step)
        step = min(ITERATIONS - 1, max(done, 0)) if point in POINTS_IN_ITERATION else min(ITERATIONS, max(done, 0) + 1)
        if step < done or (step == done and point not in POINTS_IN_ITERATION):
            continue  # the run is (nearly) over: this point can no longer be reached
        lives += 1
        child = run_cli(argv, tmp_path / "logs" / f"life{lives}", env={"TRAINING_WIZARD_FAULT_INJECT": f"{point}@{step}"})
        assert child.code == -signal.SIGKILL, (point, step, child.code, child.stderr()[-2000:])
        kills.append(f"{point}@{step}")
        chosen = find_checkpoint(output, "latest")
        assert chosen is None or is_valid_checkpoint(chosen)
        new_step = committed_step(output)
        if point == "save:before-rename":  # the staging folder is complete but was never renamed: not chosen
            assert (output / "checkpoints" / f".staging-step-{step}").is_dir() and new_step == done
        if point == "save:renamed" and done >= 0:  # renamed, `latest` not yet moved: the pointer's step wins
            assert (output / "checkpoints" / f"step-{step}").is_dir() and new_step == done
        if point == "save:latest":  # `latest` moved: committed
            assert new_step == step
        assert new_step >= done
    for _ in range(TIMED_KILLS):  # kill -9 from outside at random moments (startup, generation, update, save)
        lives += 1
        child = fork_cli(argv, tmp_path / "logs" / f"life{lives}")
        time.sleep(rng.uniform(0.8, 2.0))
        os.kill(child.pid, signal.SIGKILL)
        code = child.wait()
        assert code in (0, -signal.SIGKILL), child.stderr()[-2000:]
        kills.append("timed" if code else "timed (finished first)")
        chosen = find_checkpoint(output, "latest")
        assert chosen is None or is_valid_checkpoint(chosen)
    lives += 1
    child = run_cli(argv, tmp_path / "logs" / f"life{lives}")
    assert child.code == 0, child.stderr()[-3000:]
    assert_same_run(output, reference_run)
    assert len([k for k in kills if 'finished' not in k]) >= 10, kills
    # Resuming a finished run: nothing left to train, the final model is written again, nothing logged twice.
    child = run_cli(argv, tmp_path / "logs" / "after-end")
    assert child.code == 0, child.stderr()[-3000:]
    assert "resumed from" in child.stdout() and len(read_jsonl(output / "metrics.jsonl")) == ITERATIONS
    assert_same_run(output, reference_run)
    print(f"{len(kills)} kills in {lives} lives: {kills}")


# The producer thread runs 3 iterations ahead (24 completions) and gets the weights every 2 updates; a bound of
# 1 sync. Uninterrupted, the batches of iterations 4, 6, 8 and 10 (0-based) are 2 syncs stale and dropped.
ASYNC = "async_rollouts = true\nmax_staleness = 1\nweight_sync_steps = 2\nmax_inflight_tasks = 24\n"


@pytest.mark.slow  # four CLI lives (about 20 s): in .ci/run's slow part, with the other reliability tests
def test_kill_9_during_async_training_then_resume_loses_no_prompt(tmp_path, tiny_model_dir, reference_run):
    """kill -9 in the update of iteration 5, after iteration 10 (before its save) and in the update of iteration 11
    (0-based), each time with batches sampled ahead. The resumed run completes, trains on the synchronous run's
    prompts in its order, each once, and samples prompts again only where logged: the batches dropped as too
    stale (prompts.jsonl "reissued") and the batches pending at each resumed checkpoint (counted)."""
    recipe = make_recipe(tmp_path, tiny_model_dir, "async", extra=ASYNC)
    output, argv, resumed_at = tmp_path / "async", [recipe, "resume_from_checkpoint=latest"], []
    for life, fault in enumerate(["update@5", "iteration@10", "update@11", None]):
        env = {"TRAINING_WIZARD_FAULT_INJECT": fault} if fault else {}
        child = run_cli(argv, tmp_path / "logs" / f"life{life}", env=env)
        assert child.code == (-signal.SIGKILL if fault else 0), (fault, child.code, child.stderr()[-2000:])
        resumed_at += [int(at) for at in re.findall(r"resumed from .* \(iteration (\d+),", child.stdout())]
    assert resumed_at == [5, 9, 11]  # the checkpoints the kills left
    logged = read_jsonl(output / "prompts.jsonl")
    assert [r["step"] for r in logged] == list(range(1, ITERATIONS + 1))
    assert [r["prompts"] for r in logged] == [r["prompts"] for r in read_jsonl(reference_run / "prompts.jsonl")]
    # after the resumes at 5 and 9 the producer restarts from those weights: iterations 4 and 8 keep their drops
    assert [r["step"] for r in logged if r["reissued"]] == [5, 9]
    last = read_jsonl(output / "metrics.jsonl")[-1]
    assert last["sample/dropped_stale_total"] == 2 * 8
    # 4 prompts per batch: 2 dropped batches, and 3 + 3 + 1 batches pending at the checkpoints of steps 5, 9, 11
    assert last["async/reissued_prompts_total"] == 4 * (2 + 3 + 3 + 1)
