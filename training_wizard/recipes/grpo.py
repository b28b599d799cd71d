"""The GRPO recipe: `recipe_class = "grpo"` (or "training_wizard.recipes.grpo.GRPORecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file
names the `[training]` options and builds the `GRPOTrainer`.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.trainers.config import GRPOConfig


class GRPORecipe(OnPolicyRecipe):
    """Model, prompt data, reward and training arguments of one GRPO run."""

    training: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPOConfig options.")

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        # beta = 0 (TRL's default): the loss has no KL term, so no reference model is loaded at all
        ref_policy = self.load_reference(config, policy, accelerator) if config.uses_reference else None
        from training_wizard.trainers.grpo import GRPOTrainer

        return GRPOTrainer(
            config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref_policy, reward_model=self.reward,
            train_dataset=train_rows, eval_dataset=eval_rows, accelerator=accelerator,
        )
