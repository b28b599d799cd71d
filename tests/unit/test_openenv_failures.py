"""Runs never train on failed episodes silently: an OpenEnv url of another scheme or a server that cannot be reached
stops the start in one line; a run whose episodes keep failing stops before training on them
(max_environment_failures), its checkpoints as they were; the run's summary counts the episodes that failed."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import write_episode_recipe
from training_wizard import GRPOConfig, GRPOTrainer
from training_wizard.errors import UserError
from training_wizard.rollout.environments import EnvironmentFailure
from training_wizard.specs.episode import EpisodeSettings
from training_wizard.testing import build_causal_lm
from training_wizard.tracking.metrics import read_metrics
from training_wizard.tracking.summary import RunSummary, run_summary

STOPS = list(range(40, 300, 2))  # every even id from 40: a reply ends after a few tokens
HERE = "tests.unit.test_openenv_failures"


class Unreachable:
    """A text environment whose server is gone: every reset fails, as the OpenEnv adapter's does then."""

    def reset(self, prompt=None, **columns):
        raise EnvironmentFailure("OpenEnv server http://127.0.0.1:9: reset: the connection failed")

    def step(self, reply):
        raise AssertionError("a failed reset ends the episode at the model's first reply")


class BrokenStep:
    """Resets, then cannot go on at the first step."""

    def reset(self, prompt=None, **columns):
        return "Say something."

    def step(self, reply):
        raise EnvironmentFailure("the server dropped the connection")


class FailsOnOnePrompt:
    """Plays normally, except that the episodes of the prompt holding "3" cannot start."""

    def reset(self, prompt=None, **columns):
        if "3" in str(prompt):
            raise EnvironmentFailure("this episode's server slot is gone")
        return "Go on."

    def step(self, reply):
        return "Thanks.", 1.0, True


class RaisesOnceThenEnds:
    """Its first step raises an ordinary error (a message to the model, the episode goes on); the next ends the
    episode as done: an error, not a failure."""

    def reset(self, prompt=None, **columns):
        self.steps = 0
        return "Say something."

    def step(self, reply):
        self.steps += 1
        if self.steps == 1:
            raise ValueError("that is not a move")
        return None, 1.0, True


