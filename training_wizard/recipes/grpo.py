"""The GRPO recipe: `recipe_class = "grpo"` (or "training_wizard.recipes.grpo.GRPORecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file
names the `[training]` options and builds the `GRPOTrainer`.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.trl.configs import GRPOConfig
from training_wizard.trainers.algorithms.grpo import GRPOTrainer


class GRPORecipe(OnPolicyRecipe):
    """Model, prompt data, reward and training arguments of one GRPO run."""

    training: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPOConfig options.")
    trainer_class = GRPOTrainer
