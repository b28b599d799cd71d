"""The SFT recipe: `recipe_class = "sft"` (or "training_wizard.recipes.sft.SFTRecipe").

The lifecycle is `SupervisedRecipe.main` (recipes/supervised.py, on recipes/base.py's run lifecycle); this file
names the `[training]` options (SFTConfig), encodes the rows (trainers/supervised/sft.py) and builds the `SFTTrainer`.
Its `model/` is a causal LM folder (a LoRA adapter unless merge_lora) that a later recipe's `[model]` loads as is.
"""

from __future__ import annotations

from pydantic import Field
from rich.console import Console

from training_wizard.recipes.supervised import SupervisedRecipe
from training_wizard.trainers.supervised.config import SFTConfig


class SFTRecipe(SupervisedRecipe):
    """Supervised fine-tuning of a causal LM on prompt/completion, conversational or plain-text rows."""

    training: SFTConfig = Field(default_factory=SFTConfig, description="SFTConfig options.")

    def prepare_tokenizer(self, tokenizer, config: SFTConfig):
        if config.chat_template_path is not None:
            from training_wizard.rollout.chat_templates import load_chat_template

            tokenizer.chat_template = load_chat_template(config.chat_template_path, "training.chat_template_path")
        return tokenizer

    def encode(self, rows, tokenizer, config: SFTConfig, label: str, console: Console) -> list:
        from training_wizard.trainers.supervised.sft import encode_sft_rows, pack_examples

        examples, dropped = encode_sft_rows(rows, tokenizer, config, label, self.row_names(label))
        if dropped:
            console.print(f"note: {label}: {dropped} row(s) have no token to train on (completion empty or cut off "
                          "by training.max_length) and were left out")
        if config.packing and label == "dataset":  # evaluation stays one example per row
            if config.max_length is None:
                from training_wizard.errors import UserError

                raise UserError("training.packing: needs training.max_length (the length of a packed row)")
            packed = pack_examples(examples, config.max_length)
            console.print(f"packing: {len(examples)} examples into {len(packed)} rows of at most "
                          f"{config.max_length} tokens")
            examples = packed
        return examples

    def describe(self, row, tokenizer) -> str:
        trained = [token for token, counted in zip(row.input_ids, row.loss_mask) if counted]
        return (f"{tokenizer.decode(row.input_ids)}\n--- trained on ({len(trained)} of {len(row.input_ids)} "
                f"tokens):\n{tokenizer.decode(trained)}")

    def load_model(self, config: SFTConfig, tokenizer):
        return self.model.apply_lora(self.model.load_causal_lm(config.dtype, tokenizer))

    def build_trainer(self, config, tokenizer, model, train_rows, eval_rows, accelerator):
        from training_wizard.trainers.supervised.sft import SFTTrainer

        return SFTTrainer(config=config, tokenizer=tokenizer, model=model, train_rows=train_rows,
                          eval_rows=eval_rows, accelerator=accelerator)
