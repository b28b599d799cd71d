"""RemoteRewardSpec against a local HTTP server: both protocols, retries, timeouts and unreachable servers."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training_wizard.errors import UserError
from training_wizard.specs.remote_reward import RemoteRewardSpec, first_number


class RewardServer:
    """Paths: /score (json: reward = len(completion) + bonus column), /flaky (HTTP 500 on the first request, then
    as /score), /cut (the first reply cut off mid-body, then as /score), /strict (HTTP 400 for a body that is not
    strict JSON, NaN included; a null bonus counts 0), /short (one reward too few), /hang (answers only once the server closes),
    /v1/chat/completions (a chat model whose reply is 'Score: <len(completion)>/10', or 'no idea' when the prompt
    says 'unsure')."""

    def __init__(self):
        self.requests: list[tuple[str, dict, str | None]] = []
        self.closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                server.requests.append((self.path, body, self.headers.get("Authorization")))
                if self.path == "/strict" and b"NaN" in raw:
                    self.send_response(400)
                    self.end_headers()
                    return
                if self.path == "/cut" and len(server.requests) == 1:
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b'{"rew')  # and the connection closes: the client reads too few bytes
                    return
                if self.path == "/hang":
                    server.closing.wait(600)
                    return  # the client gave up long ago: writing to its closed socket would only print noise
                if self.path == "/flaky" and len(server.requests) == 1:
                    self.send_response(500)
                    self.end_headers()
                    return
                if self.path == "/v1/chat/completions":
                    text = body["messages"][0]["content"]
                    completion = text.split("Response: ", 1)[1]
                    answer = "no idea" if "unsure" in text else f"Score: {len(completion)}/10"
                    reply = {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                else:
                    rewards = [len(c) + (b or 0) for c, b in zip(body["completions"], body["bonus"])]
                    reply = {"rewards": rewards[:-1] if self.path == "/short" else rewards}
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(reply).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.closing.set()  # /hang's handlers end, so their threads do not outlive the test
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    running = RewardServer()
    yield running
    running.close()


def remote(url, **options):
    return RemoteRewardSpec(**{"url": url, "timeout": 0.3, "max_retries": 1, "backoff": 0.01, **options})


def test_json_protocol_scores_in_batches(server):
    spec = remote(f"{server.url}/score", batch_size=2)
    total, _ = spec.score(["p1", "p2", "p3"], ["abc", "d", ""], {"bonus": [10, 20, 30], "completion_has_eos": [
        True, False, True]}, step=1)
    assert total == [13.0, 21.0, 30.0]
    bodies = sorted((body for _, body, _ in server.requests), key=lambda b: b["prompts"])
    assert [b["prompts"] for b in bodies] == [["p1", "p2"], ["p3"]]
    assert bodies[0] == {"prompts": ["p1", "p2"], "completions": ["abc", "d"], "bonus": [10, 20],
                         "completion_has_eos": [True, False]}


def test_openai_protocol_parses_the_first_number(server, monkeypatch):
    monkeypatch.setenv("TW_TEST_REWARD_KEY", "secret")
    spec = remote(f"{server.url}/v1", protocol="openai", model="judge", api_key_env="TW_TEST_REWARD_KEY",
                  template="Prompt: {prompt} ({topic}) Response: {completion}")
    total, _ = spec.score(["p", "q"], ["abcd", "xy"], {"topic": ["cats", "dogs"]})
    assert total == [4.0, 2.0]
    path, body, auth = server.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge" and auth == "Bearer secret"
    assert {b["messages"][0]["content"] for _, b, _ in server.requests} == {
        "Prompt: p (cats) Response: abcd", "Prompt: q (dogs) Response: xy"}


@pytest.mark.parametrize("text, expected", [("7", 7.0), ("Score: 7.5/10", 7.5), ("-2", -2.0), ("1e-1", 0.1),
                                            ("none", None)])
def test_first_number(text, expected):
    assert first_number({"choices": [{"message": {"content": text}}]}) == expected
    assert first_number({"error": "x"}) is None


def test_a_500_is_retried(server):
    assert remote(f"{server.url}/flaky").score(["p"], ["ab"], {"bonus": [1]})[0] == [3.0]
    assert len(server.requests) == 2


def test_a_reply_cut_off_is_retried(server):
    assert remote(f"{server.url}/cut").score(["p"], ["ab"], {"bonus": [1]})[0] == [3.0]
    assert len(server.requests) == 2


def test_missing_values_travel_as_null(server):
    """A column with a missing value (NaN once loaded) is sent as strict JSON: null, not NaN."""
    total, _ = remote(f"{server.url}/strict").score(["p", "q"], ["ab", "c"], {"bonus": [float("nan"), 2.0]})
    assert total == [2.0, 3.0] and server.requests[0][1]["bonus"] == [None, 2.0]


def one_line_error(spec, prompts, completions, columns) -> str:
    with pytest.raises(UserError) as caught:
        spec.score(prompts, completions, columns, step=2)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_server_that_never_answers_times_out(server):
    # /hang answers only after the test: the message can only come from the client's own timeouts, both tries
    message = one_line_error(remote(f"{server.url}/hang"), ["p"], ["a"], {"bonus": [0]})
    assert f"reward {server.url}/hang (rows 0-0): no usable answer after 2 tries (last: " in message
    assert "timed out" in message


def test_an_unreachable_port_is_one_line():
    with socket.socket() as probe:  # a port nothing listens on once this socket closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    message = one_line_error(remote(f"http://127.0.0.1:{port}/score"), ["p"], ["a"], {"bonus": [0]})
    assert message.startswith(f"reward RemoteRewardSpec at step 2: reward http://127.0.0.1:{port}/score (rows 0-0): "
                              "no usable answer after 2 tries (last: URLError: ")
    assert "refused" in message.lower()


def test_unusable_replies_name_what_was_wrong(server):
    message = one_line_error(remote(f"{server.url}/short"), ["p", "q"], ["a", "b"], {"bonus": [0, 0]})
    assert 'no usable answer after 2 tries (last: a reply without "rewards": a list of 2 numbers)' in message
    message = one_line_error(remote(f"{server.url}/v1", protocol="openai", model="m",
                                    template="unsure Response: {completion}"), ["p", "q"], ["a", "b"], {})
    assert "/v1/chat/completions (row " in message and "(last: a reply with no number in it)" in message


def test_configuration_errors():
    with pytest.raises(Exception, match="model: protocol 'openai' needs the model name"):
        RemoteRewardSpec(url="http://x", protocol="openai")
    with pytest.raises(Exception, match="url: expected an http"):
        RemoteRewardSpec(url="localhost:8000")
    with pytest.raises(Exception, match="url: the port of 'http://x:abc/score' is not a number"):
        RemoteRewardSpec(url="http://x:abc/score")
    spec = RemoteRewardSpec(url="http://x", api_key_env="TW_TEST_SURELY_UNSET")
    with pytest.raises(UserError, match="environment variable TW_TEST_SURELY_UNSET is not set"):
        spec.score(["p"], ["a"], {})
    message = one_line_error(RemoteRewardSpec(url="http://x", protocol="openai", model="m", template="{missing}"),
                             ["p"], ["a"], {})
    assert "reward.template: cannot fill row 0 (KeyError: 'missing')" in message
