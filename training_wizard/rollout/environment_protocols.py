"""What an environment does between two replies, in the two protocols an `[environment]` table can name.

- "tools" (TRL 1.x's `environment_factory` contract, the default): `reset(**row) -> str | None`; every other
  public method is a tool; optional `get_reward()` (sync or async) scores the finished episode. Plain functions
  given as `tools` are tools without an environment. A reply with tool calls gets one tool message per call (and
  one per malformed call, holding the error); a reply without calls ends the episode (the model answered).
- "text" (skyrl-gym's and OpenEnv's shape): `reset(**row) -> str | None`; `step(reply) -> (observation, reward,
  done)`; the observation comes back as a user message, the step rewards are summed.

A protocol turns a reply into `Job`s (calls to run, each within environment_timeout, concurrently) and their
results into an `Answer`: the messages to splice in, a reward, a stop reason, and the call counts the tools/*
metrics read. Neither a job's exception nor its timeout ends the run: each becomes an error message to the model.
What a job returns against its contract (a step's shape, a reward that is not a finite number) is the user's bug
and stops the run in one line (environment_contracts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from training_wizard.errors import UserError
from training_wizard.rollout.environment_contracts import (
    checked_reward, checked_step, method_name, raised, refuse_duplicate_tools,
)
from training_wizard.rollout.tools import (
    ParsedReply, ToolCall, awaited_value, call_tool, environment_tools, error_text, tool_schema,
)
from training_wizard.rollout.trajectory import StopReason
from training_wizard.specs.episode import EpisodeSettings


class EnvironmentFailure(Exception):
    """What an environment raises from reset or step when its episode cannot go on: the server it talks to died,
    answered garbage or ran past the environment's own timeout. The episode ends there (text protocol), counted in
    `episodes/environment_errors_mean`; the run goes on. Any other exception is a message to the model instead."""


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


class ToolsProtocol:
    """Tool calls each turn until a reply calls none, or max_tool_calling_iterations rounds have run."""

    name = "tools"

    def __init__(self, functions: list[Callable], max_rounds: int | None):
        refuse_duplicate_tools([(function.__name__, function) for function in functions])
        self.functions = {function.__name__: function for function in functions}
        self.function_schemas = [tool_schema(function) for function in functions]
        self.max_rounds = max_rounds

    def tools_of(self, environment: Any) -> tuple[dict[str, Callable], list[dict] | None]:
        """The tools an episode may call (its environment's methods, then the plain functions) and their
        schemas for the chat template."""
        methods = environment_tools(environment) if environment is not None else {}
        refuse_duplicate_tools([*methods.items(), *self.functions.items()])
        schemas = [tool_schema(method) for method in methods.values()] + self.function_schemas
        return {**methods, **self.functions}, schemas or None

    def turn(self, environment: Any, tools: dict, reply: str, replies: int, parse, row: int = -1) -> Turn | Answer:
        parsed: ParsedReply = parse(reply)
        if not parsed.attempted:
            return Answer(stop=StopReason.STOP_TOKEN)  # no call: this reply is the model's answer
        if self.max_rounds is not None and replies > self.max_rounds:
            return Answer(stop=StopReason.TOOL_BUDGET)  # its calls are not run, nor counted

        def answer(results: list[JobResult]) -> Answer:
            messages, failures = [], 0
            for call, found in zip(parsed.calls, results):
                text, failed = (error_text(found.error), True) if found.error is not None else found.value
                failures += failed
                messages.append({"role": "tool", "name": call.name, "content": text})
            for _ in range(parsed.malformed):
                messages.append({"role": "tool", "name": "error", "content": error_text(
                    "a tool call could not be read: expected <tool_call> JSON with name and arguments </tool_call>")})
            return Answer(messages, calls=len(parsed.calls), failures=failures, malformed=parsed.malformed)
        return Turn([_bound(tools, call) for call in parsed.calls], answer)

    def final_reward(self, environment: Any, row: int = -1) -> float:
        """The finished episode's `get_reward()` (0 without one); its exception or a value that is not a finite
        number is the environment's bug: one line naming the method and the row."""
        scorer = getattr(environment, "get_reward", None)
        if scorer is None:
            return 0.0
        where = f"environment: dataset row {row}: {method_name(environment, 'get_reward')}"
        try:
            value = awaited_value(scorer())
        except Exception as error:  # noqa: BLE001 - the environment's own scorer: a bug the run cannot go on with
            raise UserError(f"{where} raised {raised(error)}") from None
        return checked_reward(where, value)


def episode_protocol(settings: EpisodeSettings) -> TextProtocol | ToolsProtocol:
    """The protocol `settings` names, under its limit: replies per episode (text) or rounds of tool calls (tools)."""
    if settings.protocol == "tools":
        return ToolsProtocol(list(settings.tools), settings.max_tool_calling_iterations)
    return TextProtocol(settings.max_turns)


def _bound(tools: dict[str, Callable], call: ToolCall) -> Callable[[], tuple[str, bool]]:
    return lambda: call_tool(tools, call)
