"""Two processes agree on the environment start check: an environment whose reset fails on one process only stops
both processes, each with that one line and exit code 2, before any model loads."""

from __future__ import annotations

from tests.smoke.test_distributed import launch

ENVIRONMENTS = '''import os


class ResetFailsOnRank1:
    def reset(self, prompt=None, **row):
        if os.environ.get("RANK") == "1":
            raise KeyError("answer")
        return None

    def step(self, reply):
        return "ok", 1.0, True
'''


def test_a_reset_failing_on_one_process_stops_both_at_start(tmp_path, tiny_model_dir):
    (tmp_path / "start_envs.py").write_text(ENVIRONMENTS, encoding="utf-8")
    done = launch(tmp_path, tiny_model_dir, "start", 2, algorithm="grpo-episodes", timeout=240,
                  overrides=("environment.factory=start_envs:ResetFailsOnRank1",))
    message = "environment: dataset row 0: start_envs:ResetFailsOnRank1.reset raised KeyError: 'answer'"
    assert done.stderr.count(message) == 2, done.stderr[-3000:]
    assert done.stderr.count("exitcode  : 2") + done.stderr.count("exitcode  : -15") == 2
    assert "training_wizard/" not in done.stderr.split("ChildFailedError")[0]
    assert not (tmp_path / "start").exists()