def reply_length(prompts, completions, **columns):
    return [len(text) / 10 for text in completions]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_line_error(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    return error


def openenv_tables(url: str) -> str:
    return f"""\
[environment]
factory = "training_wizard.envs.openenv:OpenEnvEnvironment"
protocol = "text"

[environment.factory_kwargs]
url = "{url}"
step_timeout = 2

[reward]
reward_funcs = ["{HERE}:reply_length"]
"""


def environment_tables(environment: str) -> str:
    return f"""\
[environment]
factory = "{HERE}:{environment}"
protocol = "text"

[reward]
reward_funcs = ["{HERE}:reply_length"]
"""


TRAINING = f"response_length = 64\nmax_turns = 2\nstop_token_ids = {STOPS}\nsave_steps = 1\n"


def run(folder, model_dir, tables: str, training: str = "") -> int:
    from training_wizard.cli import main

    prompts = [f"Say something {i}." for i in range(4)]
    return main([str(write_episode_recipe(folder, model_dir, prompts, tables, TRAINING + training))])


# ---------------------------------------------------------------------------------------------- OpenEnv's url
@pytest.mark.parametrize("url", ["ftp://127.0.0.1:21", "http://", "file:///tmp/server"])
def test_a_url_of_another_scheme_is_one_line(url):
    pytest.importorskip("openenv")
    from training_wizard.envs.openenv import OpenEnvEnvironment

    with pytest.raises(UserError) as raised:
        OpenEnvEnvironment(url=url)
    message = str(raised.value)
    assert message.startswith("environment.factory_kwargs.url: expected") and "http://, https://, ws://, wss://" \
        in message and repr(url) in message


def test_an_upper_case_scheme_is_the_lower_case_one():
    """Schemes are case-insensitive (RFC 3986): OpenEnv's client and the /health probe get the lower-case one."""
    from training_wizard.envs.openenv_url import checked_url, http_url, reach_server

    assert checked_url("WS://example.org:8000") == "ws://example.org:8000"
    assert http_url("WSS://example.org") == "https://example.org" and http_url("HTTP://h") == "http://h"
    with health_only_server() as url:
        reach_server(url.replace("http://", "WS://"), timeout=5)  # answered: no error


def test_an_ftp_url_stops_the_run_in_one_line(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("openenv")
    assert run(tmp_path, tiny_model_dir, openenv_tables("ftp://127.0.0.1:21")) == 2
    error = one_line_error(capsys)
    assert "environment.factory_kwargs.url" in error and "'ftp://127.0.0.1:21'" in error and "ws://" in error
    assert not (tmp_path / "out" / "model").exists()


def test_an_unreachable_server_stops_the_start_in_one_line(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("openenv")
    url = f"http://127.0.0.1:{closed_port()}"
    assert run(tmp_path, tiny_model_dir, openenv_tables(url)) == 2
    error = one_line_error(capsys)
    assert "environment.factory_kwargs.url: cannot reach the OpenEnv server at " + url in error
    assert "/health" in error and "start the server or correct the url" in error
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "model").exists()


@contextlib.contextmanager
def health_only_server():
    """An HTTP server answering /health and nothing else (no WebSocket): reached, yet no episode can start."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's hook
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_after_the_first_contact_a_failing_server_fails_episodes_not_the_run():
    pytest.importorskip("openenv")
    from training_wizard.envs.openenv import OpenEnvEnvironment

    with health_only_server() as url:
        environment = OpenEnvEnvironment(url=url, step_timeout=2)  # reached: no error at the start
        with pytest.raises(EnvironmentFailure, match="reset"):
            environment.reset(seed=1)
    later = OpenEnvEnvironment(url=url, step_timeout=2)  # the server is gone now: the episode fails, the run goes on
    with pytest.raises(EnvironmentFailure):
        later.reset(seed=1)


# ---------------------------------------------------------------------------------------------- failed episodes
def test_a_run_whose_episodes_all_fail_stops_before_training_on_them(tiny_model_dir, tmp_path, capsys):
    code = run(tmp_path, tiny_model_dir, environment_tables("BrokenStep"), "environment_failure_iterations = 2\n")
    assert code == 2
    error = one_line_error(capsys)
    out = tmp_path / "out"
    assert ("training.max_environment_failures: more than 50% of the episodes failed in iterations 1-2 "
            "(environment_failure_iterations = 2; the last: 4 of 4)") in error
    assert f"the newest checkpoint is {out / 'checkpoints' / 'step-1'}" in error
    # iteration 1 was trained and saved; iteration 2 stopped before its update: no checkpoint, no final model
    from training_wizard.checkpoint import checkpoint_problem

    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-1"]
    assert checkpoint_problem(out / "checkpoints" / "step-1") is None
    assert not (out / "model").exists()
    records = read_metrics(out)
    assert len(records) == 1 and records[0]["episodes/failed"] == 1.0 and records[0]["episodes/failed_total"] == 4


def make_trainer(tokenizer, tmp_path, environment, **options) -> GRPOTrainer:
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, total_episodes=16, response_length=64,
                    num_sample_generations=0, stop_token_ids=STOPS, max_turns=2, seed=5, learning_rate=1e-2,
                    num_generations=2, save_steps=1)
    rows = [{"prompt": [{"role": "user", "content": f"Say something {i}."}]} for i in range(8)]
    return GRPOTrainer(config=GRPOConfig(**{**settings, **options}), tokenizer=tokenizer,
                       policy=build_causal_lm(tokenizer, seed=1), reward_model=reply_length, train_dataset=rows,
                       environment_factory=environment, episode_settings=EpisodeSettings(protocol="text"))


def test_the_iteration_that_stops_the_run_is_not_trained_on(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, BrokenStep, environment_failure_iterations=3)
    with pytest.raises(UserError, match=r"iterations 1-3 \(environment_failure_iterations = 3"):
        trainer.train()
    assert trainer.state.iteration == 2 and trainer.state.failed_iterations_in_a_row == 3
    saved = load_file(str(tmp_path / "checkpoints" / "step-2" / "model" / "model.safetensors"))
    weights = trainer.unwrapped_policy.state_dict()
    assert all(torch.equal(weights[name], saved[name]) for name in saved)  # the weights of the last update


def test_failures_below_the_share_are_counted_and_the_run_goes_on(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, FailsOnOnePrompt, max_environment_failures=0.5,
                           environment_failure_iterations=1)
    trainer.train()  # at most 2 of an iteration's 4 episodes fail: not more than half
    totals = [record["episodes/failed_total"] for record in read_metrics(tmp_path)]
    assert len(totals) == 4 and totals == sorted(totals) and totals[-1] == 2  # prompt 3's two episodes


def test_max_environment_failures_one_never_stops(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, Unreachable, max_environment_failures=1.0,
                           environment_failure_iterations=1, total_episodes=8)
    trainer.train()
    assert [record["episodes/failed_total"] for record in read_metrics(tmp_path)] == [4, 8]


def test_a_step_that_raised_and_an_episode_that_ended_as_done_is_not_a_failure(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, RaisesOnceThenEnds, max_environment_failures=0.0,
                           environment_failure_iterations=1, total_episodes=8)
    trainer.train()  # would stop at once if an episode with an error that then ended as done counted as failed
    records = read_metrics(tmp_path)
    errors = [record["episodes/environment_errors_mean"] for record in records]
    assert [record["episodes/failed_total"] for record in records] == [0, 0] and min(errors) > 0
    assert max(record["episodes/stopped_by_environment"] for record in records) > 0


# ---------------------------------------------------------------------------------------------- the summary
def test_the_summary_says_how_many_episodes_failed(tiny_model_dir, tmp_path, capsys):
    assert run(tmp_path, tiny_model_dir, environment_tables("FailsOnOnePrompt")) == 0
    summary = run_summary(tmp_path / "out")
    assert summary.failed_episodes == 2 and summary.episodes == 8
    line = ("failed episodes: 2 of 8 (25.0%) ended by an environment that could not reset or go on "
            "(episodes/failed in metrics.jsonl)")
    assert summary.lines()[1] == line and line in capsys.readouterr().out
    report = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<th>failed episodes</th><td>2 of 8 (25.0%) ended by an environment" in report


def test_a_summary_without_failures_says_nothing_of_them(tmp_path):
    summary = RunSummary(output_dir=tmp_path, base_model="m", algorithm="GRPO", episodes=8, iterations=2, window=1)
    assert summary.failure_line() is None and not any("failed" in line for line in summary.lines())
