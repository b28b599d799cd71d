"""The OpenEnv adapter: the same episode in this process and behind a server, and every way a server can fail
(killed, slow, garbage, a dropped connection, an error it reports) ending the episode promptly, counted, while the
run goes on."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("openenv")

from openenv.core import Action, Environment, Observation, State, create_app  # noqa: E402

from training_wizard.envs import openenv as adapter  # noqa: E402
from training_wizard.envs.openenv import OpenEnvEnvironment, observation_text, text_field  # noqa: E402
from training_wizard.errors import UserError  # noqa: E402
from training_wizard.rollout.environments import EnvironmentFailure  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORDS = ["fault", "apple", "river", "candle"]  # the word a seed picks; "fault" breaks the environment's step
ROUNDS = 2  # steps per episode
HERE = "tests.unit.test_openenv"


class SayAction(Action):
    message: str


class SayObservation(Observation):
    prompt: str = ""
    rounds_left: int = 0


class SayTheWord(Environment[SayAction, SayObservation, State]):
    """Asks for the word the reset seed picks, ROUNDS times; reward 1 for a reply that says it. The word "fault"
    makes step raise, as a broken environment would."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.word, self.progress = "", State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> SayObservation:
        self.word, self.progress = WORDS[(seed or 0) % len(WORDS)], State(episode_id=episode_id, step_count=0)
        return SayObservation(prompt=f"Say the word '{self.word}'.", rounds_left=ROUNDS)

    def step(self, action: SayAction, timeout_s: Optional[float] = None, **kwargs: Any) -> SayObservation:
        if self.word == "fault":
            raise RuntimeError("the word machine broke")
        self.progress.step_count += 1
        said = self.word in action.message.lower()
        verdict = "You said it" if said else f"You did not say '{self.word}'"
        left = ROUNDS - self.progress.step_count
        return SayObservation(prompt=f"{verdict}. Again.", rounds_left=left, reward=float(said), done=left == 0)

    @property
    def state(self) -> State:
        return self.progress


# Held while a test needs a server that does not answer: its step blocks until the test lets go (or 120 s pass),
# so a step that ends in time can only have ended by its own timeout, however busy the machine is.
UNANSWERED = threading.Event()
# Deadlines the code under test never reaches when it works: they bound a wait only when something is broken.
GENEROUS_S = 60


class Sluggish(SayTheWord):
    def step(self, action: SayAction, timeout_s: Optional[float] = None, **kwargs: Any) -> SayObservation:
        UNANSWERED.wait(120)
        return super().step(action)


def word_app(environment=SayTheWord):
    return create_app(environment, SayAction, SayObservation, max_concurrent_envs=64)


