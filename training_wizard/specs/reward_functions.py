"""Reward functions in TRL's form: a list of functions with weights, so a TRL GRPO recipe's rewards port as they are.

Each function is called by keyword, as TRL's GRPOTrainer calls it:

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]

- `prompts`: the dataset's `prompt` per completion: a string (standard rows) or the message list (conversational).
- `completions`: the decoded completion per completion: a string for standard rows, `[{"role": "assistant",
  "content": text}]` for conversational ones (TRL's convention).
- `completion_ids`: each completion's token ids without padding, the stop token included when it was sampled
  (as TRL passes them).
- `trainer_state`: a read-only `RewardTrainerState` with `global_step` (iterations completed, 0 at the first).
- `columns`: the dataset row's other columns, plus `completion_has_eos`.

TRL 1.16 also passes `log_extra(column, values)` (a column of the sample table, one value per completion) and
`log_metric(name, value)` (a scalar metric logged under `name`, averaged): so do we, into the store each
`score_logging` call is given (`RewardSpec.score_logging`).

A function may return None for a completion it does not score: the weighted sum then leaves it out for that
completion (TRL's nansum). A completion no function scored totals 0 (every component NaN marks it): one warning
line per batch names how many, and `frac_reward_all_none` is their share of the batch. GRPO and RLOO leave it out
of its group's baseline with advantage 0, as TRL 1.16 does; PPO counts it 0 (docs/algorithms.md). Each function is logged as
`rewards/<function name>`: the mean over the completions it scored (None values travel as NaN inside the
components; the total is always finite). `async def` functions run concurrently, on one event loop that lasts the whole run.

`RewardFunctionsSpec` names its functions by import path (a recipe's `[reward]` table); `RewardObjectsSpec` holds
them as Python objects (the trainers' TRL-form constructor).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from pydantic import Field, PrivateAttr, field_validator, model_validator

from training_wizard.errors import UserError
from training_wizard.timeouts import note_doing, on_abandon
from training_wizard.specs.reward import FunctionLogs, RewardSpec, resolve_function
from training_wizard.specs.reward_checks import check_allowing_none, guarded_call


@dataclass(frozen=True)
class RewardTrainerState:
    """What a reward function sees as `trainer_state`. `global_step`: the iterations completed before this rollout
    (0 at the first), which is the step of the rollout (as metrics and checkpoints count) minus one; evaluation
    and the sample probes after step N see N - 1. TRL passes its `TrainerState`, whose `global_step`
    counts the optimizer steps completed; ours counts iterations (each one rollout and its update)."""

    global_step: int


def iterations_before(step: int) -> int:
    """TRL's `global_step` seen by reward code scoring `step` (numbered as metrics and checkpoints: the first
    iteration's rollout is step 1): the iterations completed before it, 0 at the first."""
    return max(step - 1, 0)


