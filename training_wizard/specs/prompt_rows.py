"""The prompts a Python trainer is given (`train_dataset=`, `eval_dataset=`: a datasets.Dataset or a list of rows),
checked before a model is loaded, with errors that name the argument and the row as the caller wrote them
(`train_dataset[1]: prompt: ...`), as a recipe's errors name its file and key.

A row is a mapping with a `prompt` (a string, or a list of messages ending with the user's) or, pre-tokenised,
`input_ids`; its other columns travel to the reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

from training_wizard.errors import UserError
from training_wizard.specs.dataset import check_prompt

EXPECTED = "pass a datasets.Dataset with a 'prompt' column or a list of rows like {'prompt': ...}"


def check_prompt_rows(rows: Any, argument: str) -> None:
    """A UserError naming `argument` (and the row, `argument[i]`) for rows a trainer cannot take. Iterables other
    than a list, a tuple or a Dataset are left to the trainer, which reads them once."""
    if isinstance(rows, (str, bytes, PathLike)):
        raise UserError(f"{argument}: got the {type(rows).__name__} {str(rows)[:80]!r}, not rows; load a file with "
                        f"datasets.load_dataset('json', data_files=...)['train'], or {EXPECTED}")
    if isinstance(rows, Mapping):
        raise UserError(f"{argument}: got a dict (keys {', '.join(repr(str(key)) for key in list(rows)[:5])}), not rows; for columns "
                        f"use datasets.Dataset.from_dict(...), or {EXPECTED}")
    if hasattr(rows, "column_names") and hasattr(rows, "__len__"):
        check_dataset(rows, argument)
    elif isinstance(rows, (list, tuple)):
        if not rows:
            raise UserError(f"{argument}: no rows (an empty {type(rows).__name__}); {EXPECTED}")
        for index, row in enumerate(rows):
            check_row(row, f"{argument}[{index}]")
    elif not hasattr(rows, "__iter__"):
        raise UserError(f"{argument}: expected a datasets.Dataset or a list of rows, got {type(rows).__name__}")


def check_trainer_datasets(train_dataset: Any, eval_dataset: Any = None) -> None:
    """A trainer's train_dataset and, when given, eval_dataset, each checked by `check_prompt_rows`."""
    check_prompt_rows(train_dataset, "train_dataset")
    if eval_dataset is not None:
        check_prompt_rows(eval_dataset, "eval_dataset")


def check_dataset(dataset: Any, argument: str) -> None:
    """A datasets.Dataset's columns and prompts."""
    columns = list(dataset.column_names or [])
    if "prompt" not in columns and "input_ids" not in columns:
        raise UserError(f"{argument}: no 'prompt' column (columns: {', '.join(columns) or 'none'}); rename the "
                        "prompt column (dataset.rename_column(..., 'prompt'))")
    if len(dataset) == 0:
        raise UserError(f"{argument}: no rows (an empty dataset)")
    if "prompt" in columns:
        for index, prompt in enumerate(dataset["prompt"]):
            if prompt is not None or "input_ids" not in columns:
                check_prompt(prompt, f"{argument}[{index}]")


def check_row(row: Any, where: str) -> None:
    """One row of a list: a mapping with a valid prompt, or pre-tokenised input_ids."""
    if not isinstance(row, Mapping):
        shown = repr(row)
        example = f"{{'prompt': {shown}}}" if isinstance(row, str) else "{'prompt': ...}"
        raise UserError(f"{where}: expected a row like {example[:80]}, got the {type(row).__name__} {shown[:80]}")
    if "input_ids" in row and "prompt" not in row:
        return
    if "prompt" not in row:
        keys = ", ".join(repr(str(key)) for key in list(row)[:5]) or "no keys"
        raise UserError(f"{where}: no 'prompt' (the row has {keys}); expected a 'prompt' string or list of messages")
    check_prompt(row["prompt"], where)
