"""The `[environment]` table: the environment and tools of a run's episodes (rollout/episodes.py).

    [environment]
    factory = "my_package.calculator:Calculator"  # a class with a no-argument constructor (or a function making
                                                  # one); or a table of them by the rows' `environment` column
    tools = ["my_package.tools:lookup"]           # plain functions the model may call
    protocol = "tools"                            # TRL's contract (default), or "text": step(reply) ->
                                                  # (observation, reward, done)
    chat_template = "hermes"                      # when the model's own cannot render tools

The table fills the episode's settings (specs/episode.py: `EpisodeSettings`), which also hold its limits: keys of
`[training]`, or of the `eval` recipe's top level.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal

from pydantic import Field, field_validator, model_validator

from training_wizard.spec import Spec
from training_wizard.specs.episode import (EnvironmentTimeout, EpisodeSettings, MaxToolCallingIterations,
                                            MaxTurns)
from training_wizard.specs.reward import RewardSpec, resolve_function


class EnvironmentSpec(Spec):
    """The environment (or tools) of episodes of several turns."""

    factory: str | dict[str, str] | None = Field(
        None, description="Import path of the environment class (or a function returning one), "
        "'package.module:Name', made fresh for every episode; or a table of them by name, each row choosing one "
        "by its `environment` column.")
    factory_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the factory is called with for every episode (one "
        "factory only), e.g. an OpenEnv server's url or a reasoning-gym retry environment's max_attempts.")
    tools: list[str] = Field(
        default_factory=list, description="Import paths of plain functions the model may call (typed arguments, "
        "a docstring with 'Args:'), beside the environment's own public methods.")
    protocol: Literal["tools", "text"] = Field(
        "tools", description="tools: TRL's environment_factory contract (reset(**row) -> str | None; every other "
        "public method a tool; optional get_reward()). text: reset(**row), then step(reply) -> (observation, "
        "reward, done) each turn.")
    tool_parser: str | None = Field(
        None, description="Import path of a function reading a reply's tool calls (text -> a list of {'name', "
        "'arguments'}; ValueError for a malformed reply). Default: the tokenizer's response parser when it has "
        "one, else the Hermes <tool_call> JSON form.")
    chat_template: str | None = Field(
        None, description="A training chat template replacing the model's: 'hermes' (ChatML with Hermes tool "
        "calls), the path of a Jinja file, or the template itself. Needed when the model's own cannot render "
        "tools or is not prefix-preserving (the run says so at start).")
    tokenization_check: Literal["strict", "warn", "off"] = Field(
        "warn", description="Compare each episode's spliced token ids with the chat template's rendering of its "
        "conversation: strict stops the run at a difference, warn logs it (episodes/tokenization_drift).")
    keep_kv_cache: bool = Field(
        False, description="With the built-in decode loop: keep each episode's KV cache across its turns, so a turn "
        "runs only the environment's new tokens (and the reply's last one) through the model instead of the whole "
        "context. Same tokens; logprobs equal up to float rounding (other matmul shapes). Costs memory: every "
        "running episode's cache is held between turns. No effect with vLLM (its prefix cache does this).")
    # the episode's limits; [training]'s keys of the same names (TRL's) are their aliases (specs/episode.py)
    max_turns: MaxTurns = EpisodeSettings.max_turns
    max_tool_calling_iterations: MaxToolCallingIterations = EpisodeSettings.max_tool_calling_iterations
    environment_timeout: EnvironmentTimeout = EpisodeSettings.environment_timeout

    @field_validator("factory", "tools", "tool_parser")
    @classmethod
    def _importable_now(cls, value: Any) -> Any:
        """Import them when the recipe loads, so --dry-run catches a typo before any model loads."""
        paths = value.values() if isinstance(value, dict) else [value] if isinstance(value, str) else value or []
        for path in paths:
            resolve_function(path, raising=ValueError)
        return value

    @model_validator(mode="after")
    def _something_to_play(self) -> EnvironmentSpec:
        if self.factory is None and (self.protocol == "text" or not self.tools):
            raise ValueError("name an environment factory" + (" (the text protocol steps one)" if self.protocol
                                                               == "text" else ", tools, or both"))
        if self.protocol == "text" and (self.tools or self.tool_parser):
            raise ValueError(f"{'tools' if self.tools else 'tool_parser'}: the text protocol shows the model no "
                             "tools (its environment reads each reply); set protocol = \"tools\", or remove it")
        if self.factory_kwargs and not isinstance(self.factory, str):
            raise ValueError("factory_kwargs: expected one factory (factory = 'package.module:Name') to call with "
                             "them")
        return self

    def load(self) -> Callable[[], Any] | dict[str, Callable[[], Any]] | None:
        """The trainer's `environment_factory`."""
        def load_one(path: str) -> Callable[[], Any]:
            factory = resolve_function(path, raising=ValueError, key="environment.factory: ")
            if not self.factory_kwargs:
                return factory
            # keeps the factory's name (the reward component's) and, as __wrapped__, the factory itself
            return functools.update_wrapper(functools.partial(factory, **self.factory_kwargs), factory)
        if isinstance(self.factory, dict):
            return {name: load_one(path) for name, path in self.factory.items()}
        return load_one(self.factory) if self.factory is not None else None

    def settings(self) -> EpisodeSettings:
        """The trainer's `episode_settings` (the limits are filled from the run's options when it starts)."""
        parser = resolve_function(self.tool_parser, raising=ValueError, key="environment.tool_parser: ") \
            if self.tool_parser else None
        tools = tuple(resolve_function(path, raising=ValueError, key="environment.tools: ") for path in self.tools)
        return EpisodeSettings(protocol=self.protocol, tools=tools, tool_parser=parser,
                               chat_template=self.chat_template, tokenization_check=self.tokenization_check,
                               keep_kv_cache=self.keep_kv_cache)


class EnvironmentReward(RewardSpec):
    """The reward of a run without a `[reward]` table: 0 for every episode, to which the environment's own reward
    (a component named after its class) is added."""

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [0.0] * len(completions)
