"""The sequence-classification recipe: `recipe_class = "sequence_classification"` (or
"training_wizard.recipes.classification.SequenceClassificationRecipe"), the supervised loop with a classifier;
what training-wizard 1.0's sequence_classification recipes become (training_wizard/legacy/supervised.py)."""

from __future__ import annotations

from pydantic import Field
from rich.console import Console

from training_wizard.errors import UserError
from training_wizard.recipes.supervised import SupervisedRecipe
from training_wizard.trainers.supervised.config import SequenceClassificationConfig


class SequenceClassificationRecipe(SupervisedRecipe):
    """An AutoModelForSequenceClassification trained on text rows with integer labels."""

    training: SequenceClassificationConfig = Field(
        default_factory=SequenceClassificationConfig, description="SequenceClassificationConfig options."
    )

    def encode(self, rows, tokenizer, config, label: str, console: Console) -> list:
        from training_wizard.trainers.supervised.classification import encode_labelled_rows

        return encode_labelled_rows(rows, tokenizer, config, label)

    def describe(self, row, tokenizer) -> str:
        return f"{tokenizer.decode(row.input_ids)}\n--- label: {row.label}"

    def load_model(self, config: SequenceClassificationConfig, tokenizer):
        """The folder as a classifier with num_labels outputs (a causal LM's folder gets a new head)."""
        from transformers import AutoModelForSequenceClassification

        from training_wizard.specs.model import name_model, parse_dtype

        options = {**self.model.from_pretrained_kwargs, "num_labels": config.num_labels,
                   "dtype": parse_dtype(config.dtype), "use_safetensors": True, "local_files_only": True,
                   "trust_remote_code": self.model.trust_remote_code}
        try:
            loaded = AutoModelForSequenceClassification.from_pretrained(self.model.resolved_path(), **options)
            model = name_model(loaded, self.model.model_name())  # the name as written, not the cache folder
        except (OSError, ValueError) as exc:
            raise UserError(f"model.pretrained_name: could not load a sequence classifier: "
                            f"{str(exc).strip().splitlines()[0][:200]}") from None
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
        model.config.pad_token_id = tokenizer.pad_token_id
        if self.model.lora is not None:
            from training_wizard.specs.value_model import with_classifier_lora

            model = with_classifier_lora(model, self.model.lora.to_peft_config())
        return model

    def build_trainer(self, config, tokenizer, model, train_rows, eval_rows, accelerator):
        from training_wizard.trainers.supervised.classification import SequenceClassificationTrainer

        return SequenceClassificationTrainer(config=config, tokenizer=tokenizer, model=model, train_rows=train_rows,
                                             eval_rows=eval_rows, accelerator=accelerator)
