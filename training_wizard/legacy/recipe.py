"""Reading a recipe written for training-wizard 1.0: recognise it, translate it by its recipe class, and write the
translation as a recipe file with a comment line for every 1.0 key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from training_wizard.errors import UserError
from training_wizard.legacy.grpo import translate_grpo
from training_wizard.legacy.rloo import translate_rloo
from training_wizard.legacy.supervised import translate_modular
from training_wizard.legacy.translation import GRPO_CLASS, MODULAR_CLASS, RLOO_CLASSES, Translation


def is_legacy_recipe(data: dict[str, Any]) -> bool:
    """A 1.0 recipe: a top-level `spec_class` naming the recipe, and no `recipe_class`."""
    return "recipe_class" not in data and isinstance(data.get("spec_class"), str)


def translate_legacy_recipe(data: dict[str, Any], path: Path | str) -> Translation:
    """Today's recipe dict (with `recipe_class`) for a 1.0 recipe, and a note for every key."""
    data = copy.deepcopy(data)
    recipe_class = data.pop("spec_class")
    if recipe_class == MODULAR_CLASS:
        return translate_modular(data, path)
    if recipe_class == GRPO_CLASS:
        return translate_grpo(data, path, Translation({"recipe_class": "grpo"}))
    if recipe_class not in RLOO_CLASSES:
        raise UserError(f"{path}: spec_class: '{recipe_class}' is a training-wizard 1.0 recipe class this version "
                        "does not run; it reads only RLOO recipes (training_wizard.recipes.rloo.RLOOTrainingSpec), "
                        "GRPO recipes (training_wizard.recipes.grpo.GRPOTrainingSpec) and the modular recipe with "
                        "an instruction tuning or sequence classification module")
    return translate_rloo(data, path)


def migrated_text(translation: Translation, source: Path | str) -> str:
    """The translated recipe as TOML, headed by one comment line per 1.0 key: where it went, or why it was dropped."""
    from training_wizard.spec import dump_toml

    lines = [f"# Migrated from {source} (a training-wizard 1.0 recipe) by `training-wizard migrate`.",
             "# Every 1.0 key and what became of it:"]
    for note in translation.notes:
        target = f"-> {note.new}" if note.new else "dropped"
        lines.append(f"#   {note.old} {target}" + (f" ({note.reason})" if note.reason else ""))
    return "\n".join(lines) + "\n\n" + dump_toml(translation.recipe)
