"""Recipes written for training-wizard 1.0: read them as they are, or convert them once (`training-wizard migrate`).

A 1.0 recipe names its recipe class in a top-level `spec_class` and keeps its parts in `[transformer_spec]`,
`[reference_transformer_spec]`, `[dataset_spec]`, `[reward_spec]` and `[training_args_spec]` (the RLOO options
next to Hugging Face `TrainingArguments` keys), with `validation` holding rows out for evaluation.
`translate_legacy_recipe` (recipe.py) maps every key to today's recipe and records a `Note` for each one it
translated or dropped: dropped keys that do not change the result are warned about, one line each; a key whose loss
would change the result stops with one line. The tables every 1.0 recipe shares are translated by translators.py;
rloo.py, grpo.py and supervised.py (1.0's modular recipe: SFT, sequence classification) translate each recipe
class. 1.0 reward classes keep working through `LegacyRewardSpec`, which gives them the inputs they were written
against. docs/migrating.md has the key tables.

`LegacyRewardSpec` is defined in this module because translated recipes (and their resolved configs) name it
`training_wizard.legacy.LegacyRewardSpec`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import Field

from training_wizard.legacy.recipe import is_legacy_recipe, migrated_text, translate_legacy_recipe
from training_wizard.legacy.translation import (
    GRPO_CLASS, LEGACY_TABLES, MODULAR_CLASS, RLOO_CLASSES, Note, Translation, check_top_keys,
)
from training_wizard.specs.reward import RewardSpec
from training_wizard.specs.reward_functions import iterations_before

__all__ = [
    "GRPO_CLASS", "LEGACY_TABLES", "MODULAR_CLASS", "RLOO_CLASSES", "LegacyRewardSpec", "LegacyTrainerView", "Note",
    "Translation", "accepted_columns", "check_top_keys", "is_legacy_recipe", "migrated_text",
    "translate_legacy_recipe",
]


class _TrainerState:
    def __init__(self, step: int):
        self.global_step = step


class _TrainerArgs:
    def __init__(self, logging_steps: int):
        self.logging_steps = logging_steps


class LegacyTrainerView:
    """What 1.0 reward code reads from `self.trainer`: `is_world_process_zero()`, `state.global_step`,
    `args.logging_steps`, and `_metrics["train"][name]`, the lists 1.0 GRPO rewards append their own metrics to
    (TRL's private log buffer): here they take the values and drop them, since no tracker reads them."""

    def __init__(self, step: int, logging_steps: int):
        self.state, self.args = _TrainerState(step), _TrainerArgs(logging_steps)
        self._metrics: defaultdict[str, defaultdict[str, list]] = defaultdict(lambda: defaultdict(list))

    @staticmethod
    def is_world_process_zero() -> bool:
        from accelerate import PartialState

        return PartialState().is_main_process


class LegacyRewardSpec(RewardSpec):
    """Runs a reward class written for training-wizard 1.0: its `compute_reward(prompts, completions, **kwargs)`
    gets what 1.0's recipe gave it (`raw_text`: the RLOO recipe's templated prompt and completion with special
    tokens, or the GRPO recipe's plain text), and `self.trainer` answers what 1.0 rewards ask of it."""

    reward: RewardSpec = Field(description="The 1.0 reward spec (its own spec_class and keys).")
    logging_steps: int = Field(1, ge=1, description="What `self.trainer.args.logging_steps` answers.")
    raw_text: bool = Field(
        True, description="true: the prompt as the model saw it and the completion with its special tokens (1.0's "
        "RLOO recipe). false: the prompt's text (a conversation's last message) and the completion without special "
        "tokens, what 1.0's GRPO recipe (TRL's GRPOTrainer) gave a reward that reads a message's content."
    )

    def uses_raw_text(self) -> bool:
        return self.raw_text

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        step = columns.pop("step", 0)
        templated = columns.pop("templated_prompts", prompts)
        raw = columns.pop("raw_completions", completions)
        object.__setattr__(self.reward, "trainer", LegacyTrainerView(iterations_before(step), self.logging_steps))
        return self.reward.compute_reward(templated, raw, **accepted_columns(self.reward.compute_reward, columns))

    def score(self, prompts, completions, columns, step: int = 0, label: str | None = None):
        return super().score(prompts, completions, {**columns, "step": step}, step=step,
                             label=label or type(self.reward).__name__)


def accepted_columns(method: Any, columns: dict[str, Any]) -> dict[str, Any]:
    """The row columns `method` takes: all of them if it has **kwargs, else those it names. 1.0's reward classes
    are often `compute_reward(self, queries, completions)` with no **kwargs (1.0 never passed columns), and a
    template source's row columns (e.g. `input`) would otherwise end the run at the first reward call."""
    import inspect

    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: pass everything, as before
        return columns
    parameters = list(parameters)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    positional = [p for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    names = {p.name for p in positional[2:] if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}  # after the
    names |= {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}  # prompts and completions
    return {key: value for key, value in columns.items() if key in names}
