"""The recipe base class and `load_recipe`, which picks the recipe class a file names in `recipe_class`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import Field

from training_wizard.errors import UserError
from training_wizard.legacy import is_legacy_recipe, translate_legacy_recipe
from training_wizard.spec import Spec, add_import_roots, import_spec_class, load_spec, read_recipe_file
from training_wizard.trainers.config import DEFAULT_SEED, OUTPUT_DIR_DESCRIPTION, SEED_DESCRIPTION, SEED_RANGE

RECIPE_ALIASES = {
    "rloo": "training_wizard.recipes.rloo.RLOORecipe",
    "ppo": "training_wizard.recipes.ppo.PPORecipe",
    "grpo": "training_wizard.recipes.grpo.GRPORecipe",
    "evaluate": "training_wizard.recipes.evaluate.EvaluateRecipe",
}


class Recipe(Spec):
    """Top-level keys shared by every recipe."""

    output_dir: str = Field(description=OUTPUT_DIR_DESCRIPTION)
    seed: int = Field(DEFAULT_SEED, description=SEED_DESCRIPTION, **SEED_RANGE)
    resume_from_checkpoint: str | None = Field(
        None, description='"latest" (start fresh if there is none yet) or a checkpoint folder to resume from.'
    )

    def main(self, dry_run: bool = False) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load a recipe file, apply `key.path=value` overrides, and validate it as the class `recipe_class` names."""
    path = Path(path)
    data = read_recipe_file(path)
    if is_legacy_recipe(data):  # written for training-wizard 1.0: read through the translation (docs/migrating.md)
        add_import_roots(path)  # its reward classes live next to it
        translation = translate_legacy_recipe(data, path)
        for warning in translation.warnings:
            print(f"warning: {path}: {warning}", file=sys.stderr)
        data = translation.recipe
    for text in overrides or []:
        if text.split("=", 1)[0].strip() == "recipe_class":
            data["recipe_class"] = text.split("=", 1)[1].strip().strip("\"'")
    recipe_class = _recipe_class(data.pop("recipe_class", None), path)
    overrides = [o for o in overrides or [] if o.split("=", 1)[0].strip() != "recipe_class"]
    return load_spec(recipe_class, path, overrides, data=data)


def _recipe_class(name: Any, path: Path) -> type[Recipe]:
    if name is None:
        raise UserError(f"{path}: recipe_class: required key is missing (expected 'rloo', 'ppo' or 'pkg.mod.Class')")
    if not isinstance(name, str):
        raise UserError(f"{path}: recipe_class: expected a string such as 'rloo', got {type(name).__name__}")
    add_import_roots(path)
    try:
        return import_spec_class(RECIPE_ALIASES.get(name, name), Recipe)
    except ValueError as exc:
        raise UserError(f"{path}: recipe_class: {exc}") from None
