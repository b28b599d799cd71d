"""Any OpenEnv environment played as a text-protocol environment: in this process, or on a server the user runs.

    [environment]
    protocol = "text"
    factory = "training_wizard.envs.openenv:OpenEnvEnvironment"

    [environment.factory_kwargs]
    url = "http://127.0.0.1:8000"        # a server (`openenv serve`, a Space, a container), or, in this process:
    # environment = "my_package.envs:WordleEnvironment"
    step_timeout = 30

One OpenEnvEnvironment plays one episode: `reset(**row)` starts an episode (the row's `seed` column, when it has
one, becomes `reset(seed=...)`, so a row always starts the same episode) and returns the observation as text;
`step(reply)` turns the model's reply into an action, steps, and returns (observation text, reward, done), the
reward and `done` read from the observation as OpenEnv's own clients read them.

By URL the episode is one WebSocket session (`/ws`) of OpenEnv's `GenericEnvClient`, opened at reset and closed
when the episode ends; the default action also reads the server's action schema once (`GET /schema`).

The url must be an http(s):// or ws(s):// address (one line naming the key otherwise). The first episode made for a
url in a process tries the server (`GET /health`): a server that cannot be reached there is a mistake in the recipe
or a server not started, and stops the run at its start in one line (a UserError) rather than failing every episode.
Once reached, whatever goes wrong on the environment's side (no answer within `step_timeout`, a dropped connection,
an error the server reports, an answer that cannot be read, an exception in an in-process environment) raises
`EnvironmentFailure`: the episode ends there, counted in `episodes/environment_errors_mean` and `episodes/failed`,
and the run goes on, until failed episodes pass training.max_environment_failures (trainers/loop/environment_failures.py).
A reply the user's action function cannot read (it raises) is an error message to the model instead.

OpenEnv is an optional dependency (`pip install -e .[envs]`): nothing here imports it until an episode is made.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import json
import math
import operator
import queue
import reprlib
import threading
import time
import typing
import urllib.request
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from training_wizard.envs.openenv_url import checked_url, http_url, reach_server
from training_wizard.errors import UserError
from training_wizard.rollout.environments import EnvironmentFailure
from training_wizard.specs.reward import resolve_function

KEY = "environment.factory_kwargs"
# When an environment last did not answer a reset in time or refused the connection, by where it is. The run resets
# a rollout's episodes one after another, so the resets after such a failure, within step_timeout, fail at once
# rather than each waiting the timeout out (and each leaving a hung thread behind).
UNANSWERED_SINCE: dict[str, float] = {}
# What an observation carries besides its own fields: read as the reward and `done`, never shown to the model.
BOOKKEEPING_FIELDS = ("done", "reward", "metadata")
# A failure's reason is shown to the model and printed: long server tracebacks are cut here.
MAX_REASON_CHARS = 300


def openenv_core():
    """openenv.core, or the one line that says how to install it."""
    try:
        import openenv.core as core
    except ImportError:
        raise UserError("OpenEnv is not installed (the OpenEnvEnvironment adapter needs it): pip install -e "
                        "'.[envs]'") from None
    return core


class OpenEnvEnvironment:
    """One episode of an OpenEnv environment in the text protocol (module docstring); made fresh per episode.

    environment / url: exactly one. `environment`: the import path of an OpenEnv Environment class, or of a
        function making one, made in this process. `url`: an OpenEnv server (http(s)://host:port or ws(s)://).
    action: the import path of a function reply -> the action (a dict of its fields, or the Action object); it
        may raise ValueError for a reply it cannot read (the model is told). Default: the reply as the action's
        one text field (text_field).
    observation: the import path of a function (the observation's fields, a dict as the server sends them) ->
        the message text (None: nothing to add at reset; the episode's end at a step). Default: observation_text.
    reset_kwargs: keyword arguments every reset gets; reset_columns: dataset columns reset gets by name;
    seed_column: the column reset gets as `seed` when the row has it (None or "": never).
    step_timeout: seconds a reset (connecting included) or a step may take before the episode ends.
    """

    def __init__(self, environment: str | None = None, url: str | None = None, action: str | None = None,
                 observation: str | None = None, reset_kwargs: dict[str, Any] | None = None,
                 reset_columns: list[str] | tuple[str, ...] = (), seed_column: str | None = "seed",
                 step_timeout: float = 30.0):
        if (environment is None) == (url is None):
            raise UserError(f"{KEY}: give exactly one of environment = 'package.module:Name' (made in this process) "
                            f"and url = 'http://host:port' (a server)")
        if not (isinstance(step_timeout, (int, float)) and step_timeout > 0):
            raise UserError(f"{KEY}.step_timeout: {step_timeout!r}; expected a number of seconds above 0")
        openenv_core()  # a missing OpenEnv stops the run at its first episode, in one line
        self.make_action = resolve_function(action, raising=UserError, key=f"{KEY}.action: ") if action else None
        self.observation_text = (resolve_function(observation, raising=UserError, key=f"{KEY}.observation: ")
                                 if observation else observation_text)
        self.reset_kwargs, self.reset_columns = dict(reset_kwargs or {}), tuple(reset_columns)
        self.seed_column, self.step_timeout = seed_column, float(step_timeout)
        if environment is not None:
            make = resolve_function(environment, raising=UserError, key=f"{KEY}.environment: ")
            self.session = LocalSession(make, environment, self.step_timeout)
        else:
            url = checked_url(url)
            reach_server(url, self.step_timeout)
            self.session = RemoteSession(url, self.step_timeout)
        self.thread = EpisodeThread("openenv-episode")
        self.field: str | None = None  # the action's text field, once known (default action)
        self.failure: str | None = None
        self.finished = False
        # An episode the turn limit or the token budget ends is never told so: its session is closed when the
        # run lets go of the episode (garbage collection), so a server's session slots are freed.
        self.closer = weakref.finalize(self, close_episode, self.session, self.thread)
        self.closer.atexit = False

    def reset(self, prompt: Any = None, **row: Any) -> str | None:
        """Start the episode; the first observation's text (None when empty) is appended to the prompt."""
        kwargs = {**self.reset_kwargs, **self._row_kwargs(row)}
        first = self._call("reset", lambda: self._start(kwargs))
        text = self._text(first)
        if first.done:  # over before it began: the model's one reply ends it
            self.finished = True
            self.close()
        return text or None

    def step(self, reply: str) -> tuple[str | None, float, bool]:
        """The reply as an action; (the observation's text, its reward, done)."""
        if self.failure is not None:  # reset failed: the episode ends at the model's first reply
            raise EnvironmentFailure(self.failure)
        if self.finished:
            return None, 0.0, True
        action = self.make_action(reply) if self.make_action is not None else {self.field: reply}
        result = self._call("step", lambda: self.session.step(action))
        text = self._text(result)
        if result.done or text is None:
            self.finished = True
            self.close()
        return text, result.reward, result.done

    def close(self) -> None:
        """End the session now (a server frees the episode's slot); at done, at a failure, or by the caller."""
        self.closer()

    def _start(self, kwargs: dict[str, Any]) -> Observed:
        first = self.session.reset(kwargs)
        if self.make_action is None:
            self.field = self.session.text_field()
        return first

    def _row_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        missing = [name for name in self.reset_columns if name not in row]
        if missing:
            raise UserError(f"{KEY}.reset_columns: the dataset has no column {', '.join(map(repr, missing))} (its "
                            f"columns: {', '.join(sorted(row)) or 'none'})")
        found = {name: row[name] for name in self.reset_columns}
        seed = row.get(self.seed_column) if self.seed_column else None
        if seed is not None:
            try:
                found["seed"] = operator.index(seed)
            except TypeError:
                raise UserError(f"{KEY}.seed_column: column '{self.seed_column}' holds {seed!r}; expected an "
                                f"integer") from None
        return found

    def _call(self, what: str, function: Callable[[], Observed]) -> Observed:
        """`function` on the episode's thread, waited for at most step_timeout; any failure ends the episode."""
        where = self.session.where
        if what == "reset" and time.monotonic() - UNANSWERED_SINCE.get(where, -math.inf) < self.step_timeout:
            self._fail(what, f"a reset just before this one could not reach it; tried again {self.step_timeout:g} s "
                             f"(step_timeout) after that")
        future = self.thread.submit(function)
        try:
            found = future.result(timeout=self.step_timeout)
        except UserError:  # a recipe mistake (which field holds the reply): the run stops, in one line
            self.close()
            raise
        except Exception as error:  # noqa: BLE001 - whatever the environment's side did, the episode ends here
            if what == "reset" and isinstance(error, OSError):  # a timeout or a connection that failed
                UNANSWERED_SINCE[where] = time.monotonic()
            self._fail(what, failure_reason(error, self.step_timeout))
        if what == "reset":
            UNANSWERED_SINCE.pop(where, None)
        return found

    def _text(self, result: Observed) -> str | None:
        try:
            text = self.observation_text(result.fields)
        except Exception as error:  # noqa: BLE001 - the user's function: its failure ends this episode only
            self._fail("observation", f"the observation function raised {type(error).__name__}: {error}")
        return None if text is None else str(text)

    def _fail(self, what: str, reason: str) -> typing.NoReturn:
        self.failure = f"{self.session.where}: {what}: {reason}"
        self.close()
        raise EnvironmentFailure(self.failure) from None


@dataclass(frozen=True)
class Observed:
    """One observation as the server sends it: its own fields (metadata included), the reward and `done`."""

    fields: dict[str, Any]
    reward: float
    done: bool


class Unreadable(ValueError):
    """An answer from the environment that is not an OpenEnv observation."""


def observed(payload: Any) -> Observed:
    """The observation in OpenEnv's wire form ({"observation": {...}, "reward": ..., "done": ...}), checked: a
    server that answers garbage must end the episode, not teach the model nonsense."""
    if not isinstance(payload, dict) or not isinstance(payload.get("observation"), dict):
        raise Unreadable(f"expected an observation object, got {reprlib.repr(payload)}")
    reward, done = payload.get("reward"), payload.get("done")
    if not isinstance(done, bool):
        raise Unreadable(f"'done' is {reprlib.repr(done)}; expected true or false")
    if reward is not None and (not isinstance(reward, (bool, int, float)) or not math.isfinite(reward)):
        raise Unreadable(f"'reward' is {reprlib.repr(reward)}; expected a finite number or null")
    return Observed(payload["observation"], float(reward or 0.0), done)


def observation_text(fields: dict[str, Any]) -> str:
    """The default message for an observation: its only text field (an echo's `echoed_message`, a game's
    `prompt`), else all its fields as JSON; done, reward and metadata are left out."""
    shown = {name: value for name, value in fields.items() if name not in BOOKKEEPING_FIELDS}
    texts = [value for value in shown.values() if isinstance(value, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(shown, ensure_ascii=False, default=str)


def text_field(action_schema: dict[str, Any], where: str) -> str:
    """The action field the default action puts the reply in: the action's only string field (OpenEnv's template
    and echo environment call it `message`), else a field named `message`."""
    properties = {name: spec for name, spec in action_schema.get("properties", {}).items() if name != "metadata"}

    def is_text(spec: dict[str, Any]) -> bool:
        return spec.get("type") == "string" or any(option.get("type") == "string" for option in spec.get("anyOf", []))

    texts = [name for name, spec in properties.items() if is_text(spec)]
    if len(texts) == 1:
        return texts[0]
    if "message" in properties:
        return "message"
    raise UserError(f"{KEY}.action: cannot tell which field of {where}'s action holds the reply (its fields: "
                    f"{', '.join(properties) or 'none'}); name a function making the action from the reply, "
                    f"action = 'package.module:function'")


def accepted_kwargs(method: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `method` takes (all of them when it takes **kwargs): what OpenEnv's server passes
    to reset, so an in-process episode starts exactly as a served one."""
    parameters = inspect.signature(method).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return dict(kwargs)
    names = {parameter.name for parameter in parameters}
    return {name: value for name, value in kwargs.items() if name in names}


class LocalSession:
    """An episode of an OpenEnv Environment made in this process; its observations go through the same wire form
    a server sends (OpenEnv's serialize_observation, then JSON types), so both give the same episode."""

    def __init__(self, make: Callable[[], Any], path: str, step_timeout: float):
        self.make, self.where, self.step_timeout = make, f"OpenEnv environment {path}", step_timeout
        self.environment = None

    def reset(self, kwargs: dict[str, Any]) -> Observed:
        self.environment = self.make()
        return self._observed(self.environment.reset(**accepted_kwargs(self.environment.reset, kwargs)))

    def step(self, action: Any) -> Observed:
        if isinstance(action, dict):
            action = self.action_class().model_validate(action)
        # OpenEnv's own per-step limit, where the environment takes one (the template's step does not)
        extra = accepted_kwargs(self.environment.step, {"timeout_s": self.step_timeout})
        return self._observed(self.environment.step(action, **extra))

    def text_field(self) -> str:
        return text_field(self.action_class().model_json_schema(), self.where)

    def action_class(self) -> type:
        """The Action class the environment's step takes: its `action` annotation, else the first argument of
        its Environment[Action, Observation, State] base."""
        base = openenv_core().Action
        kind = type(self.environment)
        try:
            candidates = [typing.get_type_hints(kind.step).get("action")]
        except Exception:  # noqa: BLE001 - an annotation that cannot be resolved is simply not used
            candidates = []
        for klass in kind.__mro__:
            candidates += [typing.get_args(generic)[0] for generic in getattr(klass, "__orig_bases__", ())
                           if typing.get_args(generic)]
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, base):
                return candidate
        raise UserError(f"{KEY}.action: cannot tell which Action class {self.where} takes (its step's `action` "
                        f"has no Action annotation); name a function returning the action object, "
                        f"action = 'package.module:function'")

    def close(self) -> None:
        if self.environment is not None:
            self.environment.close()

    @staticmethod
    def _observed(observation: Any) -> Observed:
        import pydantic_core

        from openenv.core.env_server.serialization import serialize_observation

        return observed(pydantic_core.to_jsonable_python(serialize_observation(observation)))


@functools.lru_cache(maxsize=1)
def strict_client_class() -> type:
    """OpenEnv's GenericEnvClient, reading each answer strictly (the generic client fills a missing observation
    with {} and a missing `done` with false, which would hide a broken server) and never reconnecting mid-episode."""
    class StrictClient(openenv_core().GenericEnvClient):
        opened = False

        def _parse_result(self, payload: Any) -> Observed:  # noqa: D102 - the client's parse hook
            return observed(payload)

        async def _connect_async(self):
            # OpenEnv 0.10's client silently reconnects a dropped socket at the next call: a new session on the
            # server, a fresh environment never reset. Mid-episode, a dropped connection ends the episode instead.
            if self.opened and (self._ws is None or self._ws.state.name in ("CLOSING", "CLOSED")):
                raise ConnectionError("the connection dropped mid-episode")
            connected = await super()._connect_async()
            self.opened = True
            return connected

    return StrictClient


# The action field a server's default action fills, by URL: read once per server from its /schema.
_TEXT_FIELDS: dict[str, str] = {}


class RemoteSession:
    """An episode on an OpenEnv server: one WebSocket session of OpenEnv's client, the server's own environment
    instance for this episode. Both of the client's limits (connecting, waiting for an answer) are the step
    timeout, so a late answer drops the socket there and then."""

    def __init__(self, url: str, step_timeout: float):
        self.url, self.where, self.step_timeout = url.rstrip("/"), f"OpenEnv server {url}", step_timeout
        self.client = None

    def reset(self, kwargs: dict[str, Any]) -> Observed:
        self.client = strict_client_class()(base_url=self.url, connect_timeout_s=self.step_timeout,
                                            message_timeout_s=self.step_timeout, mode="simulation").sync()
        return self.client.reset(**kwargs)

    def step(self, action: Any) -> Observed:
        return self.client.step(action)

    def text_field(self) -> str:
        if self.url not in _TEXT_FIELDS:
            _TEXT_FIELDS[self.url] = text_field(self.action_schema(), self.where)
        return _TEXT_FIELDS[self.url]

    def action_schema(self) -> dict[str, Any]:
        with urllib.request.urlopen(http_url(self.url) + "/schema", timeout=self.step_timeout) as answer:
            schema = json.loads(answer.read())
        if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
            raise Unreadable("its /schema has no action schema")
        return schema["action"]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class EpisodeThread:
    """One daemon thread per episode running its calls in order (an in-process environment keeps one thread, as
    OpenEnv's server gives it), so the caller can stop waiting at the deadline; a call that never returns cannot
    keep the process alive. It ends after its last call (stop)."""

    def __init__(self, name: str):
        self.name, self.calls, self.thread = name, queue.SimpleQueue(), None

    def submit(self, function: Callable[[], Any]) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self.thread.start()
        self.calls.put((function, future))
        return future

    def stop(self) -> None:
        """Let the thread end after the calls already queued (a close among them)."""
        if self.thread is not None:
            self.calls.put(None)

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            self._run(*call)
            # the waiting loop must not keep the last call (a closure over its episode) alive, or an abandoned
            # episode would never be collected, and never closed
            del call

    @staticmethod
    def _run(function: Callable[[], Any], future: concurrent.futures.Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed to the caller, who decides
                future.set_exception(error)


def close_episode(session: Any, thread: EpisodeThread) -> None:
    """Close the session on its own thread without waiting: closing a socket to a dead or hung server can take
    the client's close handshake; the episode has already ended."""
    if thread.thread is None:  # the episode never started: nothing is open
        return

    def close_quietly() -> None:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - the episode is over; nothing is left to tell
            pass

    thread.submit(close_quietly)
    thread.stop()


def failure_reason(error: BaseException, step_timeout: float) -> str:
    if isinstance(error, TimeoutError):
        reason = f"no answer within step_timeout ({step_timeout:g} s)"
    elif isinstance(error, json.JSONDecodeError):
        reason = "an answer that is not JSON"
    elif isinstance(error, Unreadable):
        reason = f"an unreadable answer: {error}"
    elif isinstance(error, OSError) or type(error).__name__ == "ConnectionClosed":  # websockets' own
        reason = f"the connection failed or dropped ({type(error).__name__}: {error})"
    else:
        reason = f"{type(error).__name__}: {error}"
    return reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
