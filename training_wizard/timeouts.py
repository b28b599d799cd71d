"""User code that may never return (a reward function, a remote reward, a reward spec) runs under a timeout.

The code runs where it always ran, on the main thread: rewards that use signal alarms (math-verify), the current
CUDA device, thread-local state or a non-thread-safe library behave as before. A watchdog thread waits for the
deadline and then sends the main thread `TIMEOUT_SIGNAL`, whose handler raises out of the reward wherever it is
(a signal also interrupts a blocking sleep, lock or socket wait); a stop signal (SIGTERM, SIGINT) that arrives
during the call does the same through signals.py. Both exceptions are BaseExceptions, so a reward's own
`except Exception` does not swallow them. An async reward's coroutines are cancelled on the reward loop.

Off the main thread (a trainer driven from a thread of its own) no signal can reach the call: it runs without a
timeout there.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Callable, TypeVar

from training_wizard.errors import UserError
from training_wizard.signals import StoppedWhileWaiting, in_user_code, stop_requested

__all__ = ["StoppedWhileWaiting", "call_with_timeout", "note_doing", "on_abandon"]

T = TypeVar("T")
TIMEOUT_SIGNAL = signal.SIGUSR1  # sent by the watchdog to the main thread; rewards rarely handle it themselves
RESEND_SECONDS = 1.0  # past the deadline, the signal is sent again until the call ends (in case code ate one)

_doing: list[str | None] = [None]  # what the call runs now (named in the timeout message)
_cancels: list[Callable[[], object]] = []  # what to cancel if the call is abandoned (async rewards' futures)


class _TimedOut(BaseException):
    """Raised in the main thread by the watchdog's signal; turned into a UserError by `call_with_timeout`."""


def note_doing(what: str) -> None:
    """Say what the call runs now (e.g. "reward function 'slow'"), for the timeout message."""
    _doing[0] = what


def on_abandon(cancel: Callable[[], object]) -> None:
    """Register how to cancel what the call waits for, should it be abandoned (only inside a call)."""
    if in_user_code[0]:
        _cancels.append(cancel)


def call_with_timeout(work: Callable[[], T], seconds: float, what: str, step: int, key: str) -> T:
    """`work()`'s result, or its exception; a UserError naming `what` (or the part it said it was running), `step`
    and the option `key` if it runs longer than `seconds`; `StoppedWhileWaiting` if a stop signal arrives first."""
    if threading.current_thread() is not threading.main_thread() or in_user_code[0]:
        return work()
    if stop_requested():
        raise StoppedWhileWaiting()
    main, done = threading.main_thread().ident, threading.Event()
    deadline = time.monotonic() + seconds

    def watchdog() -> None:
        if done.wait(seconds):
            return
        while not done.is_set():
            signal.pthread_kill(main, TIMEOUT_SIGNAL)
            done.wait(RESEND_SECONDS)

    def timed_out(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        if in_user_code[0] and time.monotonic() >= deadline:
            raise _TimedOut()

    previous = signal.signal(TIMEOUT_SIGNAL, timed_out)
    if math.isfinite(seconds):
        threading.Thread(target=watchdog, name="reward-timeout", daemon=True).start()
    _doing[0] = None
    in_user_code[0] = True
    try:
        return work()
    except _TimedOut:
        in_user_code[0] = False
        running = _doing[0] or what  # before the cancel: a cancelled coroutine updates it
        _cancel_pending()
        raise UserError(f"{running} did not return within {key} = {seconds:g} s at step {step}; the run "
                        "stops (the last checkpoint is kept). Fix what it waits for, or raise the timeout") from None
    except StoppedWhileWaiting:
        in_user_code[0] = False
        _cancel_pending()
        raise
    finally:
        in_user_code[0] = False
        done.set()
        signal.signal(TIMEOUT_SIGNAL, previous)
        _cancels.clear()
        _doing[0] = None


def _cancel_pending() -> None:
    for cancel in _cancels:
        cancel()
