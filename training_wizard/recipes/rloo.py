"""The RLOO recipe: `recipe_class = "rloo"` (or "training_wizard.recipes.rloo.RLOORecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file
names the `[training]` options and builds the `RLOOTrainer`.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.trl.configs import RLOORecipeConfig
from training_wizard.trainers.algorithms.rloo import RLOOTrainer


class RLOORecipe(OnPolicyRecipe):
    """Model, prompt data, reward and training arguments of one RLOO run."""

    training: RLOORecipeConfig = Field(default_factory=RLOORecipeConfig, description="RLOOConfig options.")
    trainer_class = RLOOTrainer
