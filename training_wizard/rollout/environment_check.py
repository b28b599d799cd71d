"""The check a run makes before it writes anything (and on --dry-run): one environment per factory built and reset
on the first row it would serve, its tools described for the model, a reward to train on. It starts each
environment as an episode does (environments.py), so what the check passes is what the run does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from training_wizard.errors import UserError
from training_wizard.rollout.environments import (
    check_reward_source, factory_table, method_name, new_environment_for, reset_columns, reset_environment,
)
from training_wizard.rollout.tools import ToolsProtocol


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
