"""How every episode starts (a fresh environment from its factory, reset on the row), and the check a run makes
before it writes anything: one environment built and reset on the first row it would serve, its tools described
for the model, a reward to train on. The episode player starts each episode through the same functions, so what
the check passes is what the run does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

from training_wizard.errors import UserError
from training_wizard.rollout.environment_contracts import checked_opening, method_name, new_environment, raised
from training_wizard.rollout.environment_protocols import EnvironmentFailure, ToolsProtocol


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


def check_episodes_can_start(environment_factory, settings, has_reward: bool, rows) -> None:
    """Before a run writes anything (and on --dry-run): every factory builds an environment that resets on the
    first row it serves (an OpenEnv server is contacted), the tools can be described to the model and have
    distinct names, and some reward scores the episodes. `settings`: EpisodeSettings; `rows`: the prompt
    dataset (a datasets.Dataset or a list of dicts)."""
    factories = factory_table(environment_factory)
    check_reward_source(factories.values(), settings.protocol, has_reward)
    tools = ToolsProtocol(list(settings.tools), None) if settings.protocol == "tools" else None
    if not factories and tools is not None:
        tools.tools_of(None)
    for row in _first_rows(factories, rows):
        columns = {key: value for key, value in dict(rows[row]).items() if key not in ("prompt", "input_ids")}
        _, environment = new_environment_for(factories, columns, row)
        try:
            _, failure = reset_environment(environment, dict(rows[row]).get("prompt"),
                                           reset_columns(factories, columns), row)
            if failure is not None:
                raise UserError(f"environment: dataset row {row}: {method_name(environment, 'reset')} could not "
                                f"start an episode: {failure}")
            if tools is not None:
                tools.tools_of(environment)
        finally:
            close_environment(environment)


def close_environment(environment: Any) -> None:
    """The checked environment's `close()`, when it has one: an OpenEnv client holds its server's WebSocket
    session open until it is closed, and the check's environment plays no episode. Episodes never call `close`
    (TRL's do not either), so one that raises is ignored here rather than stopping a run or hiding the check's
    own error."""
    close = getattr(environment, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _first_rows(factories: dict[str, Callable[[], Any]], rows) -> list[int]:
    """The first row each factory serves (a factory no row names is never built); row 0 with one factory."""
    if len(rows) == 0 or not factories:
        return []
    if "" in factories:
        return [0]
    names = rows.column_names if hasattr(rows, "column_names") else list(rows[0])
    if "environment" not in names:
        return [0]  # building it names the missing column
    column = rows["environment"] if hasattr(rows, "column_names") else [row.get("environment") for row in rows]
    first: dict[Any, int] = {}
    for index, name in enumerate(column):
        first.setdefault(name if name in factories else None, index)
    return sorted(first.values())
