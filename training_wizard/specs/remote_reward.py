"""A reward computed by a server over HTTP: our JSON API, or an OpenAI-compatible chat model asked for a score.

protocol "json": the rows go in batches of `batch_size`, one POST each to `url`:

    request:  {"prompts": [str, ...], "completions": [str, ...], "<column>": [value, ...], ...}
    reply:    {"rewards": [float, ...]}          one number per completion, in order

  The columns are the dataset row's columns plus `completion_has_eos`, one list entry per completion; a value
  JSON cannot hold is sent as its string.

protocol "openai": one POST per completion to `url` + "/chat/completions" (unless `url` already ends with it):
a single user message, `template` filled with `prompt`, `completion` and the row's columns; the reward is the first
number in the reply's text (`choices[0].message.content`).

Requests run concurrently (at most `max_concurrency` at once), each with a timeout, retried with exponential
backoff on a timeout, a connection error, HTTP 429/5xx or an unusable reply. A failure is one line naming the url,
what happened and the rows concerned.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from training_wizard.errors import UserError
from training_wizard.http_client import check_http_url, post_json
from training_wizard.specs.reward import RewardSpec

DEFAULT_TEMPLATE = """\
Rate how well the response answers the prompt, from 0 (useless) to 10 (perfect).

Prompt:
{prompt}

Response:
{completion}

Answer with the number only."""

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class RemoteRewardSpec(RewardSpec):
    """A reward server at `url` (protocol json) or an OpenAI-compatible chat model asked for a score (openai)."""

    url: str = Field(description="json: the endpoint to POST to; openai: the API base URL (e.g. "
                     "'http://localhost:8000/v1'), to which '/chat/completions' is appended.")
    protocol: Literal["json", "openai"] = Field(
        "json", description="'json': POST {prompts, completions, columns}, reply {rewards}; 'openai': a chat model "
        "asked per completion, the first number of its reply is the reward."
    )
    model: str | None = Field(None, description="openai: the model name sent to the endpoint (required).")
    template: str = Field(DEFAULT_TEMPLATE, description="openai: the user message; fields {prompt}, {completion} "
                          "and the row's columns.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key, sent as a bearer "
                                    "token; none: no Authorization header.")
    timeout: PositiveFloat = Field(60.0, description="Seconds before a request is abandoned (and retried).")
    max_retries: int = Field(3, ge=0, description="Retries of a failed request (timeout, connection error, "
                             "429/5xx, unusable reply).")
    backoff: float = Field(1.0, ge=0.0, description="Seconds before the first retry; doubled at each retry.")
    max_concurrency: PositiveInt = Field(8, description="Requests in flight at once.")
    batch_size: PositiveInt = Field(64, description="json: completions per request.")

    @model_validator(mode="after")
    def _openai_needs_a_model(self) -> RemoteRewardSpec:
        if self.protocol == "openai" and not self.model:
            raise ValueError("model: protocol 'openai' needs the model name to send")
        try:
            check_http_url(self.url)
        except ValueError as exc:
            raise ValueError(f"url: {exc}") from None
        return self

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        key = self._api_key()
        if self.protocol == "json":
            jobs = [(start, min(start + self.batch_size, len(completions)))
                    for start in range(0, len(completions), self.batch_size)]
            ask = lambda job: self._ask_json(prompts, completions, columns, *job, key)  # noqa: E731
        else:
            jobs = list(range(len(completions)))
            ask = lambda row: self._ask_chat(prompts, completions, columns, row, key)  # noqa: E731
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            answers = list(pool.map(ask, jobs))
        return [value for answer in answers for value in answer] if self.protocol == "json" else answers

    def _api_key(self) -> str:
        if self.api_key_env is None:
            return ""
        key = os.environ.get(self.api_key_env)
        if not key:
            raise UserError(f"reward.api_key_env: environment variable {self.api_key_env} is not set")
        return key

    def _ask_json(self, prompts, completions, columns, start: int, stop: int, key: str) -> list[Any]:
        count = stop - start
        payload = {
            **{name: list(values[start:stop]) for name, values in columns.items() if isinstance(values, (list, tuple))},
            "prompts": list(prompts[start:stop]), "completions": list(completions[start:stop]),
        }

        def rewards(reply: Any) -> list[Any] | None:
            values = reply.get("rewards") if isinstance(reply, dict) else None
            return values if isinstance(values, list) and len(values) == count else None

        return post_json(self.url, payload, label=f"reward {self.url} (rows {start}-{stop - 1})",
                         timeout_s=self.timeout, retries=self.max_retries, backoff_s=self.backoff, parse=rewards,
                         unusable=f'a reply without "rewards": a list of {count} numbers', api_key=key)

    def _ask_chat(self, prompts, completions, columns, row: int, key: str) -> float:
        fields = {name: values[row] for name, values in columns.items()
                  if isinstance(values, (list, tuple)) and len(values) > row}
        fields.update(prompt=prompts[row], completion=completions[row])
        try:
            message = self.template.format_map(fields)
        except (KeyError, AttributeError, IndexError, ValueError) as exc:
            raise UserError(f"reward.template: cannot fill row {row} ({type(exc).__name__}: {exc}); fields: "
                            f"{', '.join(fields)}") from None
        endpoint = self.url.rstrip("/")
        if not endpoint.endswith("/chat/completions"):
            endpoint += "/chat/completions"
        payload = {"model": self.model, "temperature": 0, "messages": [{"role": "user", "content": message}]}
        return post_json(endpoint, payload, label=f"reward {endpoint} (row {row})", timeout_s=self.timeout,
                         retries=self.max_retries, backoff_s=self.backoff, parse=first_number,
                         unusable="a reply with no number in it", api_key=key)


def first_number(reply: Any) -> float | None:
    """The first number in an OpenAI-style chat completion's text, or None when the reply is malformed or has no
    number ("Score: 7/10" gives 7.0)."""
    try:
        text = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    found = _NUMBER.search(str(text))
    return float(found.group()) if found else None
