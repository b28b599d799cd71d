"""The record of a 1.0 recipe's translation: today's recipe dict and a `Note` for every 1.0 key, plus the 1.0
recipe classes this version reads and the check of a 1.0 recipe's top-level keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError

RLOO_CLASSES = ("training_wizard.recipes.rloo.RLOOTrainingSpec", "training_wizard.recipes.rloo.RLOOSpec")
GRPO_CLASS = "training_wizard.recipes.grpo.GRPOTrainingSpec"
MODULAR_CLASS = "training_wizard.recipes.modular.ModularTrainingSpec"
LEGACY_TABLES = ("transformer_spec", "reference_transformer_spec", "dataset_spec", "reward_spec", "training_args_spec")


@dataclass
class Note:
    """What happened to one 1.0 key: `new` is its new key (None when dropped), `reason` a short explanation."""

    old: str
    new: str | None
    reason: str = ""


@dataclass
class Translation:
    recipe: dict[str, Any]
    notes: list[Note] = field(default_factory=list)
    output_column: str = "prompt"  # where a template source puts its messages: "messages" for SFT

    def note(self, old: str, new: str | None, reason: str = "") -> None:
        self.notes.append(Note(old, new, reason))

    @property
    def warnings(self) -> list[str]:
        return [f"{n.old}: ignored ({n.reason})" for n in self.notes if n.new is None]


def check_top_keys(data: dict[str, Any], path: Path | str, kind: str, allowed: tuple[str, ...],
                   required: tuple[str, ...]) -> None:
    """One line for the first top-level key a 1.0 `kind` recipe did not have, or the first required one missing."""
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise UserError(f"{path}: {unknown[0]}: unknown key in a training-wizard 1.0 {kind} recipe")
    for key in required:
        if key not in data:
            raise UserError(f"{path}: {key}: required key is missing (training-wizard 1.0 {kind} recipe)")