def said(reply: str) -> dict[str, str]:
    """An action function, as a recipe would name one; a reply it cannot read raises."""
    if not reply.strip():
        raise ValueError("say a word")
    return {"message": reply}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen | None = None, seconds: float = GENEROUS_S) -> None:
    """Polls the server's health until it answers: a server starting on a busy machine takes its time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process is None or process.poll() is None, "the server exited"
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


@contextlib.contextmanager
def served(environment=SayTheWord):
    """OpenEnv's own server for `environment` in a thread, on a free port of 127.0.0.1."""
    import uvicorn

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listening.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(word_app(environment), log_level="error", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    try:
        wait_until_up(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        listening.close()


@pytest.fixture(scope="module")
def healthy_url():
    with served() as url:
        yield url


def play(environment: OpenEnvEnvironment, seed: int, replies: list[str]) -> list[Any]:
    """The episode as the text protocol sees it: the reset text, then (observation, reward, done) per reply."""
    transcript: list[Any] = [environment.reset(prompt="Play.", seed=seed)]
    for reply in replies:
        transcript.append(environment.step(reply))
        if transcript[-1][2]:
            break
    return transcript


def test_in_process_and_served_episodes_are_the_same(healthy_url):
    in_process = functools.partial(OpenEnvEnvironment, environment=f"{HERE}:SayTheWord")
    remote = functools.partial(OpenEnvEnvironment, url=healthy_url)
    for seed, replies in ((1, ["Apple!", "a pear"]), (6, ["river", "RIVER", "never asked"])):
        here, there = play(in_process(), seed, replies), play(remote(), seed, replies)
        assert here == there
    assert play(in_process(), 5, ["apple", "no"]) == [
        "Say the word 'apple'.", ("You said it. Again.", 1.0, False), ("You did not say 'apple'. Again.", 0.0, True)]


def test_a_server_error_ends_the_episode_in_both_modes(healthy_url):
    for environment in (OpenEnvEnvironment(environment=f"{HERE}:SayTheWord"), OpenEnvEnvironment(url=healthy_url)):
        assert environment.reset(seed=4) == "Say the word 'fault'."
        with pytest.raises(EnvironmentFailure, match="the word machine broke"):
            environment.step("fault")


def test_a_server_killed_mid_episode_ends_it_promptly(healthy_url):
    port = free_port()
    serve = f"import uvicorn; from {HERE} import word_app; uvicorn.run(word_app(), port={port}, log_level='error')"
    process = subprocess.Popen([sys.executable, "-c", serve], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process)
        environment = OpenEnvEnvironment(url=url, step_timeout=GENEROUS_S)
        assert environment.reset(seed=1) == "Say the word 'apple'."
        assert environment.step("apple") == ("You said it. Again.", 1.0, False)
        process.kill()
        process.wait(GENEROUS_S)
        # promptly: the dropped connection ends the step, not its timeout ("no answer within step_timeout")
        with pytest.raises(EnvironmentFailure, match=f"OpenEnv server {url}: step: the connection failed or dropped"):
            environment.step("apple")
    finally:
        process.kill()
    assert play(OpenEnvEnvironment(url=healthy_url), 1, ["apple", "apple"])[-1] == ("You said it. Again.", 1.0, True)


def test_a_slow_server_ends_the_episode_at_step_timeout(healthy_url):
    UNANSWERED.clear()
    try:
        with served(Sluggish) as url:
            # the reset shares this timeout: 2 s leaves it room on a busy machine
            environment = OpenEnvEnvironment(url=url, step_timeout=2)
            environment.reset(seed=2)
            with pytest.raises(EnvironmentFailure, match=r"no answer within step_timeout \(2 s\)"):
                environment.step("river")
            with pytest.raises(EnvironmentFailure):  # the episode cannot go on
                environment.step("river")
            UNANSWERED.set()  # the server's blocked step returns, so the server can shut down
    finally:
        UNANSWERED.set()
    assert play(OpenEnvEnvironment(url=healthy_url), 2, ["river", "x"])[1] == ("You said it. Again.", 1.0, False)


HUNG_UP = threading.Event()  # set once odd_server(None) has closed its connection after reset


@contextlib.contextmanager
def odd_server(step_answer: str | None):
    """A WebSocket server that answers reset as OpenEnv does, then `step_answer` to a step; None: it hangs up
    after reset, and a new connection's step gets a valid observation (a fresh session, never reset)."""
    from websockets.sync.server import serve

    def handler(connection):
        for message in connection:
            kind = json.loads(message).get("type")
            if kind == "reset":
                connection.send(json.dumps({"type": "observation", "data": {
                    "observation": {"prompt": "Say 'x'."}, "reward": None, "done": False}}))
                if step_answer is None:
                    connection.close()
                    HUNG_UP.set()
                    return
            elif kind == "step":
                connection.send(step_answer or json.dumps({"type": "observation", "data": {
                    "observation": {"prompt": "A fresh session."}, "reward": 1.0, "done": False}}))

    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        server.shutdown()


@pytest.mark.parametrize("step_answer,reason", [
    ("not json at all", "not JSON"),
    (json.dumps({"type": "observation", "data": {"reward": 1.0}}), "expected an observation object"),
    (json.dumps({"type": "observation", "data": {"observation": {}, "done": "maybe"}}), "'done' is 'maybe'"),
    (json.dumps({"type": "observation", "data": {"observation": {}, "done": False, "reward": "lots"}}), "'reward'"),
    (None, "dropped"),
], ids=["not-json", "no-observation", "bad-done", "bad-reward", "hung-up"])
def test_garbage_or_a_dropped_connection_ends_the_episode(step_answer, reason, healthy_url):
    with odd_server(step_answer) as url:
        environment = OpenEnvEnvironment(url=url, action=f"{HERE}:said", step_timeout=GENEROUS_S)
        HUNG_UP.clear()
        assert environment.reset(seed=1) == "Say 'x'."
        assert step_answer is not None or HUNG_UP.wait(GENEROUS_S)  # the hang-up happened before the step
        with pytest.raises(EnvironmentFailure, match=reason):  # the answer ends the step, not its timeout
            environment.step("x")
    assert play(OpenEnvEnvironment(url=healthy_url), 3, ["candle", "x"])[1][1] == 1.0


def test_a_server_gone_after_the_first_contact_fails_reset_then_step():
    """Once reached (an unreachable server at the first contact stops the start: test_openenv_failures.py), a
    server that is gone fails episodes. The refused connection ends each call, not the timeout, which only bounds
    how long a failed reset is remembered."""
    with served() as url:
        environment = OpenEnvEnvironment(url=url, step_timeout=GENEROUS_S)
    with pytest.raises(EnvironmentFailure, match="the connection failed"):
        environment.reset(seed=1)
    with pytest.raises(EnvironmentFailure, match="the connection failed"):  # the model's one reply ends it
        environment.step("hello")
    with pytest.raises(EnvironmentFailure, match="a reset just before this one could not reach it"):  # not tried again
        OpenEnvEnvironment(url=url, step_timeout=GENEROUS_S).reset(seed=1)


def test_episodes_leave_no_thread_behind(healthy_url):
    finished, abandoned = OpenEnvEnvironment(url=healthy_url), OpenEnvEnvironment(url=healthy_url)
    play(finished, 1, ["a", "b"])  # done: closed at once
    abandoned.reset(seed=1)
    abandoned.step("a")  # left mid-episode (a turn limit): closed when the run lets go of it
    threads = [finished.thread.thread, abandoned.thread.thread]
    del finished, abandoned
    gc.collect()
    for thread in threads:
        thread.join(GENEROUS_S)
    assert not any(thread.is_alive() for thread in threads)


def test_the_default_text_and_action_field():
    assert observation_text({"prompt": "Hi.", "rounds_left": 2, "metadata": {"a": 1}, "done": False}) == "Hi."
    assert json.loads(observation_text({"board": "x.o", "hint": "row 2", "metadata": {}})) == {
        "board": "x.o", "hint": "row 2"}
    assert text_field(SayAction.model_json_schema(), "here") == "message"
    optional = {"properties": {"code": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "n": {"type": "integer"}}}
    assert text_field(optional, "here") == "code"
    with pytest.raises(UserError, match="action = 'package.module:function'"):
        text_field({"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}, "here")


def test_user_functions_and_columns():
    environment = OpenEnvEnvironment(environment=f"{HERE}:SayTheWord", action=f"{HERE}:said",
                                     observation=f"{HERE}:rounds", seed_column="level")
    assert environment.reset(prompt="Play.", level=3) == "2 rounds left"
    with pytest.raises(ValueError, match="say a word"):  # not a failure: the model reads it, the episode goes on
        environment.step(" ")
    assert environment.step("candle") == ("1 rounds left", 1.0, False)
    with pytest.raises(UserError, match="reset_columns: the dataset has no column 'split'"):
        OpenEnvEnvironment(environment=f"{HERE}:SayTheWord", reset_columns=["split"]).reset(prompt="Play.")


def rounds(fields: dict[str, Any]) -> str:
    return f"{fields['rounds_left']} rounds left"


def test_a_mistaken_configuration_is_one_line():
    with pytest.raises(UserError, match="give exactly one of environment"):
        OpenEnvEnvironment()
    with pytest.raises(UserError, match="give exactly one of environment"):
        OpenEnvEnvironment(environment=f"{HERE}:SayTheWord", url="http://127.0.0.1:1")
    with pytest.raises(UserError, match="step_timeout"):
        OpenEnvEnvironment(url="http://127.0.0.1:1", step_timeout=0)


def test_without_openenv_the_adapter_imports_and_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv", None)  # `import openenv` now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    importlib.reload(adapter)  # its import alone must not need OpenEnv
    with pytest.raises(UserError) as raised:
        OpenEnvEnvironment(url="http://127.0.0.1:1")
    assert "pip install -e '.[envs]'" in str(raised.value) and "\n" not in str(raised.value)


def test_grpo_trains_on_served_episodes_some_of_which_fail(healthy_url, tokenizer, tmp_path):
    from training_wizard import GRPOConfig, GRPOTrainer
    from training_wizard.specs.episode import EpisodeSettings
    from training_wizard.testing import build_causal_lm
    from training_wizard.tracking.metrics import read_metrics

    factory = functools.update_wrapper(functools.partial(OpenEnvEnvironment, url=healthy_url, step_timeout=GENEROUS_S),
                                       OpenEnvEnvironment)
    rows = [{"prompt": [{"role": "user", "content": "Play the word game."}], "seed": seed} for seed in range(4)]
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, total_episodes=8, num_generations=2,
                        response_length=256, num_sample_generations=0, stop_token_ids=list(range(40, 300, 2)),
                        max_turns=3, seed=5, learning_rate=1e-3, beta=0.05)
    trainer = GRPOTrainer(config=config, tokenizer=tokenizer, policy=build_causal_lm(tokenizer, seed=1),
                          reward_model=lambda prompts, completions, **columns: [len(c) / 10 for c in completions],
                          train_dataset=rows, environment_factory=factory,
                          episode_settings=EpisodeSettings(protocol="text"))
    trainer.train()
    records = read_metrics(tmp_path)
    assert len(records) == 1
    # seed 0 picks "fault": both of its 2 episodes (of 8) fail at their first step and end there; every other
    # episode ends when the environment says done (after ROUNDS steps, within max_turns)
    assert records[0]["episodes/environment_errors_mean"] == pytest.approx(2 / 8)
    assert records[0]["episodes/stopped_by_environment"] == pytest.approx(1.0)
