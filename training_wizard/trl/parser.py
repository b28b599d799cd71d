"""`TrlParser`: TRL's command-line parser of argument classes, for TRL scripts that import it from here.

As TRL's (an HfArgumentParser), each field of each class is an option `--name value`, and
`parse_args_and_config()` reads `--config file.yaml` first: the YAML's keys set the values, flags on the command
line override them, and an `env:` mapping in the YAML is put into os.environ. The classes may be dataclasses
(ScriptArguments, ModelConfig, a script's own) or this library's pydantic configs (GRPOConfig, RLOOConfig, ...),
whose fields, aliases and accepted TRL keys (trl/keys.py) all become options; the config validates
the values itself. A name two classes declare goes to both (dtype: ModelConfig's and the config's).

A mistake on the command line or in the YAML ends in one line `error: ...` and exit code 2, as argparse's own do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import BaseModel

from training_wizard.errors import USER_ERROR_EXIT_CODE, UserError

NONE_WORDS = ("None", "none", "null")


def to_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "t", "y"):
        return True
    if lowered in ("false", "no", "0", "f", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def scalar(text: str) -> Any:
    """A value of unknown type as a YAML file would hold it (number, true/false, None), else the text."""
    if text in NONE_WORDS:
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def none_or(kind):
    def convert(text: str) -> Any:
        return None if text in NONE_WORDS else kind(text)
    convert.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in "invalid <type> value"
    return convert


def json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON ({exc.msg}), got {text!r}") from None


def plain_type(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None and Annotated metadata, whether None is allowed)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    if args and type(None) in args and typing.get_origin(annotation) is not Literal:
        rest = [arg for arg in args if arg is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        return plain_type(inner)[0], True
    return annotation, False


def option_settings(annotation: Any) -> dict[str, Any]:
    """argparse settings of a field of this type: a flag for booleans (`--bf16` or `--bf16 false`), several
    values for lists, choices for Literal, JSON for mappings, YAML-like scalars for anything else."""
    kind, optional = plain_type(annotation)
    origin = typing.get_origin(kind)
    if kind is bool:
        return {"nargs": "?", "const": True, "type": to_bool}
    if origin is Literal:
        choices = list(typing.get_args(kind)) + ([None] if optional else [])
        return {"type": none_or(type(choices[0])), "choices": choices}
    if kind in (int, float, str):
        return {"type": none_or(kind) if optional else kind}
    if origin is list or kind is list:
        item = (typing.get_args(kind) or (str,))[0]
        return {"nargs": "+", "type": item if item in (int, float, str) else scalar}
    if origin is dict or kind is dict:
        return {"type": json_object}
    return {"nargs": "+", "type": scalar, "single": True}


def declared_fields(cls: type) -> dict[str, tuple[Any, str]]:
    """{input name: (annotation, help)} of a dataclass's init fields or a pydantic model's fields and aliases."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        return {f.name: (hints.get(f.name, Any), f.metadata.get("help", "")) for f in dataclasses.fields(cls)
                if f.init}
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        names = {}
        for name, info in cls.model_fields.items():
            alias = info.validation_alias
            for given in [name, *getattr(alias, "choices", [alias] if isinstance(alias, str) else [])]:
                names[given] = (info.annotation, info.description or "")
        return names
    raise UserError(f"TrlParser: {getattr(cls, '__name__', cls)!r} is neither a dataclass nor a pydantic model")


def trl_key_names(cls: type) -> list[str]:
    """The TRL 1.16 keys a config reads besides its fields (translated or refused by itself, trl/keys.py)."""
    from training_wizard.trl.keys import TRLKeys, TRL_KEYS

    return list(TRL_KEYS) if isinstance(cls, type) and issubclass(cls, TRLKeys) else []


