"""Specs: validated, typed configuration objects read from TOML or JSON recipe files.

Every spec is a pydantic model that rejects unknown keys. A mapping with `spec_class = "pkg.mod.Class"` is
validated as that class instead of the field's declared type, provided it is a subclass of it; this is how a
recipe swaps in its own dataset or reward without touching training-wizard. Errors come out as one line naming the
file, the dotted key path, the TOML line where it can be found, and what was expected.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import tomllib
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_validator

from training_wizard.errors import UserError

# Folder of the recipe being loaded: relative data paths fall back to it (see `resolve_path`).
_recipe_dir: contextvars.ContextVar[Path | None] = contextvars.ContextVar("recipe_dir", default=None)


class Spec(BaseModel):
    """Base of every spec: unknown keys are errors; `spec_class` selects a subclass of the declared type."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    # An abstract spec type names the subclass a table without `spec_class` becomes (e.g. the simple data source).
    default_spec_class: ClassVar[str | None] = None
    # True when built from Python keywords (`GRPOConfig(learning_rate=...)`), False from a recipe's table: errors
    # found later name the key as the user wrote it (`key_path`). Copies (model_copy) keep it.
    _from_keywords: bool = PrivateAttr(False)

    def __init__(self, /, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise KeywordError.of(exc, type(self).__name__) from None
        self._from_keywords = True

    # pydantic calls a subclass's own __init__ from model_validate too, unless marked as its base one: so marked,
    # this runs only for Python keywords, and a recipe's tables validate exactly as before
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        """Equal values are equal specs, however each was built (keywords or a recipe's table)."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment] - mutable, as pydantic's models

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise KeywordError.of(exc, type(self).__name__) from None

    @model_validator(mode="wrap")
    @classmethod
    def _dispatch_spec_class(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("spec_class") or cls.default_spec_class_for(data)
            if name is not None:
                data = {k: v for k, v in data.items() if k != "spec_class"}
                target = import_spec_class(name, cls)
                if target is not cls:
                    return target.model_validate(data)
        return handler(data)

    @classmethod
    def default_spec_class_for(cls, data: dict[str, Any]) -> str | None:
        """The subclass a table without `spec_class` becomes; a spec type whose default depends on the table's keys
        overrides this. Only the declared class's own default counts, never one inherited from a base."""
        return cls.__dict__.get("default_spec_class")

    def to_dict(self) -> dict[str, Any]:
        """Plain data that reloads to an equal spec: every nested spec carries its `spec_class`."""
        out: dict[str, Any] = {"spec_class": f"{type(self).__module__}.{type(self).__qualname__}"}
        for name in type(self).model_fields:
            value = _plain(getattr(self, name))
            if value is not None:
                out[name] = value
        return out


def key_path(spec: Spec, key: str | None, table: str, argument: str = "args") -> str:
    """How the user wrote `key` of `spec` (or, without a key, the spec itself): `table.key` in a recipe,
    `argument.key` for a spec built from Python keywords (a config passed to a trainer as args=)."""
    prefix = argument if spec._from_keywords else table
    return f"{prefix}.{key}" if key else prefix


def shown(value: Any) -> str:
    """A value as a recipe writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)


class KeyValueError(ValueError):
    """A validator's refusal of one of its table's keys. `key` and `detail` let the error line put the key in its
    location (`format_validation_error`, `KeywordError`); the message itself names the key too."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail}")
        self.key, self.detail = key, detail


