"""The PPO recipe: `recipe_class = "ppo"` (or "training_wizard.recipes.ppo.PPORecipe").

The lifecycle (load, plan, resume, train, save) is `OnPolicyRecipe.main` in recipes/on_policy.py; this file adds
the optional `[value_model]` table and builds the `PPOTrainer`.
"""

from __future__ import annotations

from pydantic import Field

from training_wizard.recipes.on_policy import OnPolicyRecipe
from training_wizard.rollout.asynchronous import with_async
from training_wizard.specs.model import TransformerSpec
from training_wizard.trl.configs import PPOConfig
from training_wizard.trainers.algorithms.ppo import PPOTrainer


class PPORecipe(OnPolicyRecipe):
    """Model, prompt data, reward, value model and training arguments of one PPO run."""

    training: PPOConfig = Field(default_factory=PPOConfig, description="PPOConfig options.")
    value_model: TransformerSpec | None = Field(
        None,
        description="The value model: a sequence classifier with one output, or a causal LM whose weights get a new "
        "scalar head; it must use the policy's tokenizer. `lora` trains an adapter and the head. Default: the "
        "reward model when [reward] is a ModelRewardSpec with the policy's vocabulary (as the N+ paper does), "
        "else the policy's starting weights with a new head (and the policy's LoRA settings).",
    )
    trainer_class = PPOTrainer

    def build_trainer(self, config, tokenizer, train_rows, eval_rows, accelerator):
        policy = self.model.apply_lora(self.model.load_causal_lm(config.dtype))
        ref_policy = self.load_reference(config, policy, accelerator)
        value_model = self._load_value_model(config, tokenizer)
        return self.trainer_class(
            config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref_policy, reward_model=self.reward,
            value_model=value_model, train_dataset=train_rows, eval_dataset=eval_rows, accelerator=accelerator,
            source_wrapper=with_async, **self.environment_factory(), **self.teacher_arguments(config, tokenizer),
        )

    def _load_value_model(self, config: PPOConfig, tokenizer):
        """The value model the recipe names, or the default described on the `value_model` field."""
        from training_wizard.specs.reward import ModelRewardSpec
        from training_wizard.specs.value_model import load_value_model

        spec = self.value_model
        if spec is None and isinstance(self.reward, ModelRewardSpec) and self.reward.shares_vocabulary(tokenizer):
            spec = TransformerSpec(pretrained_name=self.reward.pretrained_name, lora=self.model.lora)
        if spec is None:
            spec = self.model  # the policy's starting weights, with its LoRA settings
        return load_value_model(spec, config.dtype, tokenizer)