class TrlParser(argparse.ArgumentParser):
    """TRL's TrlParser: `TrlParser((ScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config()` returns
    one instance of each class, read from `--config x.yaml` and the command line's flags."""

    def __init__(self, dataclass_types: type | Iterable[type] | None = None, **kwargs):
        if dataclass_types is None:
            dataclass_types = []
        elif isinstance(dataclass_types, type):
            dataclass_types = [dataclass_types]
        kwargs.setdefault("allow_abbrev", False)  # a prefix of a flag must not silently pick one of hundreds
        super().__init__(**kwargs)
        self.dataclass_types = list(dataclass_types)
        self._config_values: dict[str, Any] = {}
        self._owners: dict[str, list[type]] = {}  # option name -> the classes its value goes to
        self._singles: set[str] = set()  # options of unknown type: one value is that value, several a list
        fields = {cls: declared_fields(cls) for cls in self.dataclass_types}
        for cls, names in fields.items():
            if "config" in names:
                raise UserError(f"TrlParser: {cls.__name__} has a field named config; the name is the flag of the "
                                "YAML file (--config)")
            for name, (annotation, help_text) in names.items():
                self._add_option(cls, name, annotation, help_text)
        for cls in self.dataclass_types:  # TRL keys go to a config only when no class declares the name
            for name in trl_key_names(cls):
                if name not in self._owners:
                    self._add_option(cls, name, Any, "TRL 1.16's key (docs/trl_options.md)")

    def _add_option(self, cls: type, name: str, annotation: Any, help_text: str) -> None:
        if name in self._owners:
            self._owners[name].append(cls)
            return
        self._owners[name] = [cls]
        settings = option_settings(annotation)
        if settings.pop("single", False):
            self._singles.add(name)
        self.add_argument(f"--{name}", dest=name, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"),
                          **settings)

    def error(self, message: str) -> NoReturn:
        """One line and exit code 2 (argparse prints its usage too): the library's contract for user errors."""
        print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT_CODE)

    def set_defaults_with_config(self, **values: Any) -> list[str]:
        """Take `values` (a YAML file's keys) as the starting values; returns the keys no option takes, as
        `--key value` strings (TRL's form)."""
        self._config_values.update({key: value for key, value in values.items() if key in self._owners})
        return [part for key, value in values.items() if key not in self._owners for part in (f"--{key}", str(value))]

    def parse_args_into_dataclasses(self, args: Iterable[str] | None = None, return_remaining_strings: bool = False,
                                    **_: Any) -> tuple:
        """One instance per class, from the command line `args` (default sys.argv[1:]) over the YAML's values;
        with `return_remaining_strings`, the strings no option took come last; options added with add_argument
        come in an argparse.Namespace before them."""
        namespace, remaining = self.parse_known_args(None if args is None else list(args))
        if remaining and not return_remaining_strings:
            self.error(f"unknown arguments: {' '.join(remaining)}")
        given = {**self._config_values, **vars(namespace)}
        for name in self._singles & set(vars(namespace)):
            if isinstance(given[name], list) and len(given[name]) == 1:
                given[name] = given[name][0]
        try:
            outputs = [self._instance(cls, given) for cls in self.dataclass_types]
        except UserError as exc:
            self.error(str(exc))
        extra = {key: value for key, value in vars(namespace).items() if key not in self._owners}
        if extra:
            outputs.append(argparse.Namespace(**extra))
        return (*outputs, remaining) if return_remaining_strings else tuple(outputs)

    def _instance(self, cls: type, given: dict[str, Any]) -> Any:
        values = {name: value for name, value in given.items() if cls in self._owners.get(name, ())}
        if dataclasses.is_dataclass(cls):
            missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in values
                       and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            if missing:
                raise UserError(f"{cls.__name__}: --{missing[0]} is required")
        return cls(**values)  # a pydantic config's error is a one-line UserError naming the class and key

    def parse_args_and_config(self, args: Iterable[str] | None = None, return_remaining_strings: bool = False,
                              fail_with_unknown_args: bool = True, separate_remaining_strings: bool = False) -> tuple:
        """`parse_args_into_dataclasses` after reading `--config file.yaml` (its `env:` mapping set in os.environ,
        its other keys the starting values). A YAML key no option takes is refused, as TRL's; with
        `fail_with_unknown_args=False` it is named in a warning and left out, and with `return_remaining_strings`
        it is returned as `--key value` strings (in their own list with `separate_remaining_strings`)."""
        args = list(sys.argv[1:] if args is None else args)
        config_path, args = self._take_config_flag(args)
        config_remaining = []
        if config_path is not None:
            try:
                config_remaining = self.set_defaults_with_config(**read_yaml_config(config_path))
            except UserError as exc:
                self.error(str(exc))
        output = self.parse_args_into_dataclasses(args, return_remaining_strings)
        if return_remaining_strings:
            if separate_remaining_strings:
                return (*output[:-1], config_remaining, output[-1])
            return (*output[:-1], config_remaining + output[-1])
        unknown = config_remaining[::2]
        if unknown and fail_with_unknown_args:
            self.error(f"--config {config_path}: unknown keys {', '.join(k[2:] for k in unknown)} (no argument of "
                       f"{', '.join(cls.__name__ for cls in self.dataclass_types)} takes them)")
        if unknown:
            print(f"warning: --config {config_path}: keys no argument takes, left out: "
                  f"{', '.join(k[2:] for k in unknown)}", file=sys.stderr)
        return output

    def _take_config_flag(self, args: list[str]) -> tuple[str | None, list[str]]:
        for index, arg in enumerate(args):
            if arg == "--config":
                if index + 1 >= len(args):
                    self.error("--config: expected the path of a YAML file")
                return args[index + 1], args[:index] + args[index + 2:]
            if arg.startswith("--config="):
                return arg.split("=", 1)[1], args[:index] + args[index + 1:]
        return None, args


def read_yaml_config(path: str) -> dict[str, Any]:
    """The YAML file's mapping, its `env:` mapping moved into os.environ (values as text)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"--config {path}: not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a YAML mapping of argument names to values, got "
                        f"{type(data).__name__}")
    env = data.pop("env", {}) or {}
    if not isinstance(env, dict):
        raise UserError(f"--config {path}: env: expected a mapping of variable names to values, got "
                        f"{type(env).__name__}")
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    return data
