"""Reading prompt data into a `datasets.Dataset`: local files (json/jsonl, csv, parquet, text; globs, lists,
compressed) and hub datasets by name. Every failure a user can cause becomes a one-line UserError naming the
recipe key and the file or row; nothing here knows about prompts (see specs/dataset.py). `RowLocator` names the
file and line each loaded row came from, for messages about a row.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from training_wizard.errors import UserError
from training_wizard.spec import resolve_path

# File suffix -> `datasets` packaged builder. Compression suffixes (.gz, ...) are looked through.
BUILDERS = {"json": "json", "jsonl": "json", "csv": "csv", "tsv": "csv", "parquet": "parquet", "pq": "parquet",
            "txt": "text", "text": "text"}
_COMPRESSION = {"gz", "bz2", "xz", "zst", "zip", "lz4"}
_GLOB_CHARS = set("*?[")


def expand_data_files(data_files: str | list[str], key: str) -> list[str]:
    """Paths of every file named or matched by a glob, in the order written (globs sorted); missing -> UserError."""
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    paths: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = sorted(glob.glob(str(_resolve_glob(pattern)), recursive=True))
            matches = [m for m in matches if Path(m).is_file()]
            if not matches:
                raise UserError(f"{key}: no file matches the glob '{pattern}'")
            paths.extend(matches)
        else:
            path = resolve_path(pattern)
            if not path.is_file():
                raise UserError(f"{key}: file not found: {pattern}")
            paths.append(str(path))
    return paths


def _resolve_glob(pattern: str) -> Path:
    """Resolve the part of a glob before its first wildcard like any data path (cwd, then recipe folder)."""
    parts = Path(pattern).expanduser().parts
    cut = next(i for i, part in enumerate(parts) if _GLOB_CHARS & set(part))
    prefix = Path(*parts[:cut]) if cut else Path(".")
    return resolve_path(prefix).joinpath(*parts[cut:])


def _last_suffix(path: str) -> str:
    suffixes = [s.lstrip(".").lower() for s in Path(path).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def builder_for(path: str, key: str) -> str:
    """The `datasets` builder ('json', 'csv', 'parquet', 'text') for a file, from its extension."""
    suffixes = [s.lstrip(".").lower() for s in Path(path).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    builder = BUILDERS.get(suffixes[-1]) if suffixes else None
    if builder is None:
        raise UserError(
            f"{key}: unsupported file type '{Path(path).name}' "
            f"(expected one of: {', '.join('.' + s for s in BUILDERS)})"
        )
    return builder


def _has_no_rows(path: str) -> bool:
    """True for an empty or whitespace-only file (the loaders would fail with an unhelpful message)."""
    import fsspec

    try:
        with fsspec.open(path, "rb", compression="infer") as handle:
            for block in iter(lambda: handle.read(1 << 16), b""):
                if block.strip():
                    return False
    except OSError:
        return False  # unreadable: the loader reports it with its reason
    return True


def load_files(paths: list[str], key: str):
    import datasets

    builders = {path: builder_for(path, key) for path in paths}
    if len(set(builders.values())) > 1:
        kinds = ", ".join(sorted(set(builders.values())))
        raise UserError(f"{key}: files of different types cannot be mixed ({kinds})")
    builder = builders[paths[0]]
    for path in paths:
        if _has_no_rows(path):
            raise UserError(f"{key}: {path} has no rows (the file is empty or only blank lines)")
    if builder == "json":
        # Checked before pyarrow sees the file: some malformed rows (a bare `null` line) crash it outright,
        # others make `datasets` log an error line of its own before raising.
        for path in paths:
            reason = _json_problem(path)
            if reason:
                raise UserError(f"{key}: could not read {path}: {reason}")
    library_logger = logging.getLogger("datasets")
    level = library_logger.level
    library_logger.setLevel(logging.CRITICAL)  # its loaders log a parse error before raising: ours is the one line
    tab_separated = {_last_suffix(path) == "tsv" for path in paths}
    if builder == "csv" and len(tab_separated) > 1:
        raise UserError(f"{key}: .csv and .tsv files cannot be mixed (comma- and tab-separated)")
    options = {"sep": "\t"} if tab_separated == {True} else {}
    try:
        return datasets.load_dataset(builder, data_files=paths, split="train", **options)
    except Exception as exc:  # noqa: BLE001 - a file that will not parse is the user's data
        path, reason = _find_bad_file(paths, builder, exc)
        raise UserError(f"{key}: could not read {path}: {reason}") from None
    finally:
        library_logger.setLevel(level)


def _find_bad_file(paths: list[str], builder: str, exc: Exception) -> tuple[str, str]:
    """Which file broke a multi-file load, and a short reason (with the line of a bad JSON Lines row)."""
    import datasets

    if builder == "json":
        for path in paths:
            reason = _json_problem(path)
            if reason:
                return path, reason
    if len(paths) > 1:
        for path in paths:
            try:
                datasets.load_dataset(builder, data_files=[path], split="train")
            except Exception as inner:  # noqa: BLE001
                return path, short_reason(inner)
    return paths[0], short_reason(exc)


def _json_problem(path: str) -> str | None:
    """A one-line reason if a .json/.jsonl file is not valid JSON (or JSON Lines), else None."""
    opener = open
    if path.endswith(".gz"):
        import gzip

        opener = gzip.open  # type: ignore[assignment]
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        return short_reason(exc)
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    else:  # a whole-file JSON document: a list of row objects, or a table (object of columns)
        if isinstance(document, dict) or (isinstance(document, list) and all(isinstance(r, dict) for r in document)):
            return None
        if not isinstance(document, list) and len([line for line in text.splitlines() if line.strip()]) <= 1:
            return f"expected rows as JSON objects, got {type(document).__name__}"
        if isinstance(document, list):
            bad = next(i for i, row in enumerate(document) if not isinstance(row, dict))
            return f"row {bad}: expected a JSON object, got {type(document[bad]).__name__}"
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line, object_pairs_hook=_no_duplicate_keys)
            except json.JSONDecodeError as exc:
                return f"invalid JSON at line {number}: {exc.msg}"
            except ValueError as exc:
                return f"line {number}: {exc}"
            if not isinstance(row, dict):
                return f"line {number}: expected a JSON object, got {type(row).__name__}"
    return None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(f"key {duplicates[0]!r} appears twice in one row")
    return dict(pairs)


def short_reason(exc: BaseException) -> str:
    """The innermost cause of a (possibly wrapped) exception, as one short line."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _env_offline() -> bool:
    return any(os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE")
               for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub endpoint accepts a TCP connection within `timeout` seconds (no request is sent)."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline_mode():
    """Make `datasets`/`huggingface_hub` use the local cache only: their flags are read at import time, so an
    environment variable set later (or an unreachable Hub) would otherwise mean minutes of retries."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def load_hub(name: str, subset: str | None, split: str, key: str):
    import datasets

    offline = _env_offline() or not hub_reachable()
    context = _offline_mode() if offline else contextlib.nullcontext()
    try:
        with context:
            return datasets.load_dataset(name, subset, split=split)
    except Exception as exc:  # noqa: BLE001 - unknown name, no network, no cache: all fixable by the user
        where = "offline and not in the local datasets cache" if offline else short_reason(exc)
        raise UserError(
            f"{key}: could not load hub dataset '{name}' (split '{split}'): {where}; "
            "use data_files with local files, or download it once with network access"
        ) from None


# --------------------------------------------------------------------------------------------------------------
# Where a row came from


class RowLocator:
    """Names the file and place of each row `load_files(paths)` gave, reading the files again on first use only
    (messages about a bad row need it; a good run never does).

    Lines are physical line numbers, blank lines included (a CSV header is line 1); items of a JSON list and rows
    of a parquet file count from 0, as the dataset's rows do. If the files do not give `rows` rows in all (edited
    since, or laid out in a way not recognised here), no row is located rather than a wrong one.
    """

    def __init__(self, paths: list[str], rows: int):
        self.paths, self.rows = paths, rows
        self._places: list[tuple[str, str, Sequence[int]]] | None = None

    def origin(self, raw_index: int) -> str | None:
        """'data/sft.jsonl line 7' for row `raw_index` of the loaded files; None where it cannot be told."""
        if self._places is None:
            self._places = self._read_places()
        for path, unit, numbers in self._places:
            if raw_index < len(numbers):
                return f"{_display_path(path)} {unit} {numbers[raw_index]}"
            raw_index -= len(numbers)
        return None

    def _read_places(self) -> list[tuple[str, str, Sequence[int]]]:
        try:
            places = [(path, *_row_places(path)) for path in self.paths]
        except (OSError, ValueError, csv.Error):  # unreadable now: the message goes without the file's line
            return []
        return places if sum(len(numbers) for _, _, numbers in places) == self.rows else []


def _row_places(path: str) -> tuple[str, Sequence[int]]:
    """('line', line numbers), ('item', positions) or ('row', positions) of each row of one file, as the
    `datasets` builder for its type reads it."""
    import fsspec

    builder = builder_for(path, "data_files")
    if builder == "parquet":
        import pyarrow.parquet

        return "row", range(pyarrow.parquet.ParquetFile(path).metadata.num_rows)
    if builder == "csv":
        with fsspec.open(path, "rt", compression="infer", encoding="utf-8", newline="") as handle:
            return "line", _csv_record_lines(handle, "\t" if _last_suffix(path) == "tsv" else ",")
    with fsspec.open(path, "rt", compression="infer", encoding="utf-8") as handle:
        text = handle.read()
    if builder == "text":
        return "line", range(1, len(text.splitlines()) + 1)  # the text builder keeps blank lines as rows
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None  # JSON Lines
    if isinstance(document, list):
        return "item", range(len(document))
    # JSON Lines skip blank lines; a whole-file object is one row, which starts at its first line.
    lines = [number for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    return "line", lines[:1] if isinstance(document, dict) else lines


def _csv_record_lines(handle, delimiter: str) -> list[int]:
    """The line each data record of a CSV file starts on: a quoted field may span lines, and blank lines are
    skipped (as pandas, behind the csv builder, does)."""
    reader = csv.reader(handle, delimiter=delimiter)
    starts, line = [], 0
    for record in reader:
        if record:
            starts.append(line + 1)
        line = reader.line_num
    return starts[1:]  # the first record is the header


def _display_path(path: str) -> str:
    """A path under the working directory relative to it (as a user would write it); others as they are."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


# --------------------------------------------------------------------------------------------------------------
# Template source: build conversational prompts from a parent's columns
