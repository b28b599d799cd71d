"""The reward-model recipe: `recipe_class = "reward_model"` (or
"training_wizard.recipes.reward_model.RewardModelRecipe").

The lifecycle is `SupervisedRecipe.main` (recipes/supervised.py); this file names the `[training]` options
(RewardConfig), encodes the pairs (trainers/supervised/reward_model.py) and builds the `RewardModelTrainer`. Its `model/` is
an AutoModelForSequenceClassification with one output and its tokenizer: a `[reward]` ModelRewardSpec's
`pretrained_name` as it is, and the start of PPO's value model.
"""

from __future__ import annotations

from pydantic import Field
from rich.console import Console

from training_wizard.recipes.supervised import SupervisedRecipe
from training_wizard.trainers.supervised.config import RewardConfig


class RewardModelRecipe(SupervisedRecipe):
    """A sequence classifier with one output trained on chosen/rejected pairs (Bradley-Terry)."""

    training: RewardConfig = Field(default_factory=RewardConfig, description="RewardConfig options.")
    merge_lora: bool = Field(
        True, description="Save the final model with the LoRA adapter merged into it, so that model/ is a plain "
        "sequence classifier that a [reward] spec loads."
    )

    def encode(self, rows, tokenizer, config: RewardConfig, label: str, console: Console) -> list:
        from training_wizard.trainers.supervised.reward_model import encode_pairs, identical_pairs

        where = self.row_names(label)
        pairs, too_long = encode_pairs(rows, tokenizer, config, label, where)
        if too_long:
            console.print(f"note: {label}: {len(too_long)} pair(s) longer than training.max_length "
                          f"({config.max_length} tokens) were left out, as TRL's RewardTrainer does (first: "
                          f"{where(too_long[0])})", markup=False, highlight=False, soft_wrap=True)
        left_out = set(too_long)
        row_of = [index for index in range(len(pairs) + len(too_long)) if index not in left_out]  # pair -> row
        same = identical_pairs(pairs)
        if same:  # kept: dropping them would change what a run trains on; said once, not per row
            console.print(f"warning: {label}: {len(same)} pair(s) have identical chosen and rejected (first: "
                          f"{where(row_of[same[0]])}); they carry no preference signal", markup=False, highlight=False,
                          soft_wrap=True)
        return pairs

    def describe(self, row, tokenizer) -> str:
        return (f"chosen:\n{tokenizer.decode(row.chosen)}\n--- rejected:\n{tokenizer.decode(row.rejected)}"
                f"\n--- margin: {row.margin}")

    def load_model(self, config: RewardConfig, tokenizer):
        """A classifier folder as it is, or a causal LM's weights with a new scalar head (as PPO's value model
        starts; specs/value_model.py); `[model] lora` trains an adapter and the head."""
        from training_wizard.specs.value_model import load_value_model
        from training_wizard.trainers.loop.setup import disable_dropout

        model = load_value_model(self.model, config.dtype, tokenizer)
        if config.disable_dropout:
            disable_dropout(model)
        return model

    def build_trainer(self, config, tokenizer, model, train_rows, eval_rows, accelerator):
        from training_wizard.trainers.supervised.reward_model import RewardModelTrainer

        return RewardModelTrainer(config=config, tokenizer=tokenizer, model=model, train_rows=train_rows,
                                  eval_rows=eval_rows, accelerator=accelerator)
