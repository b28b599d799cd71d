"""The RLOO recipe: `recipe_class = "rloo"` (or "training_wizard.recipes.rloo.RLOORecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file
names the `[training]` options and builds the `RLOOTrainer`.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.trainers.config import RLOORecipeConfig


class RLOORecipe(OnPolicyRecipe):
    """Model, prompt data, reward and training arguments of one RLOO run."""

    training: RLOORecipeConfig = Field(default_factory=RLOORecipeConfig, description="RLOOConfig options.")

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        ref_policy = self.load_reference(config, policy, accelerator)
        from training_wizard.trainers.rloo import RLOOTrainer

        return RLOOTrainer(
            config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref_policy, reward_model=self.reward,
            train_dataset=train_rows, eval_dataset=eval_rows, accelerator=accelerator,
        )