class RewardFunctionsSpec(RewardSpec):
    """TRL's `reward_funcs` and `reward_weights`: the reward is sum_i w_i r_i over the functions that scored it.

    A `[reward]` table with `reward_funcs` needs no `spec_class`.
    """

    needs_trl_inputs: ClassVar[bool] = True

    reward_funcs: list[str] = Field(
        min_length=1, description="Import paths of the reward functions, 'package.module:function' each; each is "
        "called TRL-style by keyword (prompts, completions, completion_ids, trainer_state, row columns). An entry "
        "without ':' names a reward model instead (a folder or a cached Hub id, as TRL accepts a model id): it "
        "scores prompt + completion and is logged under the folder's name."
    )
    reward_weights: list[float] | None = Field(
        None, description="One weight per function, in the order of reward_funcs; default: 1.0 each."
    )
    _models: dict[str, Any] = PrivateAttr(default_factory=dict)  # the reward models named, loaded once

    @field_validator("reward_funcs")
    @classmethod
    def _importable_now(cls, paths: list[str]) -> list[str]:
        """Import every function when the recipe loads, so --dry-run catches a typo before any model loads."""
        for index, path in enumerate(paths):
            if names_a_model(path):
                check_model_exists(path, f"reward_funcs[{index}]")
            else:
                resolve_function(path, raising=ValueError, key=f"reward_funcs[{index}]: ")
        return paths

    @model_validator(mode="after")
    def _one_weight_per_function(self) -> RewardFunctionsSpec:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights: {len(self.reward_weights)} weights for {len(self.reward_funcs)} "
                             "reward_funcs (one weight per function)")
        if self.reward_weights is not None and not all(math.isfinite(w) for w in self.reward_weights):
            raise ValueError("reward_weights: every weight must be a finite number")
        return self

    def functions(self) -> dict[str, Callable[..., Any]]:
        """{logged name: function}: the function's `__name__` (TRL's name), suffixed `_2`, `_3`... on repeats."""
        functions = []
        for path in self.reward_funcs:
            if names_a_model(path):
                fn = self._models.get(path) or self._models.setdefault(path, loaded_reward_model(path))
            else:
                fn = resolve_function(path, raising=UserError, key="reward.reward_funcs: ")
            functions.append((getattr(fn, "__name__", None) or path.rpartition(":")[2], fn))
        return unique_names(functions)

    def weights(self) -> list[float]:
        return list(self.reward_weights) if self.reward_weights is not None else [1.0] * len(self.reward_funcs)

    def compute_reward(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return self.score(prompts, completions, columns)[0]

    def compute_components(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> tuple[list[float], dict[str, list[float]]]:
        return self.score(prompts, completions, columns)

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list[Any]],
        step: int = 0,
        label: str | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted totals, {function name: values with NaN where it returned None}); what the functions log is
        dropped (`score_logging` keeps it)."""
        return self.score_logging(prompts, completions, columns, FunctionLogs(), step, label)

    def score_logging(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]],
                      logs: FunctionLogs, step: int = 0, label: str | None = None
                      ) -> tuple[list[float], dict[str, list[float]]]:
        """`score`, with what the functions log through `log_extra` and `log_metric` added to `logs`."""
        functions = self.functions()
        trl_prompts, trl_completions, rest = trl_inputs(prompts, completions, columns)
        state = RewardTrainerState(global_step=iterations_before(step))
        labels = {name: f"{label}, function '{name}'" if label else f"function '{name}'" for name in functions}
        passed = {"trainer_state": state, "log_extra": logs.log_extra, "log_metric": logs.log_metric}

        def call(fn: Callable[..., Any]) -> Callable[[list, list, dict], Any]:
            return lambda p, c, cols: fn(prompts=p, completions=c, **passed, **cols)

        def call_async(fn: Callable[..., Any]) -> Callable[[list, list, dict], Any]:
            return lambda p, c, cols: run_one(fn(prompts=p, completions=c, **passed, **cols))

        raw: dict[str, Any] = {}
        pending: dict[str, Callable[..., Any]] = {}
        for name, fn in functions.items():
            if inspect.iscoroutinefunction(fn):
                pending[name] = fn
            else:
                note_doing(f"reward {labels[name]}")  # named if it never returns (timeouts.py)
                raw[name] = guarded_call(call(fn), trl_prompts, trl_completions, rest, labels[name], step)
        if pending:
            outcomes = run_concurrently({name: start(call(fn), trl_prompts, trl_completions, rest)
                                         for name, fn in pending.items()})
            for name, outcome in outcomes.items():
                if isinstance(outcome, Exception):  # again alone, then row by row: the shared path names the row
                    outcome = guarded_call(call_async(pending[name]), trl_prompts, trl_completions, rest,
                                           labels[name], step)
                raw[name] = outcome
        components = {name: check_allowing_none(raw[name], len(completions), labels[name], step)
                      for name in functions}
        totals, unscored = weighted_totals(components, self.weights())
        if components:
            logs.log_metric("frac_reward_all_none", unscored / len(completions) if completions else 0.0)
        if unscored:
            print(f"warning: reward {label or type(self).__name__} at step {step}: every reward function returned "
                  f"None for {unscored} of {len(completions)} completions; GRPO and RLOO give them advantage 0 outside "
                  "their group's baseline, as TRL 1.16 does, PPO counts them 0",
                  file=sys.stderr)
        return totals, components


class RewardObjectsSpec(RewardFunctionsSpec):
    """RewardFunctionsSpec over callables rather than import paths (Python API only, not from a recipe file): TRL's
    `reward_funcs` as the trainers' TRL-form constructor receives them, called, weighted, checked and logged as a
    recipe's `reward_funcs` are. A function is logged under its `__name__`; a reward model (a sequence classifier
    with one output, as a folder, a cached Hub id or a model object) arrives as a `ModelRewardFunction`
    (specs/reward_model_function.py), logged under its folder's base name, as TRL names it."""

    model_config = RewardFunctionsSpec.model_config | {"arbitrary_types_allowed": True}

    reward_funcs: list[Any] = Field(min_length=1, description="The reward functions, each a TRL-form callable.")

    @field_validator("reward_funcs")
    @classmethod
    def _importable_now(cls, functions: list[Any]) -> list[Any]:  # replaces the parent's import check
        for index, fn in enumerate(functions):
            if not callable(fn):
                raise ValueError(f"reward_funcs[{index}]: expected a callable, got {type(fn).__name__}")
        return functions

    def functions(self) -> dict[str, Callable[..., Any]]:
        return unique_names([(getattr(fn, "__name__", None) or type(fn).__name__, fn) for fn in self.reward_funcs])


def unique_names(functions: list[tuple[str, Callable[..., Any]]]) -> dict[str, Callable[..., Any]]:
    """{logged name: function} from (name, function) pairs: a repeated name gets `_2`, `_3`... appended."""
    named: dict[str, Callable[..., Any]] = {}
    for base, fn in functions:
        name, count = base, 1
        while name in named:
            count += 1
            name = f"{base}_{count}"
        named[name] = fn
    return named


