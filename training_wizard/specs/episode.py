"""How a run's episodes are played (rollout/episodes.py): one record, `EpisodeSettings`, and its limit options.

The `[environment]` table (specs/environment.py) fills the record's protocol, tools, parser, chat template and
tokenization check. Its limits are `[training]` keys in a training recipe (TRL's names: `max_tool_calling_iterations`,
`max_turns` for the text protocol, and `environment_timeout`) and top-level keys of the `eval` recipe; both declare
them with the types below, and `EpisodeSettings.with_limits` copies them into the record (rollout/episodes.py:
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
    limit options take their defaults from here."""

    protocol: Literal["tools", "text"] = "tools"
    tools: tuple[Callable, ...] = ()
    tool_parser: Callable[[str], Any] | None = None
    chat_template: str | None = None
    tokenization_check: Literal["strict", "warn", "off"] = "warn"
    max_turns: int = 4
    environment_timeout: float = 60.0
    max_tool_calling_iterations: int | None = None

    def with_limits(self, options: Any) -> EpisodeSettings:
        """These settings under the limits `options` holds (a training config, or the eval recipe), which take the
        place of the record's own."""
        return dataclasses.replace(self, **{key: getattr(options, key) for key in LIMIT_KEYS})
