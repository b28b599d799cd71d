"""What the supervised recipes (SFT, reward model) share: the model, training and held-out data keys, and their
main(), on the run lifecycle of recipes/base.py (the on-policy recipes' lifecycle): open the run, load and
encode the data, print the plan (and stop there on --dry-run), write the resolved config, build the trainer,
resume if asked, train, save the final model and the report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pydantic import Field, PrivateAttr
from rich.console import Console
from rich.table import Table

from training_wizard.recipes.base import Recipe
from training_wizard.specs.dataset import DataSourceSpec
from training_wizard.specs.model import TransformerSpec
from training_wizard.trainers.supervised.config import SupervisedConfig


class SupervisedRecipe(Recipe):
    """Model, training data and optional held-out data of a supervised run; subclasses add `training` and say
    how rows become examples (`encode`), which model to load (`load_model`) and which trainer runs."""

    model: TransformerSpec = Field(description="The model to train (hub id, local folder, or packaged model).")
    dataset: DataSourceSpec = Field(description="Training rows (formats: docs/pipeline.md).")
    eval_dataset: DataSourceSpec | None = Field(
        None, description="Held-out rows, evaluated every eval_steps and at the end. Default: the rows "
        "`dataset.hold_out` sets aside, when it is set."
    )
    merge_lora: bool = Field(False, description="Save the final model with the LoRA adapter merged into it.")
    training: SupervisedConfig

    # How messages name row i of the rows `load_rows` read under each label ('dataset', 'eval_dataset').
    _row_names: dict[str, Callable[[int], str]] = PrivateAttr(default_factory=dict)

    def load_rows(self, source: DataSourceSpec, label: str):
        """`source`'s rows under `label`; `row_names(label)` then names each with its file and line."""
        rows = source.load(label)
        self._row_names[label] = functools.partial(source.row_name, label=label)
        return rows

    def row_names(self, label: str) -> Callable[[int], str]:
        """How an `encode` names row i in messages: 'dataset row 3 (data/sft.jsonl line 7)' for rows `load_rows`
        read, 'dataset row 3' for others."""
        return self._row_names.get(label) or (lambda index: f"{label} row {index}")

    def prepare_tokenizer(self, tokenizer, config):  # noqa: ARG002 - SFT's uses config
        """The tokenizer the rows are encoded with and model/ is saved with."""
        return tokenizer

    def encode(self, rows, tokenizer, config, label: str, console: Console) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def load_model(self, config, tokenizer):  # pragma: no cover - abstract
        raise NotImplementedError

    def build_trainer(self, config, tokenizer, model, train_rows, eval_rows, accelerator):  # pragma: no cover
        raise NotImplementedError

    def held_out_spec(self) -> DataSourceSpec | None:
        """`[eval_dataset]`, else the part `dataset.hold_out` sets aside, else None."""
        if self.eval_dataset is not None:
            return self.eval_dataset
        if self.dataset.hold_out is not None:
            return self.dataset.model_copy(update={"part": "held_out"})
        return None

    def main(self, dry_run: bool = False) -> None:
        config = self.training_config()
        accelerator, console = self.open_run(config)
        tokenizer = self.prepare_tokenizer(self.model.load_tokenizer(), config)
        train_rows = self.encode(self.load_rows(self.dataset, "dataset"), tokenizer, config, "dataset", console)
        plan = config.supervised_plan(accelerator.num_processes, len(train_rows))
        console.print(_plan_table(plan))
        self.check_can_start(config, accelerator, console)
        held_out = self.held_out_spec()  # loaded at --dry-run too: a broken eval_dataset stops it as it stops a run
        eval_rows = self.encode(self.load_rows(held_out, "eval_dataset"), tokenizer, config, "eval_dataset",
                                console) if held_out is not None else None
        if dry_run:
            self.show_examples(train_rows, tokenizer, console)
            return
        self.prepare_output(accelerator)
        model = self.load_model(config, tokenizer)
        trainer = self.build_trainer(config, tokenizer, model, train_rows, eval_rows, accelerator)
        self.train_and_save(trainer, console, merge_lora=self.merge_lora)

    def describe(self, row, tokenizer) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def show_examples(self, rows: list, tokenizer, console: Console) -> None:
        """--dry-run: the first two training rows as the model will see them."""
        for index in range(min(2, len(rows))):
            console.rule(f"example {index}")
            console.print(self.describe(rows[index], tokenizer), markup=False, highlight=False)


def _plan_table(plan) -> Table:
    table = Table(title="batch plan")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for name, value in plan.rows_table():
        table.add_row(name, str(value))
    return table
