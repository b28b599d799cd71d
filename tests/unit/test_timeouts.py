"""Rewards run under a timeout on the main thread, where they always ran (timeouts.py)."""

import signal
import threading
import time

import pytest

from training_wizard.errors import UserError
from training_wizard.timeouts import call_with_timeout, note_doing


def test_the_reward_runs_on_the_main_thread_and_may_use_signal_alarms():
    """math-verify's own timeouts set SIGALRM handlers, which Python allows on the main thread only."""
    def reward():
        previous = signal.signal(signal.SIGALRM, lambda *a: None)
        signal.signal(signal.SIGALRM, previous)
        return threading.current_thread() is threading.main_thread()

    assert call_with_timeout(reward, 5.0, "reward R", 1, "training.reward_timeout") is True


def test_a_call_past_its_timeout_is_one_line_naming_what_ran():
    def hangs():
        note_doing("reward function 'slow'")
        time.sleep(10**6)

    with pytest.raises(UserError) as failure:  # the function sleeps for days: only the timeout ends the call
        call_with_timeout(hangs, 0.3, "reward R", 4, "training.reward_timeout")
    assert str(failure.value).startswith(
        "reward function 'slow' did not return within training.reward_timeout = 0.3 s at step 4;")


def test_a_reward_that_swallows_exceptions_cannot_swallow_the_timeout():
    def stubborn():
        while True:
            try:
                time.sleep(10**6)
            except Exception:  # noqa: BLE001 - what a careless reward does
                pass

    with pytest.raises(UserError, match="did not return"):
        call_with_timeout(stubborn, 0.3, "reward R", 1, "training.reward_timeout")


def test_results_and_errors_pass_through_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGUSR1)
    assert call_with_timeout(lambda: [1.0, 2.0], 5.0, "reward R", 1, "k") == [1.0, 2.0]
    with pytest.raises(ValueError, match="bad"):
        call_with_timeout(lambda: (_ for _ in ()).throw(ValueError("bad")), 5.0, "reward R", 1, "k")
    assert signal.getsignal(signal.SIGUSR1) is before