def start(call: Callable[[list, list, dict], Any], prompts: list, completions: list, columns: dict) -> Any:
    """The coroutine `call` creates, or the exception creating it raised (an async function called with arguments
    it does not take fails here, before anything is awaited)."""
    try:
        return call(prompts, completions, columns)
    except Exception as exc:  # noqa: BLE001 - reported through the shared error path
        return exc


def run_one(coroutine: Any) -> Any:
    """The coroutine's result, awaited on the reward loop (`run_concurrently`); its exception is raised."""
    outcome = run_concurrently({"": coroutine})[""]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def trl_inputs(
    queries: list[str], completions: list[str], columns: dict[str, Any]
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """(prompts, completions, other columns) in TRL's form from what the trainer passes.

    The dataset's own prompt (`dataset_prompts`) is used where the trainer passed it; elsewhere (an evaluation
    judge, a pre-tokenised row) the query text stands in. A conversational row's completion becomes one assistant
    message; an episode's (`completion_messages`) is its whole conversation after the prompt, as TRL gives it
    (the replies and the environment's messages). Without `completion_ids` (a caller other than the trainer) functions receive `completion_ids=None`.
    """
    rest = dict(columns)
    originals = rest.pop("dataset_prompts", None) or [None] * len(queries)
    episodes = rest.pop("completion_messages", None) or [None] * len(queries)
    prompts = [query if original is None else original for query, original in zip(queries, originals)]
    completions = [
        episode if episode is not None and isinstance(prompt, list)
        else [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        for prompt, text, episode in zip(prompts, completions, episodes)
    ]
    rest.setdefault("completion_ids", None)
    return prompts, completions, rest


def run_concurrently(coroutines: dict[str, Any]) -> dict[str, Any]:
    """Await the coroutines together on the process's reward loop: {name: result or the exception it raised}; an
    exception given in place of a coroutine is passed through."""
    pending = set(coroutines)

    def note_pending() -> None:  # for the timeout message (timeouts.py): the functions still running
        names = ", ".join(f"'{name}'" for name in coroutines if name in pending)
        note_doing(f"async reward function(s) {names}" if names else "async reward functions")

    async def settle(name: str, item: Any) -> Any:
        try:
            return item if isinstance(item, Exception) else await item
        finally:
            pending.discard(name)
            note_pending()

    async def gather() -> list[Any]:
        return await asyncio.gather(*(settle(name, item) for name, item in coroutines.items()),
                                    return_exceptions=True)

    note_pending()
    future = asyncio.run_coroutine_threadsafe(gather(), reward_event_loop())
    on_abandon(future.cancel)  # a timeout or a stop signal cancels the coroutines, which may hold connections
    results = future.result()
    return dict(zip(coroutines, results))


_reward_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_reward_loop_lock = threading.Lock()


def reward_event_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, running in a daemon thread for the whole run, on which every async reward
    function is awaited (as TRL does). A loop per call would break the common reward that keeps an async HTTP
    client (httpx, aiohttp, AsyncOpenAI) between calls: the client stays bound to the first, closed loop. Its own
    thread also serves callers that already run a loop (a notebook), which cannot be re-entered. A forked child
    starts a loop of its own: the parent's thread does not exist there."""
    global _reward_loop
    with _reward_loop_lock:
        if _reward_loop is None or _reward_loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="reward-functions", daemon=True).start()
            _reward_loop = (os.getpid(), loop)
        return _reward_loop[1]


def weighted_totals(components: dict[str, list[float]], weights: list[float]) -> tuple[list[float], int]:
    """(sum_i w_i r_i per completion over the functions that scored it (NaN = not scored), the number of
    completions no function scored): those total 0, as TRL's nansum makes them."""
    rows = len(next(iter(components.values())))
    totals, unscored = [], 0
    for row in range(rows):
        scored = [(w, values[row]) for w, values in zip(weights, components.values()) if not math.isnan(values[row])]
        unscored += not scored
        totals.append(sum(w * value for w, value in scored) if scored else 0.0)
    return totals, unscored


def names_a_model(entry: str) -> bool:
    """A reward_funcs entry without ':' names a reward model (import paths are 'package.module:function')."""
    return ":" not in entry


def check_model_exists(name: str, key: str) -> None:
    """The reward model is a folder, or a Hub id already in the local cache (nothing is downloaded)."""
    from pathlib import Path

    from huggingface_hub import try_to_load_from_cache

    from training_wizard.spec import resolve_path

    if Path(resolve_path(name)).is_dir():
        return
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except ValueError:  # not a valid Hub id either (huggingface_hub's HFValidationError)
        pass
    raise ValueError(f"{key}: '{name}' is neither 'package.module:function' nor a reward model folder or cached "
                     "Hub id")


def loaded_reward_model(name: str) -> Callable[..., Any]:
    """A reward model named in reward_funcs, as a TRL-form function (specs/reward_model_function.py), in float32."""
    from pathlib import Path

    from training_wizard.spec import resolve_path
    from training_wizard.specs.reward_model_function import model_reward_function

    folder = resolve_path(name)
    return model_reward_function(str(folder) if Path(folder).exists() else name, None, None, False)
