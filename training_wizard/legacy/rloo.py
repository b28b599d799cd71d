"""1.0's RLOO recipe (`training_wizard.recipes.rloo.RLOOTrainingSpec`), read as today's "rloo"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_wizard.legacy.translation import LEGACY_TABLES, Translation, check_top_keys
from training_wizard.legacy.translators import (
    translate_dataset, translate_model, translate_reward, translate_training, translate_validation,
)


def translate_rloo(data: dict[str, Any], path: Path | str) -> Translation:
    """1.0's RLOO recipe -> "rloo": its tables map one to one onto today's."""
    out = Translation({"recipe_class": "rloo"})
    out.note("spec_class", "recipe_class", "the RLOO recipe")
    check_top_keys(data, path, "RLOO", (*LEGACY_TABLES, "validation"),
                   ("transformer_spec", "dataset_spec", "reward_spec"))
    out.recipe["model"] = translate_model(data["transformer_spec"], "transformer_spec", "model", out)
    if "reference_transformer_spec" in data:
        out.recipe["ref_model"] = translate_model(data["reference_transformer_spec"], "reference_transformer_spec",
                                                  "ref_model", out)
    out.recipe["dataset"] = translate_dataset(data["dataset_spec"], "dataset_spec", "dataset", out)
    translate_training(data.get("training_args_spec", {}), out)
    out.recipe["reward"] = translate_reward(data["reward_spec"], "reward_spec", out)
    if "validation" in data:
        translate_validation(data["validation"], out)
    return out