class KeywordError(ValidationError, UserError):
    """pydantic's ValidationError of a spec built from Python keywords (its `errors()` kept), shown as one line
    naming the class and keyword, as the recipe's error line names the file and key, without pydantic's
    decoration (error counts, input_value=, documentation links)."""

    line: str

    @classmethod
    def of(cls, exc: ValidationError, class_name: str) -> ValidationError:
        errors = exc.errors()
        try:
            made = cls.from_exception_data(exc.title, errors)
        except Exception:  # noqa: BLE001 - an error type pydantic cannot rebuild: the original, as it was
            return exc
        key, error = error_key(errors[0])
        more = f" [and {len(errors) - 1} more error(s)]" if len(errors) > 1 else ""
        text = (f"{error['msg']} (an unknown keyword argument: check the spelling; docs/configuration.md lists "
                "the options)" if error["type"] == "extra_forbidden" else describe_error(error))
        # a check of several keys names them in its own words
        made.line = " ".join(f"{class_name}: {f'{key}: ' if key else ''}{text}{more}".split())
        return made

    def __str__(self) -> str:
        return self.line

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.line!r})"


def _plain(value: Any) -> Any:
    if isinstance(value, Spec):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def import_object(dotted: str) -> Any:
    """Import `pkg.mod.Name` or `pkg.mod:Name`; raises ImportError/AttributeError with the reason."""
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"'{dotted}' is not of the form 'package.module.Name'")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def import_spec_class(dotted: Any, base: type[Spec]) -> type[Spec]:
    """Resolve `spec_class` and check that it is `base` or a subclass of it."""
    if not isinstance(dotted, str):
        raise ValueError(f"spec_class must be a string 'package.module.Class', got {type(dotted).__name__}")
    try:
        target = import_object(dotted)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's path being wrong
        raise ValueError(f"spec_class '{dotted}' could not be imported ({type(exc).__name__}: {exc})") from None
    if not (isinstance(target, type) and issubclass(target, base)):
        raise ValueError(f"spec_class '{dotted}' is not a subclass of {base.__name__}")
    return target


@contextlib.contextmanager
def recipe_directory(folder: Path | None):
    """Within this block, relative data paths may also be relative to `folder` (the recipe file's folder)."""
    token = _recipe_dir.set(folder)
    try:
        yield
    finally:
        _recipe_dir.reset(token)


def current_recipe_directory() -> Path | None:
    """The folder `recipe_directory` set for this block, if any (a spec keeps it for loading its files later)."""
    return _recipe_dir.get()


def resolve_path(path: str | Path) -> Path:
    """A data path as written: absolute, relative to the working directory, or relative to the recipe file."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate
    recipe_dir = _recipe_dir.get()
    if recipe_dir is not None and (recipe_dir / candidate).exists():
        return recipe_dir / candidate
    return candidate


# --------------------------------------------------------------------------------------------------------------
# Loading files and overrides


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """Parse a .toml or .json recipe into a dict; syntax errors become a one-line UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: recipe file not found")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: invalid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a table of keys at the top level")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value); the value is read as TOML, else taken as a plain string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"override '{text}': expected key.path=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """Set each `key.path=value` in `data` (creating tables); returns the dotted keys that were set."""
    keys = []
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"override '{text}': '{part}' is not a table")
            node = child
        node[path[-1]] = value
        keys.append(".".join(path))
    return keys


def load_spec(
    spec_type: type[Spec], path: str | Path, overrides: list[str] | None = None, data: dict | None = None
) -> Spec:
    """Read, override and validate a recipe file as `spec_type` (or the `spec_class`/`recipe_class` it names)."""
    path = Path(path)
    data = read_recipe_file(path) if data is None else data
    override_keys = apply_overrides(data, overrides or [])
    add_import_roots(path)
    with recipe_directory(path.resolve().parent):
        try:
            return spec_type.model_validate(data)
        except ValidationError as exc:
            raise UserError(format_validation_error(exc, path, override_keys)) from None


def add_import_roots(path: Path) -> None:
    """Make `examples.rloo.reward_spec` (from the working directory) and modules next to the recipe importable."""
    for root in (str(Path.cwd()), str(path.resolve().parent)):
        if root not in sys.path:
            sys.path.insert(0, root)


# --------------------------------------------------------------------------------------------------------------
# Error formatting


def format_validation_error(exc: ValidationError, path: Path, override_keys: list[str] | None = None) -> str:
    """One line: `file: key.path (line N): what was expected` for the first error (+ how many more)."""
    errors = exc.errors(include_url=False)
    key, first = error_key(errors[0])
    loc = key.split(".") if key else []
    key = key or "(top level)"
    where = ""
    if override_keys and key in override_keys:
        where = " (command-line override)"
    elif path.suffix.lower() != ".json" and path.is_file():
        line = find_toml_line(path.read_text(encoding="utf-8"), loc)
        where = f" (line {line})" if line else ""
    more = f" [and {len(errors) - 1} more error(s)]" if len(errors) > 1 else ""
    return f"{path}: {key}{where}: {describe_error(first)}{more}"


def error_key(error: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(dotted key, error) of one pydantic error. A table's validator that refuses one of its keys (a
    KeyValueError) names it as `key`, with `detail`: the key then points at it, as for a field's own error."""
    loc = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
    cause = (error.get("ctx") or {}).get("error")
    if getattr(cause, "key", None) and getattr(cause, "detail", None):
        loc, error = [*loc, cause.key], {**error, "msg": cause.detail}
    return ".".join(loc), error


