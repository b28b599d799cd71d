"""User code that may never return (a reward function, a remote reward, a reward spec) runs under a timeout.

`call_with_timeout` runs the call in a daemon worker thread while the main thread waits in short slices, so a
stop signal is seen within a fraction of a second (the signal handlers of signals.py run in the main thread, and
only between its waits). Past the timeout the run stops with one line naming what was running and the step; on a
stop signal `StoppedWhileWaiting` is raised and the trainer commits the checkpoint of the iteration's start.
The hung call itself cannot be killed (Python has no safe way to stop a thread): its thread is a daemon, so it
does not keep the process alive, and an async reward's coroutine is cancelled on the reward loop.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Callable, TypeVar

import torch

from training_wizard.errors import UserError
from training_wizard.signals import stop_requested

T = TypeVar("T")
WAIT_SLICE_SECONDS = 0.05  # how often the waiting main thread looks at the stop flag

_doing: dict[int, str] = {}  # worker thread id -> what it runs now (named in the timeout message)
_cancels: dict[int, list[Callable[[], object]]] = {}  # worker thread id -> what to cancel if it is abandoned


class StoppedWhileWaiting(Exception):
    """A stop signal arrived while user code was running: the trainer saves and stops (exit 143/130)."""


def note_doing(what: str, thread_id: int | None = None) -> None:
    """Say what the worker runs now (e.g. "reward function 'slow'"), for the timeout message. Called from the
    worker thread, or with its id from a thread acting for it (the reward event loop)."""
    _doing[thread_id if thread_id is not None else threading.get_ident()] = what


def on_abandon(cancel: Callable[[], object]) -> None:
    """Register, from a worker thread, how to cancel what it waits for if the caller gives up on it."""
    _cancels.setdefault(threading.get_ident(), []).append(cancel)


def call_with_timeout(work: Callable[[], T], seconds: float, what: str, step: int, key: str) -> T:
    """`work()`'s result, or its exception, computed in a worker thread; a UserError naming `what` (or the part
    the worker said it was running), `step` and the option `key` if it runs longer than `seconds`;
    `StoppedWhileWaiting` if a stop signal arrives first. The worker keeps the caller's context variables, grad
    mode and thread count, so it computes exactly what the caller would have."""
    outcome: dict[str, object] = {}
    context, grad_enabled, threads = contextvars.copy_context(), torch.is_grad_enabled(), torch.get_num_threads()

    def run() -> None:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        try:
            with torch.set_grad_enabled(grad_enabled):
                outcome["value"] = context.run(work)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller as it is
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="user-code", daemon=True)
    deadline = time.monotonic() + seconds
    worker.start()
    try:
        while worker.is_alive():
            worker.join(WAIT_SLICE_SECONDS)
            if worker.is_alive() and stop_requested():
                _abandon(worker)
                raise StoppedWhileWaiting()
            if worker.is_alive() and time.monotonic() > deadline:
                running = _doing.get(worker.ident or -1, what)
                _abandon(worker)
                raise UserError(f"{running} did not return within {key} = {seconds:g} s at step {step}; the run "
                                "stops (the last checkpoint is kept). Fix what it waits for, or raise the timeout")
    finally:
        _doing.pop(worker.ident or -1, None)
        _cancels.pop(worker.ident or -1, None)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _abandon(worker: threading.Thread) -> None:
    for cancel in _cancels.get(worker.ident or -1, []):
        cancel()
