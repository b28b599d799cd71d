"""The `[environment]` table: the text environment a run's episodes are played in (rollout/episodes.py).

    [environment]
    factory = "my_package.games:Guess"     # a class with a no-argument constructor (or any function making one)
    # protocol = "text"                     # reset(**row) -> str | None; step(reply) -> (observation, reward, done)

Its limits are `[training]` keys: `max_turns` (model replies per episode) and `environment_timeout` (seconds per
step); `response_length` is the whole episode's token budget, the environment's tokens included.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import Field, field_validator

from training_wizard.spec import Spec
from training_wizard.specs.reward import resolve_function


class EnvironmentSpec(Spec):
    """A text environment for episodes of several turns."""

    factory: str = Field(description="Import path of the environment class (or a function returning one), "
                         "'package.module:Name'; one is made for every episode.")
    protocol: Literal["text"] = Field("text", description="text: reset(**row) -> str | None appended to the "
                                      "prompt's last user message; step(reply) -> (observation, reward, done).")

    @field_validator("factory")
    @classmethod
    def _importable_now(cls, factory: str) -> str:
        """Import it when the recipe loads, so --dry-run catches a typo before any model loads."""
        resolve_function(factory, raising=ValueError)
        return factory

    def load(self) -> Callable[[], Any]:
        return resolve_function(self.factory, raising=ValueError, key="environment.factory: ")
