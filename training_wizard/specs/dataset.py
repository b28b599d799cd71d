"""Data source specs: each loads a `datasets.Dataset` of prompt-only rows.

Rows are standard `{"prompt": "..."}` or conversational `{"prompt": [{"role": ..., "content": ...}, ...]}`
(last message from the user). Other columns travel with each row to the reward spec.

Every source shares the preprocessing keys of `DataSourceSpec` (`columns`, `rename_columns`, `shuffle`,
`shuffle_seed`, `take`, `filter_length`). A subclass implements `load_raw(label)`; `load(label)` applies the
preprocessing on top. `label` is the dotted key of the source in the recipe (`dataset`, `dataset.parent`,
`dataset.sources[1]`) so that errors name the key a user has to fix. After `load`, `row_name(i, label)` names
row i with the file and line it came from, for messages about that row.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from training_wizard.errors import UserError
from training_wizard.spec import Spec, current_recipe_directory, recipe_directory
from training_wizard.specs.chat_rendering import render_chat
from training_wizard.specs.data_files import (
    RowLocator,
    expand_data_files,
    load_files,
    load_hub,
    short_reason,
)

ROLES = ("system", "user", "assistant")
# a prompt may also hold tool results (a worked exchange with a tool call, as TRL's prompts may): never trained on
PROMPT_ROLES = (*ROLES, "tool")
# A prompt may use at most this fraction of response_length tokens when filter_length is on (as in training-wizard 1.0's RLOO example).
FILTER_LENGTH_FRACTION = 0.9


class DataSourceSpec(Spec):
    """Base of every data source: preprocessing keys shared by all sources; `load()` returns a `datasets.Dataset`.

    A [dataset] table without `spec_class` is a `SimpleDataSourceSpec`. Preprocessing runs in this order:
    `columns` (select), `rename_columns`, `shuffle`, `take`.
    """

    default_spec_class = "training_wizard.specs.dataset.SimpleDataSourceSpec"

    columns: list[str] | None = Field(None, description="Keep only these columns (names before renaming).")
    rename_columns: dict[str, str] | None = Field(None, description="Rename columns: {old = new}.")
    shuffle: bool = Field(False, description="Shuffle the rows (seeded by shuffle_seed) before `take`.")
    shuffle_seed: int = Field(42, description="Seed of the shuffle; the same seed gives the same order.")
    take: int | None = Field(None, gt=0, description="Keep the first N rows (after shuffling, if shuffle).")
    filter_length: bool = Field(
        False,
        description="Drop prompts longer than 0.9 * response_length policy tokens (the recipe applies it with "
        "`filter_long_prompts`, since it needs the policy tokenizer).",
    )
    hold_out: float | None = Field(
        None, gt=0, description="Rows set aside for evaluation, from the end after shuffle and take: a count (>= 1) "
        "or a share of the rows (< 1). The source then yields the other rows, or these with part = 'held_out'.",
    )
    part: Literal["rest", "held_out"] = Field(
        "rest", description="With hold_out: 'rest' (training) or 'held_out' (an eval_dataset over the same source)."
    )

    # Position in `load_raw`'s rows of each row the last `load()` returned.
    _raw_rows: list[int] = PrivateAttr(default_factory=list)

    def load_raw(self, label: str = "dataset"):
        """The rows before preprocessing; subclasses implement this."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_raw()")

    def load(self, label: str = "dataset"):
        """Return a `datasets.Dataset`: `load_raw` followed by the preprocessing keys."""
        import datasets

        raw = self.load_raw(label)
        rows = self.preprocess(raw, label)
        # The same row choices (shuffle, take, hold_out: the datasets library's own) made on a one-column table of
        # positions give each returned row's position in `raw`, without touching (or copying) the data itself. A
        # list, not an array, since pydantic compares private attributes when specs are compared.
        positions = self.select_rows(datasets.Dataset.from_dict({"row": range(len(raw))}), label)
        self._raw_rows = positions.with_format("arrow")["row"].to_numpy().tolist()
        return rows

    def raw_row_origin(self, raw_index: int) -> str | None:
        """Where row `raw_index` of `load_raw` came from ('data/sft.jsonl line 7'); None where unknown. Sources
        that know override this."""
        return None

    def row_origin(self, index: int) -> str | None:
        """Where row `index` of the last `load()` came from; None where unknown."""
        return self.raw_row_origin(self._raw_rows[index]) if 0 <= index < len(self._raw_rows) else None

    def row_name(self, index: int, label: str = "dataset") -> str:
        """Row `index` of the last `load(label)`, as messages name it: 'dataset row 3 (data/sft.jsonl line 7)', or
        'dataset row 3' where its origin is unknown."""
        origin = self.row_origin(index)
        return f"{label} row {index} ({origin})" if origin else f"{label} row {index}"

    def preprocess(self, ds, label: str = "dataset"):
        """Apply `columns`, `rename_columns`, `shuffle` and `take`, in that order."""
        if self.columns is not None:
            _require_columns(ds, self.columns, f"{label}.columns")
            ds = ds.select_columns(self.columns)
        if self.rename_columns:
            _require_columns(ds, list(self.rename_columns), f"{label}.rename_columns")
            clashes = [new for old, new in self.rename_columns.items()
                       if new in ds.column_names and new not in self.rename_columns]
            if clashes:
                raise UserError(f"{label}.rename_columns: target column '{clashes[0]}' already exists")
            ds = ds.rename_columns(dict(self.rename_columns))
        return self.select_rows(ds, label)

    def select_rows(self, ds, label: str = "dataset"):
        """`shuffle`, `take` and `hold_out`: which rows, in which order (they depend on the row count alone)."""
        if self.shuffle:
            ds = ds.shuffle(seed=self.shuffle_seed)
        if self.take is not None:
            ds = ds.select(range(min(self.take, len(ds))))
        if self.hold_out is not None:
            ds = self._split_held_out(ds, label)
        return ds

    def _split_held_out(self, ds, label: str):
        held = int(self.hold_out) if self.hold_out >= 1 else round(self.hold_out * len(ds))
        if not 0 < held < len(ds):
            raise UserError(f"{label}.hold_out: {self.hold_out} leaves {held} of {len(ds)} rows held out; expected "
                            "at least one row in each part")
        first_held = len(ds) - held
        return ds.select(range(first_held, len(ds)) if self.part == "held_out" else range(first_held))


