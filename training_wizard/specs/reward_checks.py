"""What every reward's output must be, checked in one place: one finite float per completion, and a failing reward
turned into one line naming it, the step and the row (`RewardSpec.score` and the reward-function specs call these).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from training_wizard.errors import UserError

# Rows re-run one at a time to find the one that makes a failing reward raise (error path only).
_MAX_ROWS_TO_LOCATE = 64


class RewardError(UserError):
    """A reward failure whose message already names the reward (or component), the step and the row: an outer
    reward passes it on unchanged instead of wrapping it a second time."""


def guarded_call(
    fn: Callable[[list, list, dict], Any], prompts: list, completions: list, columns: dict, label: str, step: int
) -> Any:
    """`fn(prompts, completions, columns)`; an exception becomes a UserError naming `label`, step and row.

    To name the row, a failing batch is re-run one row at a time (only on this error path); if no single row
    fails, the message says the whole batch failed.
    """
    try:
        return fn(prompts, completions, columns)
    except RewardError:
        raise  # already names its reward (a nested score call)
    except UserError as exc:
        raise RewardError(f"reward {label} at step {step}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a user's reward code failing is a user error
        reason = f"{type(exc).__name__}: {exc}"
    where = f"on the batch of {len(completions)} rows"
    if 1 < len(completions) <= _MAX_ROWS_TO_LOCATE:
        for row in range(len(completions)):
            one = {k: v[row : row + 1] if isinstance(v, (list, tuple)) else v for k, v in columns.items()}
            try:
                fn(prompts[row : row + 1], completions[row : row + 1], one)
            except Exception as exc:  # noqa: BLE001
                where, reason = f"row {row}", f"{type(exc).__name__}: {exc}"
                break
    elif len(completions) == 1:
        where = "row 0"
    raise RewardError(f"reward {label} raised at step {step}, {where}: {reason}"[:500])


def check_rewards(values: Any, expected: int, component: str, step: int) -> list[float]:
    """Floats, one per completion, all finite; else a UserError naming component, step and row."""
    if values is None or isinstance(values, (str, bytes)):
        raise RewardError(
            f"reward {component} at step {step}: expected a list of {expected} floats, got {type(values).__name__}"
        )
    try:
        values = values.tolist() if hasattr(values, "tolist") else list(values)
    except TypeError:
        raise RewardError(
            f"reward {component} at step {step}: expected a list of {expected} floats, got {type(values).__name__}"
        ) from None
    if len(values) != expected:
        raise RewardError(
            f"reward {component} at step {step}: returned {len(values)} values for {expected} completions "
            f"(rows 0-{expected - 1})"
        )
    out = []
    for row, value in enumerate(values):
        try:
            if isinstance(value, (str, bytes)) or value is None:
                raise TypeError
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(f"reward {component} at step {step}, row {row}: expected a float, got {value!r}") from None
        if not math.isfinite(number):
            raise RewardError(f"reward {component} at step {step}, row {row}: value is {number} (must be finite)")
        out.append(number)
    return out


def check_allowing_none(values: Any, expected: int, label: str, step: int) -> list[float]:
    """`check_rewards`, except that None is allowed and becomes NaN (the function does not score that row)."""
    if isinstance(values, (list, tuple)):
        missing = {row for row, value in enumerate(values) if value is None}
        checked = check_rewards([0.0 if value is None else value for value in values], expected, label, step)
        return [math.nan if row in missing else value for row, value in enumerate(checked)]
    return check_rewards(values, expected, label, step)
