"""Stopping on SIGTERM / SIGINT at a safe point, and the fault-injection hook the reliability tests use.

The first SIGTERM or SIGINT only sets a flag (and puts the previous handlers back, so a second signal acts as it
did before: SIGINT raises KeyboardInterrupt, SIGTERM kills). The training loop reads the flag at two safe points
per iteration, agrees on it across processes (an all-reduce, so every rank stops at the same iteration and none
is left waiting in a collective), writes a checkpoint and raises `TrainingInterrupted`. The CLI turns that into
exit code 128 + signal number: 143 for SIGTERM, 130 for SIGINT (see RELIABILITY.md).
"""

from __future__ import annotations

import os
import signal
import threading

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Test-only: `point@step[#rank][=action]`, comma-separated; action `kill` (default, SIGKILL), `term` / `int`,
# or `nan` (the point's value becomes non-finite).
FAULT_ENV = "TRAINING_WIZARD_FAULT_INJECT"
_fired: set[str] = set()  # each injected fault acts once per process
_active: list[StopRequest] = []  # the StopRequest of the running train(), for code waiting on user code
in_user_code: list[bool] = [False]  # True while timeouts.call_with_timeout runs user code on the main thread


class StoppedWhileWaiting(BaseException):
    """A stop signal arrived while user code (a reward) ran: raised out of that code by the signal handler, so a
    reward that never returns cannot keep the run from stopping. A BaseException, as KeyboardInterrupt is, so the
    `except Exception` of a reward (or of our reward plumbing) does not swallow it."""


def exit_code_for(signum: int) -> int:
    """The shell convention 128 + signal number: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + int(signum)


class TrainingInterrupted(Exception):
    """Raised by `train()` after a stop signal, once the checkpoint is committed."""

    def __init__(self, signum: int, checkpoint: str | None, step: int):
        self.signum, self.checkpoint, self.step = int(signum), checkpoint, step
        self.exit_code = exit_code_for(signum)
        name = signal.Signals(self.signum).name
        super().__init__(
            f"stopped by {name} at step {step}; checkpoint {checkpoint}; "
            "run again with resume_from_checkpoint=latest to continue"
        )


class StopRequest:
    """Context manager: while active, SIGTERM/SIGINT set `signum` instead of ending the process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signal.signal only works there
            for signum in HANDLED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        _active.append(self)
        return self

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        # Only set a flag: printing or saving here could re-enter I/O the main thread is in the middle of. Inside a
        # reward's code, also leave that code now (the trainer saves the iteration's start and stops).
        if self.signum is None:
            self.signum = signum
        self._restore()
        if in_user_code[0]:
            raise StoppedWhileWaiting()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __exit__(self, *exc) -> None:
        self._restore()
        if self in _active:
            _active.remove(self)

    @property
    def requested(self) -> bool:
        return self.signum is not None


def stop_requested() -> bool:
    """Whether the running train() got a stop signal: code that waits on user code (timeouts.py) looks here."""
    return any(request.requested for request in _active)


def fault_point(name: str, step: int) -> bool:
    """Test hook: when TRAINING_WIZARD_FAULT_INJECT names this point and step (and rank), act on it.

    Costs one environment lookup when unset. Used by tests/reliability to kill a run (SIGKILL) or stop it
    (SIGTERM/SIGINT) at exact places: mid-generation, mid-update, between the files of a save, before the rename.
    Action `nan` sends no signal: the call returns True, and the caller makes its value non-finite (the
    multi-process tests of the non-finite guard). Returns False otherwise.
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return False
    rank = os.environ.get("RANK", "0")
    for entry in spec.split(","):
        target, _, action = entry.strip().partition("=")
        point, _, where = target.partition("@")
        at_step, _, at_rank = where.partition("#")
        if point != name or not at_step or int(at_step) != step or (at_rank and at_rank != rank) or entry in _fired:
            continue
        _fired.add(entry)
        if action == "nan":
            return True
        sig = {"": signal.SIGKILL, "kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[action]
        os.kill(os.getpid(), sig)
    return False
