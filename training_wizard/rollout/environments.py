"""An environment's life in an episode, and the contracts its code keeps with the episode player.

Every episode starts alike: a fresh environment from its factory (with several factories, the one a row's
`environment` column names), reset on the row. The check a run makes before it writes anything
(environment_check.py) starts its environments through the same functions, so what the check passes is what the
run does.

An environment's constructor, `reset`, `step` and `get_reward`, and a recipe's tool parser are the user's code: a
broken one is the user's bug, which stops the run in one line naming the class or function, the rule and what it
returned or raised (a `UserError`, exit code 2), checked here where each is called. What the model can cause stays
an episode's business: a tool that raises and a text step that raises are messages to the model
(environment_protocols.py, tools.py), and an `EnvironmentFailure` ends one episode.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable, Iterable

import numpy

from training_wizard.errors import UserError

# What a step of another library's shape returned, and how to give ours: by the number of values.
_STEP_SHAPES = {
    4: "gym's (observation, reward, done, info)? return (observation, reward, done)",
    5: "gymnasium's (observation, reward, terminated, truncated, info)? return (observation, reward, "
       "terminated or truncated)",
}


class EnvironmentFailure(Exception):
    """What an environment raises from reset or step when its episode cannot go on: the server it talks to died,
    answered garbage or ran past the environment's own timeout. The episode ends there (text protocol), counted in
    `episodes/environment_errors_mean`; the run goes on. Any other exception is a message to the model instead."""


def factory_table(environment_factory) -> dict[str, Callable[[], Any]]:
    """The factories by the name a row's `environment` column gives; "" for the only one; {} for tools only."""
    if isinstance(environment_factory, dict):
        return dict(environment_factory)
    return {"": environment_factory} if environment_factory is not None else {}


# The prompt of a row whose environment supplies it (TRL 1.16's placeholder): `reset`'s text is appended to it.
EMPTY_PROMPT = ({"role": "user", "content": ""},)


def environment_rows(rows: Any, environment_factory, count: int) -> Any:
    """The prompt rows of TRL 1.16's environment modes: no rows at all (one factory's `reset` supplies every
    prompt: `count` rows with an empty prompt) or rows without a prompt (each routed by its `environment` column,
    its prompt empty). Other rows, and runs without an environment, as they are."""
    if environment_factory is None:
        return rows
    if rows is None:
        if isinstance(environment_factory, dict):
            raise UserError("train_dataset: required with a dict of environment factories (each row's "
                            "'environment' column names its factory); pass rows such as {'environment': "
                            f"{next(iter(environment_factory), 'name')!r}}}, or a single factory")
        return [{"prompt": list(EMPTY_PROMPT)} for _ in range(count)]
    if hasattr(rows, "column_names") and hasattr(rows, "add_column"):
        if {"prompt", "input_ids"} & set(rows.column_names):
            return rows
        return rows.add_column("prompt", [list(EMPTY_PROMPT)] * len(rows))
    if isinstance(rows, (list, tuple)):
        return [{**row, "prompt": list(EMPTY_PROMPT)} if isinstance(row, dict) and not {"prompt", "input_ids"} & set(row)
                else row for row in rows]
    return rows


def factory_name(factory: Callable) -> str:
    return getattr(factory, "__name__", type(factory).__name__)


def gives_reward(factory: Callable) -> bool:
    """Whether a tools environment's episodes have a reward of their own (TRL's rule: a `get_reward` method).
    A factory that is a function may make anything: its component is kept, 0 where an environment has none."""
    factory = getattr(factory, "__wrapped__", factory)  # a factory bound to keyword arguments (factory_kwargs)
    return not isinstance(factory, type) or callable(getattr(factory, "get_reward", None))


def check_reward_source(factories: Iterable[Callable], protocol: str, has_reward: bool) -> None:
    """Without a reward of its own (`has_reward`) the run needs an environment that gives one."""
    if not has_reward and not (protocol == "text" or any(gives_reward(factory) for factory in factories)):
        raise UserError("reward: none is given and the environment has no get_reward method, so no episode would "
                        "be scored; add a [reward] table (reward_model=) or a get_reward method")


def new_environment_for(factories: dict[str, Callable[[], Any]], columns: dict[str, Any],
                        row: int) -> tuple[str, Any]:
    """(the factory's name, a fresh environment) for a row: the only factory, or the one its `environment` column
    names; ("", None) with tools only."""
    if not factories:
        return "", None
    chosen = "" if "" in factories else columns.get("environment")
    if chosen not in factories:
        raise UserError(f"dataset row {row}: column 'environment' is {chosen!r}; expected one of "
                        f"{', '.join(sorted(factories))} (the environment factories)")
    factory = factories[chosen]
    return factory_name(factory), new_environment(factory)


def reset_columns(factories: dict[str, Callable[[], Any]], columns: dict[str, Any]) -> dict[str, Any]:
    """The row's columns `reset` is called with: with several factories the `environment` column only routes the
    row, so it is left out, as TRL 1.16 leaves it out."""
    if "" in factories:
        return columns
    return {name: value for name, value in columns.items() if name != "environment"}


def reset_environment(environment: Any, prompt: Any, columns: dict[str, Any],
                      row: int) -> tuple[str | None, str | None]:
    """(the text `reset` returned for the prompt, or None; why it could not reset, or None). An
    EnvironmentFailure is the episode's (its server is down): the caller decides. Any other exception is the
    environment's bug: one line naming the method and the row."""
    if environment is None or not hasattr(environment, "reset"):
        return None, None
    try:
        opening = environment.reset(**{"prompt": prompt, **columns})
    except EnvironmentFailure as failure:
        return None, str(failure)
    except UserError:  # an adapter's own one line (a column its table names is missing, ...)
        raise
    except Exception as error:  # noqa: BLE001 - the user's reset: its bug stops the run in one line
        raise UserError(f"environment: dataset row {row}: {method_name(environment, 'reset')} raised "
                        f"{raised(error)}") from None
    return checked_opening(environment, opening, row), None