def _require_columns(ds, names: list[str], key: str) -> None:
    missing = [name for name in names if name not in ds.column_names]
    if missing:
        raise UserError(f"{key}: column '{missing[0]}' not found (columns: {', '.join(ds.column_names)})")


# --------------------------------------------------------------------------------------------------------------
# Simple source: local files or a hub dataset


class SimpleDataSourceSpec(DataSourceSpec):
    """Local files (json, jsonl, csv, parquet, txt; a path, a glob or a list) or a hub dataset by name."""

    data_files: str | list[str] | None = Field(
        None, description="Local file(s) or glob(s), relative to the working directory or to the recipe file."
    )
    name: str | None = Field(None, description="Hub dataset name (offline: must be in the local datasets cache).")
    subset: str | None = Field(None, description="Hub dataset configuration (subset) name.")
    split: str = Field("train", description="Split to load from a hub dataset.")

    # Folder of the recipe this spec was read from: relative data_files may be relative to it (see resolve_path),
    # and `load()` runs after the recipe loader has left that context.
    _base_dir: Path | None = PrivateAttr(default_factory=current_recipe_directory)
    # Names the file and line of each row of the last load of local files; None for a hub dataset.
    _locator: RowLocator | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_origin(self) -> SimpleDataSourceSpec:
        if (self.data_files is None) == (self.name is None):
            raise ValueError("set exactly one of data_files (local files) or name (hub dataset)")
        if isinstance(self.data_files, list) and not self.data_files:
            raise ValueError("data_files: empty list")
        return self

    def load_raw(self, label: str = "dataset"):
        self._locator = None
        if self.name is not None:
            return load_hub(self.name, self.subset, self.split, f"{label}.name")
        with recipe_directory(self._base_dir or current_recipe_directory()):
            paths = expand_data_files(self.data_files, f"{label}.data_files")
        rows = load_files(paths, f"{label}.data_files")
        self._locator = RowLocator(paths, len(rows))
        return rows

    def raw_row_origin(self, raw_index: int) -> str | None:
        return self._locator.origin(raw_index) if self._locator is not None else None