def describe_error(error: dict[str, Any]) -> str:
    """What one pydantic error expected, in words, with the value found (never pydantic's own decoration)."""
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see docs/configuration.md for the keys this section accepts)"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    message = re.sub(r"^(Value|Assertion) error, ", "", message)
    if kind not in ("value_error", "assertion_error") and "input" in error:
        shown = repr(error["input"])
        message += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    return message


def find_toml_line(text: str, loc: list[str]) -> int | None:
    """Best-effort line number of a key path in TOML text: the key under its table header, or the header itself.

    tomllib keeps no positions, so this scans `[table]` headers and `key =` lines; list indices and inline tables
    fall back to the nearest enclosing key.
    """
    names = [part for part in loc if not part.isdigit()]
    table: list[str] = []
    best: tuple[int, int] | None = None  # (matched depth, line)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?$", line)
        if header:
            table = [p.strip().strip("\"'") for p in header.group(1).split(".")]
            depth = _prefix_depth(table, names)
            if depth == len(table) and (best is None or depth > best[0]):
                best = (depth, number)
            continue
        assignment = re.match(r"^([A-Za-z0-9_.\"' -]+?)\s*=", line)
        if assignment:
            key = table + [p.strip().strip("\"'") for p in assignment.group(1).split(".")]
            depth = _prefix_depth(key, names)
            if depth == len(key) and (best is None or depth > best[0]):
                best = (depth, number)
    return best[1] if best else None


def _prefix_depth(candidate: list[str], names: list[str]) -> int:
    depth = 0
    for a, b in zip(candidate, names):
        if a != b:
            break
        depth += 1
    return depth


# --------------------------------------------------------------------------------------------------------------
# Writing TOML (tomllib only reads): used for resolved_config.toml

SECRET_KEY = re.compile(r"(^|_)(token|key|secret|password)$", re.IGNORECASE)
# Names that end like credentials but hold tokenizer vocabulary, not secrets.
NOT_SECRET = {"stop_token", "pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token"}


def is_secret_key(name: str) -> bool:
    return name.lower() not in NOT_SECRET and SECRET_KEY.search(name) is not None


def redact_secrets(data: Any) -> Any:
    """Replace the values of keys that look like credentials (`*_token`, `*_key`, ...) with '<redacted>'."""
    if isinstance(data, dict):
        return {k: ("<redacted>" if is_secret_key(str(k)) and v else redact_secrets(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_secrets(v) for v in data]
    return data


def dump_toml(data: dict[str, Any]) -> str:
    """Serialise nested dicts of scalars and lists as TOML: scalars first, then one [table] per nested dict."""
    lines: list[str] = []
    _dump_table(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _dump_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines.append(f"\n[{'.'.join(_toml_key(p) for p in path)}]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        _dump_table(value, path + [key], lines)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value).replace("inf", "inf") if value == value else "nan"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    return json.dumps(str(value))
