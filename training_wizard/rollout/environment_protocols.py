"""What an environment does between two replies, in the two protocols an `[environment]` table can name.

- "tools" (TRL 1.x's `environment_factory` contract, the default): `reset(**row) -> str | None`; every other
  public method is a tool; optional `get_reward()` (sync or async) scores the finished episode. Plain functions
  given as `tools` are tools without an environment. A reply with tool calls gets one tool message per call (and
  one per malformed call, holding the error); a reply without calls ends the episode (the model answered).
- "text" (skyrl-gym's and OpenEnv's shape): `reset(**row) -> str | None`; `step(reply) -> (observation, reward,
  done)`; the observation comes back as a user message, the step rewards are summed.

The text protocol is here; the tools protocol (`ToolsProtocol`) lives with tool calling (tools.py). A protocol
turns a reply into `Job`s (calls to run, each within environment_timeout, concurrently) and their
results into an `Answer`: the messages to splice in, a reward, a stop reason, and the call counts the tools/*
metrics read. Neither a job's exception nor its timeout ends the run: each becomes an error message to the model.
What a job returns against its contract (a step's shape, a reward that is not a finite number) is the user's bug
and stops the run in one line (environments.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from training_wizard.rollout.environments import checked_step
from training_wizard.rollout.trajectory import StopReason


def error_text(message: str) -> str:
    """What a failed call returns to the model: a JSON object with its error."""
    return json.dumps({"error": message})


@dataclass(frozen=True)
class JobResult:
    """A job's return value, or the error that replaced it (an exception or a timeout); `ends_episode`: the error
    was an EnvironmentFailure."""

    value: Any = None
    error: str | None = None
    ends_episode: bool = False


@dataclass
class Answer:
    """The environment's answer to one reply."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    stop: StopReason | None = None
    calls: int = 0
    failures: int = 0
    errors: int = 0  # text protocol: steps that raised or ran past environment_timeout
    malformed: int = 0
    failed: int = 0  # 1: an EnvironmentFailure ended the episode (max_environment_failures counts these)


@dataclass
class Turn:
    """What a protocol needs to answer one reply: the jobs to run, and how to read their results."""

    jobs: list[Callable[[], Any]]
    answer: Callable[[list[JobResult]], Answer]


class TextProtocol:
    """reset, then step(reply) -> (observation, reward, done) each turn, up to max_turns replies."""

    name = "text"

    def __init__(self, max_turns: int):
        self.max_turns = max_turns

    def tools_of(self, environment: Any) -> tuple[dict[str, Callable], list[dict] | None]:
        return {}, None

    def turn(self, environment: Any, tools: dict, reply: str, replies: int, parse, row: int = -1) -> Turn | Answer:
        def answer(results: list[JobResult]) -> Answer:
            found = results[0]
            if found.ends_episode:  # the environment cannot go on: the episode ends, its rewards so far kept
                return Answer([self._message(error_text(found.error))], stop=StopReason.ENVIRONMENT_DONE, errors=1,
                              failed=1)
            if found.error is not None:  # the step raised or timed out: the model reads why, the episode goes on
                return self._limit(Answer([self._message(error_text(found.error))], errors=1), replies)
            observation, reward, done = checked_step(environment, found.value, row)
            if done or observation is None:
                return Answer(reward=reward, stop=StopReason.ENVIRONMENT_DONE)
            return self._limit(Answer([self._message(observation)], reward=reward), replies)
        return Turn([lambda: environment.step(reply)], answer)

    @staticmethod
    def _message(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def _limit(self, answer: Answer, replies: int) -> Answer:
        if replies >= self.max_turns:  # no reply may follow: the message is not spliced in
            return Answer(reward=answer.reward, stop=StopReason.TURNS, errors=answer.errors)
        return answer

    def final_reward(self, environment: Any, row: int = -1) -> float:
        return 0.0