class MessageTemplate(BaseModel):
    """One chat message of `messages_template`; `{column}` fields in `content` are filled from the row."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class TemplateInstructDatasourceSpec(DataSourceSpec):
    """Conversational `prompt` from a template filled with each parent row's columns (as in training-wizard 1.0's RLOO example).

    `{text}` is replaced by the row's `text` column (Python `str.format` syntax: `{{`/`}}` are literal braces).
    The parent's columns are kept, so the reward sees them; a parent `prompt` column is replaced.
    """

    parent: DataSourceSpec = Field(description="The source whose rows fill the template (any data source).")
    messages_template: list[MessageTemplate] = Field(
        description="Chat messages [{role, content}]; the last must be the user's (unless output_column = "
        "'messages')."
    )
    output_column: Literal["prompt", "messages"] = Field(
        "prompt", description="'prompt': a prompt for online RL; 'messages': a whole conversation for SFT (the "
        "template may then end with the assistant's message)."
    )

    @model_validator(mode="after")
    def _prompt_ends_with_the_user(self) -> TemplateInstructDatasourceSpec:
        if self.output_column == "prompt" and self.messages_template[-1].role != "user":
            raise ValueError("messages_template: the last message must have role 'user'")
        return self

    @field_validator("messages_template")
    @classmethod
    def _check_template(cls, messages: list[MessageTemplate]) -> list[MessageTemplate]:
        if not messages:
            raise ValueError("at least one message is required")
        for position, message in enumerate(messages):
            try:
                fields = template_fields(message.content)
            except ValueError as exc:
                raise ValueError(f"[{position}].content: {exc}") from None
            if any(not f or f.isdigit() for f in fields):
                raise ValueError(f"[{position}].content: use named fields such as {{text}}, not {{}} or {{0}}")
        return messages

    def load_raw(self, label: str = "dataset"):
        parent = self.parent.load(f"{label}.parent")
        for position, message in enumerate(self.messages_template):
            for field in template_fields(message.content):
                if field not in parent.column_names:
                    raise UserError(
                        f"{label}.messages_template[{position}].content: field {{{field}}} is not a column of "
                        f"the parent dataset (row 0 has: {', '.join(parent.column_names)})"
                    )
        templates = [(m.role, m.content) for m in self.messages_template]

        column = self.output_column

        def fill(row: dict[str, Any], index: int) -> dict[str, Any]:
            return {column: [
                {"role": role, "content": _fill(content, row, index, label, position)}
                for position, (role, content) in enumerate(templates)
            ]}

        remove = [column] if column in parent.column_names else None
        return parent.map(fill, with_indices=True, remove_columns=remove, load_from_cache_file=False)

    def raw_row_origin(self, raw_index: int) -> str | None:
        return self.parent.row_origin(raw_index)  # one row per parent row, in the parent's order


def template_fields(text: str) -> list[str]:
    """Names of the `{field}` placeholders of a template (`{a.b}`/`{a[0]}` count as field `a`)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(text):
        if field is not None:
            names.append(field.split(".", 1)[0].split("[", 1)[0])
    return names


def _fill(template: str, row: dict[str, Any], index: int, label: str, position: int) -> str:
    for field in template_fields(template):
        if row.get(field) is None:
            raise UserError(
                f"{label} row {index}: column '{field}' used by messages_template[{position}].content is empty (null)"
            )
    try:
        return template.format_map(row)
    except (KeyError, AttributeError, IndexError, ValueError) as exc:
        raise UserError(f"{label} row {index}: messages_template[{position}].content: cannot fill ({exc})") from None


# --------------------------------------------------------------------------------------------------------------
# Several sources


class MultiDataSourceSpec(DataSourceSpec):
    """Rows of several sources, concatenated in order; a column missing from a source is null in its rows."""

    sources: list[DataSourceSpec] = Field(min_length=1, description="The sources (any data source each).")

    # Rows of each source in the last load, to find the source of a row of the concatenation.
    _source_rows: list[int] = PrivateAttr(default_factory=list)

    def raw_row_origin(self, raw_index: int) -> str | None:
        for source, rows in zip(self.sources, self._source_rows):
            if raw_index < rows:
                return source.row_origin(raw_index)
            raw_index -= rows
        return None

    def load_raw(self, label: str = "dataset"):
        import datasets

        parts = [source.load(f"{label}.sources[{i}]") for i, source in enumerate(self.sources)]
        self._source_rows = [len(part) for part in parts]
        _check_prompt_formats(parts, label)
        features: dict[str, Any] = {}
        for part in parts:
            for name, feature in part.features.items():
                features.setdefault(name, feature)
        aligned = []
        for i, part in enumerate(parts):
            for name, feature in features.items():
                if name not in part.column_names:
                    part = part.add_column(name, [None] * len(part), feature=feature)
            part = part.select_columns(list(features))
            try:
                part = part.cast(datasets.Features(features))
            except Exception as exc:  # noqa: BLE001 - incompatible column types across sources
                raise UserError(
                    f"{label}.sources[{i}]: columns do not match source 0's types ({short_reason(exc)})"
                ) from None
            aligned.append(part)
        return datasets.concatenate_datasets(aligned)


def _prompt_format(ds) -> str | None:
    feature = ds.features.get("prompt")
    if feature is None:
        return None
    dtype = getattr(feature, "dtype", None)
    return "standard (string)" if dtype in ("string", "large_string") else "conversational (list of messages)"


def _check_prompt_formats(parts: list, label: str) -> None:
    formats = [_prompt_format(part) for part in parts]
    present = [(i, f) for i, f in enumerate(formats) if f is not None]
    for i, fmt in present[1:]:
        if fmt != present[0][1]:
            raise UserError(
                f"{label}.sources[{i}]: prompts are {fmt} but sources[{present[0][0]}] has {present[0][1]} "
                "prompts; use one format (e.g. a messages_template for every source)"
            )