def qualified_name(target: Any) -> str:
    """'package.module:Name' of a class or function (a factory bound to its factory_kwargs, or a
    functools.partial: the function it calls)."""
    target = getattr(target, "__wrapped__", target)
    if isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}" if module else name


def method_name(environment: Any, method: str) -> str:
    return f"{qualified_name(type(environment))}.{method}"


def shown(value: Any) -> str:
    """A returned value as an error message names it: its type, and the value itself when short."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} value{'s' if len(value) != 1 else ''}"
    text = repr(value)
    return f"the {type(value).__name__} {text}" if len(text) <= 40 else f"a {type(value).__name__}"


def raised(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def new_environment(factory: Callable[[], Any]) -> Any:
    """One environment from its factory (with its factory_kwargs, when the recipe gives them)."""
    name, kwargs = qualified_name(factory), dict(getattr(factory, "keywords", None) or {})
    _check_callable_without_arguments(factory, name, kwargs)
    try:
        return factory()
    except UserError:  # an adapter's own check of its factory_kwargs (OpenEnv, reasoning-gym): already one line
        raise
    except Exception as error:  # noqa: BLE001 - the user's constructor: its bug stops the run in one line
        arguments = _arguments(getattr(factory, "args", ()), kwargs)
        raise UserError(f"environment: {name}({arguments}) raised {raised(error)}") from None


def _check_callable_without_arguments(factory: Callable[[], Any], name: str, kwargs: dict[str, Any]) -> None:
    """One line when the factory needs arguments it is not given. A factory bound to factory_kwargs (a partial
    whose __wrapped__ is the user's factory) binds its arguments against that factory's signature; a plain
    functools.partial's own signature has its bound arguments removed already, so nothing more is bound."""
    wrapped = getattr(factory, "__wrapped__", None)
    bound = (getattr(factory, "args", ()), kwargs) if wrapped is not None else ((), {})
    try:
        signature = inspect.signature(wrapped if wrapped is not None else factory)
    except (TypeError, ValueError):  # a builtin, an extension type or a partial binding too much: its call says why
        return
    try:
        signature.bind(*bound[0], **bound[1])
    except TypeError as error:
        given = f"with factory_kwargs {kwargs}" if kwargs else "without arguments"
        if wrapped is None and isinstance(factory, functools.partial):
            given = f"as its functools.partial binds it ({_arguments(factory.args, kwargs)})"
        raise UserError(f"environment: {name} cannot be called {given} ({error}); it is called once per "
                        "episode with [environment] factory_kwargs as its keyword arguments") from None


def _arguments(args: tuple, kwargs: dict[str, Any]) -> str:
    return ", ".join([*map(repr, args), *(f"{key}={value!r}" for key, value in kwargs.items())])


def checked_opening(environment: Any, opening: Any, row: int) -> str | None:
    """What `reset` returned, which must be text to append to the prompt's last user message, or None."""
    if opening is None or isinstance(opening, str):
        return opening
    raise UserError(f"environment: dataset row {row}: {method_name(environment, 'reset')} must return the text to "
                    f"append to the prompt (a str) or None; it returned {shown(opening)}")


def checked_step(environment: Any, value: Any, row: int) -> tuple[str | None, float, bool]:
    """A text step's (observation, reward, done), each of the type the protocol names; the reward as a float."""
    where = f"environment: dataset row {row}: {method_name(environment, 'step')}"
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        hint = _STEP_SHAPES.get(len(value), "") if isinstance(value, (tuple, list)) else ""
        raise UserError(f"{where} must return (observation, reward, done); it returned {shown(value)}"
                        + (f" ({hint})" if hint else ""))
    observation, reward, done = value
    if observation is not None and not isinstance(observation, str):
        raise UserError(f"{where} must return the observation as text (a str) or None; it returned "
                        f"{shown(observation)} (json.dumps it to show the model JSON)")
    if not isinstance(done, (bool, numpy.bool_)):
        raise UserError(f"{where} must return done as True or False; it returned {shown(done)}")
    return observation, checked_reward(where, reward, "its reward as "), bool(done)


def checked_reward(where: str, reward: Any, what: str = "") -> float:
    """An environment's reward as a float: None counts as 0; anything else must be a finite number. `where`
    names the method (and row)."""
    if reward is None:
        return 0.0
    number = isinstance(reward, numbers.Real) or (hasattr(reward, "__float__") and getattr(reward, "ndim", 0) == 0)
    value = float(reward) if number else math.nan
    if not number or not math.isfinite(value):
        raise UserError(f"{where} must return {what}a finite number or None; it returned {shown(reward)}")
    return value


def parsed_calls(parser: Callable[[str], Any], text: str) -> list | None:
    """A recipe's tool parser on one reply: its list of calls, or None for a reply it calls malformed (ValueError,
    the parser's contract). Any other exception, or a value that is not a list, is the parser's bug."""
    where = f"environment.tool_parser: {qualified_name(parser)}"
    try:
        found = parser(text)
    except ValueError:
        return None
    except Exception as error:  # noqa: BLE001 - the user's parser: its bug stops the run in one line
        raise UserError(f"{where} raised {raised(error)}; it must return a list of {{'name', 'arguments'}} or "
                        "raise ValueError for a reply it cannot read") from None
    if found is None:
        return []
    if not isinstance(found, (list, tuple)):
        raise UserError(f"{where} must return a list of {{'name', 'arguments'}} (or None for no call); it returned "
                        f"{shown(found)}")
    return list(found)
