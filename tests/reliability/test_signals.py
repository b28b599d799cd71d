"""SIGTERM / SIGINT: the run commits a checkpoint at the next safe point and exits 143 / 130; resuming from it
ends bit for bit where the uninterrupted run ends."""

import signal
import subprocess
import sys

from training_wizard.checkpoint import find_checkpoint, read_manifest

from reliability_helpers import assert_same_run, make_recipe, read_jsonl, run_cli, wait_for

CASES = {
    # (fault, expected exit code, step of the checkpoint written on the way out)
    # during generation of iteration 5: stop before its update, save the state it started from (exact)
    "sigterm_in_generation": ("generation@5=term", 143, 5),
    # during the update of iteration 6: the update finishes, the iteration ends, its state is saved
    "sigterm_in_update": ("update@6=term", 143, 7),
    "sigint_in_generation": ("generation@2=int", 130, 2),
}


def test_signals_checkpoint_exit_code_and_exact_resume(tmp_path, tiny_model_dir, reference_run):
    # save_steps = 4: the checkpoint on the way out is written by the stop itself, not by the schedule
    for name, (fault, code, step) in CASES.items():
        recipe = make_recipe(tmp_path / name, tiny_model_dir, "run")
        output = tmp_path / name / "run"
        argv = [recipe, "training.save_steps=4"]
        child = run_cli(argv, tmp_path / "logs" / f"{name}-1", env={"TRAINING_WIZARD_FAULT_INJECT": fault})
        assert child.code == code, (name, child.code, child.stderr()[-2000:])
        assert child.stderr().strip().splitlines()[-1].startswith(
            f"training-wizard: stopped by {'SIGTERM' if code == 143 else 'SIGINT'} at step {step};")
        assert read_manifest(find_checkpoint(output, "latest"))["step"] == step
        assert len(read_jsonl(output / "metrics.jsonl")) == step  # logged iterations == saved iterations
        assert not (output / "model").exists()  # no final model for an interrupted run
        child = run_cli([*argv, "resume_from_checkpoint=latest"], tmp_path / "logs" / f"{name}-2")
        assert child.code == 0, child.stderr()[-3000:]
        assert_same_run(output, reference_run)


def test_external_sigterm_to_the_cli_process(tmp_path, tiny_model_dir):
    """A real `kill -TERM` to `python -m training_wizard` (fresh interpreter, as a scheduler would send it)."""
    recipe = make_recipe(tmp_path, tiny_model_dir, "run", extra="")
    output = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "training_wizard", str(recipe), "training.total_episodes=4000",
                                "training.save_steps=1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    wait_for(lambda: (output / "metrics.jsonl").exists() and len(read_jsonl(output / "metrics.jsonl")) >= 2,
             lambda: process.poll() is not None, "two logged iterations",
             lambda: (process.kill(), process.communicate()[1])[1])
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    step = read_manifest(find_checkpoint(output, "latest"))["step"]
    assert step >= 2 and len(read_jsonl(output / "metrics.jsonl")) == step
    assert err.strip().splitlines()[-1].startswith(f"training-wizard: stopped by SIGTERM at step {step};")


def test_entry_point_leaves_a_stopped_run_without_interpreter_teardown(monkeypatch):
    # After a stop the work is saved; the process must leave with 143 / 130 even if a native thread torch left
    # behind would abort the interpreter's teardown, so the entry point skips it with os._exit.
    import pytest

    from training_wizard import cli

    class Left(Exception):
        pass

    def fake_exit(code):
        raise Left(code)

    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    for code in (143, 130):
        monkeypatch.setattr(cli, "main", lambda argv=None, code=code: code)
        with pytest.raises(Left) as left:
            cli.run([])
        assert left.value.args == (code,)
    for code in (0, 2):  # finished or a user error: the ordinary exit, with its teardown
        monkeypatch.setattr(cli, "main", lambda argv=None, code=code: code)
        with pytest.raises(SystemExit) as ended:
            cli.run([])
        assert ended.value.code == code
