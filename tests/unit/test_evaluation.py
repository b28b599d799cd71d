"""Win rates, confidence intervals and judges (the chat judge against a local HTTP server)."""

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training_wizard.errors import UserError
from training_wizard.evaluation.judges import ChatJudgeSpec, RewardJudgeSpec
from training_wizard.evaluation.winrate import win_rate, wilson
from training_wizard.specs.reward import CallableRewardSpec


def test_win_rate_counts_ties_as_half_and_its_interval_by_hand():
    result = win_rate([1.0] * 70 + [0.0] * 30)
    # mean 0.7; sample sd = sqrt(100 * 0.21 / 99) = 0.460566; half width = 1.959964 * 0.460566 / 10 = 0.090269
    assert result.rate == pytest.approx(0.7)
    assert result.low == pytest.approx(0.7 - 0.0902693, abs=1e-6) and result.high == pytest.approx(0.7 + 0.0902693, abs=1e-6)
    with_ties = win_rate([1.0, 0.5, 0.5, 0.0])
    assert with_ties.rate == 0.5 and (with_ties.wins, with_ties.ties, with_ties.losses) == (1, 2, 1)


def test_all_wins_use_the_wilson_interval():
    result = win_rate([1.0] * 20)
    # Wilson for p = 1, n = 20: centre (1 + z^2/40) / (1 + z^2/20), half z * sqrt(z^2/1600) / (1 + z^2/20)
    z = 1.959963984540054
    centre = (1 + z * z / 40) / (1 + z * z / 20)
    half = z * math.sqrt(z * z / 1600) / (1 + z * z / 20)
    assert result.rate == 1.0 and result.high == pytest.approx(1.0) and result.low == pytest.approx(centre - half)
    assert wilson(0.5, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)


def test_reward_judge_prefers_the_higher_reward_and_ties_within_tolerance():
    length = CallableRewardSpec(fn=lambda prompts, completions, **k: [float(len(c)) for c in completions])
    judge = RewardJudgeSpec(reward=length, tie_tolerance=0.5)
    outcomes = judge.judge(["p"] * 3, ["long answer", "ab", "same"], ["short", "abcd", "size"], {})
    assert outcomes == [1.0, 0.0, 0.5]
    assert win_rate(outcomes).rate == 0.5


class JudgeServer:
    """A local OpenAI-compatible endpoint: prefers the longer response, with scripted failures keyed by the
    prompt text: 'fail-once' (HTTP 500 first), 'garbage-once' (malformed JSON first), 'slow-once' (too slow
    first), 'first-always' (always answers 1: pure position bias)."""

    def __init__(self):
        self.seen: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][0]["content"]
                first = text.split("Response 1:\n", 1)[1].split("\n\nResponse 2:", 1)[0]
                second = text.split("Response 2:\n", 1)[1].split("\n\nAnswer", 1)[0]
                count = server.seen[text] = server.seen.get(text, 0) + 1
                if "fail-once" in text and count == 1:
                    self.send_response(500)
                    self.end_headers()
                    return
                if "slow-once" in text and count == 1:
                    time.sleep(0.6)
                answer = "1" if "first-always" in text else ("1" if len(first) >= len(second) else "2")
                payload = b"{not json" if "garbage-once" in text and count == 1 else json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    running = JudgeServer()
    monkeypatch.setenv("TW_TEST_JUDGE_URL", running.url)
    yield running
    running.close()


def chat_judge(**options):
    settings = dict(model="judge", base_url_env="TW_TEST_JUDGE_URL", api_key_env="TW_TEST_NO_KEY", timeout_s=0.3,
                    retries=2, backoff_s=0.01, max_concurrency=3)
    return ChatJudgeSpec(**{**settings, **options})


def test_chat_judge_good_replies_and_recovered_failures(server):
    prompts = ["plain", "fail-once", "garbage-once", "slow-once"]
    outcomes = chat_judge().judge(prompts, ["a much longer answer"] * 4, ["short"] * 4, {})
    assert outcomes == [1.0] * 4
    assert server.seen  # every prompt was asked twice (both orders), the failing ones once more
    asked = {key.split("Instruction:\n", 1)[1].split("\n", 1)[0]: count for key, count in server.seen.items()}
    assert asked["fail-once"] == 2 and asked["garbage-once"] == 2 and asked["plain"] == 1


def test_chat_judge_position_swap_turns_position_bias_into_ties(server):
    outcomes = chat_judge().judge(["first-always"] * 2, ["x", "a much longer answer"], ["a much longer answer", "x"], {})
    assert outcomes == [0.5, 0.5]  # it said "1" in both orders: position, not content, decided


def test_chat_judge_gives_up_after_its_retries_with_one_line(server):
    judge = chat_judge(retries=0)
    with pytest.raises(UserError, match=r"^judge: no usable answer after 1 tries \(last: HTTP 500\)"):
        judge.judge(["fail-once"], ["a"], ["b"], {})


def test_chat_judge_needs_its_base_url(monkeypatch):
    monkeypatch.delenv("TW_TEST_JUDGE_URL", raising=False)
    with pytest.raises(UserError, match="TW_TEST_JUDGE_URL is not set"):
        chat_judge().judge(["p"], ["a"], ["b"], {})


def test_mean_score_interval_by_hand():
    from training_wizard.evaluation.winrate import mean_score

    share = mean_score([1.0, 0.0, 1.0, 1.0])  # a share: Wilson's interval
    assert (share.mean, (share.low, share.high)) == (0.75, wilson(0.75, 4))
    spread = mean_score([1.0, 2.0, 3.0])  # mean 2, sample sd 1: 2 +- 1.96 / sqrt(3)
    assert spread.mean == 2.0 and spread.high - 2.0 == pytest.approx(1.959963984540054 / math.sqrt(3))


def test_mean_score_prints_a_share_as_a_percentage_and_a_rating_as_it_is():
    from training_wizard.evaluation.winrate import mean_score

    assert mean_score([1.0, 0.0, 1.0, 1.0]).describe().startswith("75.0% (95% CI ")
    rating = mean_score([7.0, 8.0, 7.0, 7.2]).describe()  # a 0-10 judge's ratings, not 730%
    assert rating == "7.3 (95% CI 6.833 to 7.767; n=4)"  # 7.3 +- 1.96 * 0.4761 / 2
