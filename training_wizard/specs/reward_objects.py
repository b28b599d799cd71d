"""TRL's `reward_funcs` given as Python objects (the trainers' TRL-form constructor): functions and reward models
in one RewardFunctionsSpec, so they are called, weighted, checked and logged as the recipe's `reward_funcs` are.

- A function is called TRL-style by keyword (specs/reward_functions.py) and logged under its `__name__`.
- A reward model (a sequence classifier with one output, as a folder, a cached Hub id or a model object) becomes a
  `ModelRewardFunction` (specs/reward_model_function.py), logged under its folder's base name, as TRL names it.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import Field, field_validator

from training_wizard.specs.reward_functions import RewardFunctionsSpec, unique_names


class RewardObjectsSpec(RewardFunctionsSpec):
    """RewardFunctionsSpec over callables rather than import paths (Python API only, not from a recipe file)."""

    model_config = RewardFunctionsSpec.model_config | {"arbitrary_types_allowed": True}

    reward_funcs: list[Any] = Field(min_length=1, description="The reward functions, each a TRL-form callable.")

    @field_validator("reward_funcs")
    @classmethod
    def _importable_now(cls, functions: list[Any]) -> list[Any]:  # replaces the parent's import check
        for index, fn in enumerate(functions):
            if not callable(fn):
                raise ValueError(f"reward_funcs[{index}]: expected a callable, got {type(fn).__name__}")
        return functions

    def functions(self) -> dict[str, Callable[..., Any]]:
        return unique_names([(getattr(fn, "__name__", None) or type(fn).__name__, fn) for fn in self.reward_funcs])