# --------------------------------------------------------------------------------------------------------------
# Validation and length filtering (called by the recipe)


def validate_prompt_row(row: dict[str, Any], index: int, label: str = "dataset") -> None:
    """Raise a UserError naming the row and field if `row` is not a valid prompt-only row."""
    where = f"{label} row {index}"
    if not isinstance(row, Mapping):
        raise UserError(f"{where}: expected a row like {{'prompt': ...}}, got {type(row).__name__} {row!r}"[:300])
    check_prompt(row.get("prompt"), where)


def check_prompt(prompt: Any, where: str) -> None:
    """Raise a UserError starting with `where` (the row) if `prompt` is neither a non-empty string nor a list of
    messages ending with the user's."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise UserError(f"{where}: prompt: empty string")
        return
    if not isinstance(prompt, list) or not prompt:
        raise UserError(f"{where}: prompt: expected a string or a list of messages, got {prompt!r}"[:300])
    for position, message in enumerate(prompt):
        if not isinstance(message, dict) or message.get("role") not in PROMPT_ROLES:
            raise UserError(f"{where}: prompt[{position}].role: expected system, user, assistant or tool")
        if not isinstance(message.get("content"), str):
            raise UserError(f"{where}: prompt[{position}].content: expected a string")
    if prompt[-1]["role"] != "user":
        raise UserError(f"{where}: prompt: the last message must be from the user")


ROLE_HINT = ("expected system, user or assistant (or a role listed in training.extra_roles, if the chat template "
             "renders it)")


def check_roles(messages: list[dict[str, Any]], extra_roles: list[str], where: str,
                column: str = "messages") -> None:
    """Refuse a message whose role is not system, user, assistant or one of `extra_roles` (the supervised recipes'
    rows): a chat template may render an unknown role as anything or drop it, and its tokens would train as that."""
    for position, message in enumerate(messages):
        role = message.get("role")
        name = f"message {position}" if column == "messages" else f"{column} message {position}"
        if not isinstance(role, str):
            raise UserError(f"{where}: {name} has no 'role' string; {ROLE_HINT}")
        if role not in ROLES and role not in extra_roles:
            raise UserError(f"{where}: {name} has role {role[:40]!r}; {ROLE_HINT}")


def validate_prompts(dataset, source_label: str = "dataset") -> None:
    """Check every row of a loaded dataset (see `validate_prompt_row`); the first bad row raises a UserError."""
    if "prompt" not in dataset.column_names:
        raise UserError(
            f"{source_label}: no 'prompt' column (columns: {', '.join(dataset.column_names)}); "
            "use rename_columns or a TemplateInstructDatasourceSpec"
        )
    if len(dataset) == 0:
        raise UserError(f"{source_label}: the dataset has no rows")
    for index, prompt in enumerate(dataset["prompt"]):
        validate_prompt_row({"prompt": prompt}, index, source_label)


def prompt_token_counts(prompts: list, tokenizer) -> list[int]:
    """Policy tokens per prompt as generation sees it (chat template + generation prompt for conversations)."""
    conversational = [p for p in prompts if isinstance(p, list)]
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise UserError("dataset: conversational prompts need a tokenizer with a chat template")
    counts = [0] * len(prompts)
    chats = [i for i, p in enumerate(prompts) if isinstance(p, list)]
    plains = [i for i, p in enumerate(prompts) if not isinstance(p, list)]
    if chats:
        texts = [render_chat(tokenizer, prompts[i], add_generation_prompt=True, tokenize=False) for i in chats]
        # The chat template already writes any BOS token, so no special tokens are added again.
        for i, ids in zip(chats, tokenizer(texts, add_special_tokens=False)["input_ids"]):
            counts[i] = len(ids)
    if plains:
        for i, ids in zip(plains, tokenizer([str(prompts[i]) for i in plains])["input_ids"]):
            counts[i] = len(ids)
    return counts


def filter_long_prompts(dataset, tokenizer, response_length: int) -> tuple[Any, int]:
    """Drop rows whose prompt is longer than 0.9 * response_length tokens (the `filter_length` of training-wizard 1.0's RLOO example).

    Returns (filtered dataset, number of rows dropped); the order of the kept rows is unchanged.
    """
    limit = FILTER_LENGTH_FRACTION * response_length
    counts = prompt_token_counts(list(dataset["prompt"]), tokenizer)
    keep = [i for i, count in enumerate(counts) if count <= limit]
    dropped = len(dataset) - len(keep)
    if dropped == 0:
        return dataset, 0
    return dataset.select(keep), dropped
