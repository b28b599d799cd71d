"""How a run's episodes are played (rollout/episodes.py): one record, `EpisodeSettings`, and its limit options.

The `[environment]` table (specs/environment.py) fills the record: protocol, tools, parser, chat template,
tokenization check and the limits (`max_turns` for the text protocol, `max_tool_calling_iterations`,
`environment_timeout`). TRL's names of the limits stay accepted where TRL has them, as `[training]` keys of a
training recipe (top-level keys of the `eval` recipe): `limits_from_environment` fills those from `[environment]`
(one place may set each), and `EpisodeSettings.with_limits` copies them into the record (rollout/episodes.py:
`episode_player`, for training and `eval` alike). `response_length` is the whole episode's token budget, the
environment's tokens included.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal

from pydantic import Field, PositiveFloat, PositiveInt

MaxTurns = Annotated[PositiveInt, Field(description="With a text environment: model replies per episode at most.")]
MaxToolCallingIterations = Annotated[PositiveInt | None, Field(
    description="With tools: rounds of tool calls per episode at most (TRL's name); a reply that calls a tool past "
    "them ends the episode. None: until the model stops calling or response_length runs out.")]
EnvironmentTimeout = Annotated[PositiveFloat, Field(
    description="With an environment: seconds one tool call or environment step may take; past it the model reads "
    "an error message and the episode goes on.")]

LIMIT_KEYS = ("max_turns", "environment_timeout", "max_tool_calling_iterations")


@dataclass(frozen=True)
class EpisodeSettings:
    """How episodes are played: the protocol, plain-function tools, a custom reply parser (text -> a list of
    {"name", "arguments"}), the training chat template that replaces the model's (rollout/chat_templates.py:
    a name, a file or the template), and what a tokenization drift does: "strict" stops the run, "warn" logs
    it. The limits: max_turns, model replies per episode (text protocol); environment_timeout, seconds one tool
    call or environment step may take (past it the model reads an error and the episode goes on);
    max_tool_calling_iterations, rounds of tool calls per episode (tools protocol; None: until the budget). The
    limit options take their defaults from here. keep_kv_cache: the decode loop keeps each episode's KV cache
    across its turns (rollout/kept_cache.py) instead of re-encoding the whole context every turn."""

    protocol: Literal["tools", "text"] = "tools"
    tools: tuple[Callable, ...] = ()
    tool_parser: Callable[[str], Any] | None = None
    chat_template: str | None = None
    tokenization_check: Literal["strict", "warn", "off"] = "warn"
    max_turns: int = 4
    environment_timeout: float = 60.0
    max_tool_calling_iterations: int | None = None
    keep_kv_cache: bool = False

    def with_limits(self, options: Any) -> EpisodeSettings:
        """These settings under the limits `options` holds (a training config, or the eval recipe), which take the
        place of the record's own."""
        return dataclasses.replace(self, **{key: getattr(options, key) for key in LIMIT_KEYS})


def limits_from_environment(environment: Any, options: Any, table: str) -> None:
    """Copy the limits the `[environment]` table sets into `options` (the training config, or the eval recipe),
    whose keys of the same names (TRL's, in `[training]`) are aliases of them: one place may set each, and where
    both do with different values it is one line naming both."""
    for key in LIMIT_KEYS:
        if key not in environment.model_fields_set:
            continue
        value, other = getattr(environment, key), getattr(options, key)
        if key in options.model_fields_set and other != value:
            raise ValueError(f"environment.{key} = {value!r} and {table}{key} = {other!r} set one limit twice; "
                             f"keep environment.{key}")
        # validated already (the same types on both tables); set without re-running `options`' own validators,
        # which are running now when `options` is the eval recipe itself
        options.__dict__[key] = value
        options.__pydantic_fields_set__.add(key)

