"""Sequence classification on the supervised loop (trainers/supervised/loop.py): text rows with an integer label,
a classifier with num_labels outputs, cross-entropy (or binary cross-entropy) averaged over the step's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training_wizard.core.supervised import classification_loss_sums
from training_wizard.errors import UserError
from training_wizard.trainers.supervised.config import SequenceClassificationConfig
from training_wizard.trainers.supervised.loop import SupervisedTrainer


@dataclass
class LabelledText:
    input_ids: list[int]
    label: int


def encode_labelled_rows(rows, tokenizer, config: SequenceClassificationConfig, label: str = "dataset") -> list:
    """Every row as token ids (cut to max_length) and its label, checked against num_labels."""
    classes = 2 if config.loss_type == "binary_cross_entropy" else config.num_labels
    out = []
    for index, row in enumerate(rows):
        where = f"{label} row {index}"
        text, value = row.get(config.text_column), row.get(config.label_column)
        if not isinstance(text, str):
            raise UserError(f"{where}: column '{config.text_column}' must hold text (training.text_column)")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < classes:
            raise UserError(f"{where}: column '{config.label_column}' must be an integer label in [0, {classes}), "
                            f"got {value!r}")
        ids = list(tokenizer(text)["input_ids"])[: config.max_length]
        out.append(LabelledText(ids, value))
    if not out:
        raise UserError(f"{label}: no rows")
    return out


class SequenceClassificationTrainer(SupervisedTrainer):
    """Metrics: `loss` (mean per row) and `accuracy`, and their eval/ versions."""

    config: SequenceClassificationConfig
    metric_names = ("accuracy",)

    def example_weight(self, rows: list[LabelledText]) -> int:
        return len(rows)

    def example_sums(self, rows: list[LabelledText]) -> tuple[torch.Tensor, dict[str, Any]]:
        width = max(len(r.input_ids) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # right padding: the classifier reads the last real token
            ids[i, : len(row.input_ids)] = torch.tensor(row.input_ids)
            mask[i, : len(row.input_ids)] = 1
        device = self.accelerator.device
        logits = self.forward_model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        labels = torch.tensor([r.label for r in rows], device=device)
        loss, correct = classification_loss_sums(logits, labels, self.config.loss_type, self.config.label_smoothing)
        return loss, {"accuracy": correct.float()}
