"""Judges: given a prompt and two completions (candidate, baseline), say which is better.

Each judge returns one outcome per prompt for the candidate: 1 a win, 0.5 a tie, 0 a loss.
- `RewardJudgeSpec`: offline; the completion with the higher reward wins (equal rewards tie).
- `ChatJudgeSpec`: an OpenAI-compatible chat endpoint (base URL, model and API key from the environment), asked
  twice per pair with the two completions in both orders; when the two answers disagree, position decided it
  and the pair is a tie. Requests run concurrently (a bounded pool), each with a timeout, retried with
  exponential backoff on a timeout, a 429/5xx answer or a reply that names neither completion.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt

from training_wizard.errors import UserError
from training_wizard.http_client import post_json
from training_wizard.spec import Spec
from training_wizard.specs.reward import RewardSpec

DEFAULT_TEMPLATE = """\
Which response answers the instruction better? Judge helpfulness, faithfulness and fluency.

Instruction:
{prompt}

Response 1:
{first}

Response 2:
{second}

Answer with the number of the better response only: 1 or 2."""


class JudgeSpec(Spec):
    """Base of the judge specs; `spec_class` picks one."""

    default_spec_class = "training_wizard.evaluation.judges.RewardJudgeSpec"

    def judge(self, prompts: list[str], candidates: list[str], baselines: list[str], columns: dict[str, list[Any]],
              sides: tuple[dict[str, list[Any]], dict[str, list[Any]]] = ({}, {})) -> list[float]:  # pragma: no cover
        """Outcomes for the candidate; `columns` are the prompt rows' columns, `sides` per-completion columns of
        the candidate's and the baseline's completions (completion_has_eos)."""
        raise NotImplementedError


class RewardJudgeSpec(JudgeSpec):
    """The completion with the higher reward wins; rewards within `tie_tolerance` tie."""

    reward: RewardSpec = Field(description="Any reward spec (set its spec_class), e.g. the training reward.")
    tie_tolerance: float = Field(0.0, ge=0.0, description="Rewards closer than this count as a tie.")

    def judge(self, prompts, candidates, baselines, columns, sides=({}, {})):
        ours, _ = self.reward.score(prompts, candidates, {**columns, **sides[0]}, label="judge.reward")
        theirs, _ = self.reward.score(prompts, baselines, {**columns, **sides[1]}, label="judge.reward")
        return [0.5 if abs(a - b) <= self.tie_tolerance else float(a > b) for a, b in zip(ours, theirs)]


class ChatJudgeSpec(JudgeSpec):
    """An OpenAI-compatible `/chat/completions` endpoint as judge (position bias controlled by swapping)."""

    model: str = Field(description="Model name sent to the endpoint.")
    base_url_env: str = Field("OPENAI_BASE_URL", description="Environment variable holding the API base URL.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    template: str = Field(DEFAULT_TEMPLATE, description="Prompt with {prompt}, {first} and {second}.")
    max_concurrency: PositiveInt = Field(4, description="Requests in flight at once.")
    timeout_s: PositiveFloat = Field(60.0, description="Seconds before a request is abandoned (and retried).")
    retries: int = Field(4, ge=0, description="Retries of a failed request (timeout, 429, 5xx, malformed reply).")
    backoff_s: float = Field(1.0, ge=0.0, description="First retry delay; doubled at each retry.")

    def judge(self, prompts, candidates, baselines, columns, sides=({}, {})):
        endpoint, key = self._endpoint()
        jobs = [(p, a, b) for p, a, b in zip(prompts, candidates, baselines)]
        jobs += [(p, b, a) for p, a, b in zip(prompts, candidates, baselines)]  # the swapped order
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            answers = list(pool.map(lambda job: self._ask(endpoint, key, *job), jobs))
        n = len(prompts)
        outcomes = []
        for first_order, swapped in zip(answers[:n], answers[n:]):
            candidate_first, candidate_second = first_order == 1, swapped == 2
            outcomes.append(float(candidate_first) if candidate_first == candidate_second else 0.5)
        return outcomes

    def _endpoint(self) -> tuple[str, str]:
        base = os.environ.get(self.base_url_env)
        if not base:
            raise UserError(f"judge.base_url_env: environment variable {self.base_url_env} is not set")
        return base.rstrip("/") + "/chat/completions", os.environ.get(self.api_key_env, "")

    def _ask(self, endpoint: str, key: str, prompt: str, first: str, second: str) -> int:
        """1 or 2: which response the judge prefers, retrying transient failures."""
        payload = {
            "model": self.model, "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": self.template.format(prompt=prompt, first=first, second=second)}],
        }
        return post_json(endpoint, payload, label="judge", timeout_s=self.timeout_s, retries=self.retries,
                         backoff_s=self.backoff_s, parse=_preferred, unusable="a reply that names neither response",
                         api_key=key)


def _preferred(reply: Any) -> int | None:
    """1 or 2 from an OpenAI-style chat completion, or None when the reply is malformed or says neither."""
    try:
        text = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    found = re.search(r"[12]", str(text))
    return int(found.group()) if found else None
