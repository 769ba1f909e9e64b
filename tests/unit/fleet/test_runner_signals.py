"""ansible-runner, given no cancel callback, installs SIGINT/SIGTERM handlers of its own (SIGKILL the playbook, never
put back). The runner never lets it: knobfleet's own handlers (ops/interrupts) stay in place during a run, and
without them a signal stops the run as before, the handlers come back, and the signal is raised afterwards."""

from __future__ import annotations

import os
import signal

import pytest

from knobfleet.fleet.runner import _signals
from knobfleet.ops import interrupts


def test_a_given_cancel_is_used_as_is() -> None:
    def mine() -> bool:
        return False

    before = signal.getsignal(signal.SIGINT)
    with _signals(mine) as cancel:
        assert cancel is mine
        assert signal.getsignal(signal.SIGINT) is before


def test_knobfleets_own_handlers_are_left_alone() -> None:
    with interrupts.handled():
        mine = signal.getsignal(signal.SIGINT)
        with _signals(None) as cancel:
            assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
            assert cancel() is False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_without_them_a_signal_cancels_the_run_then_is_raised(signum: int) -> None:
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
        with pytest.raises(KeyboardInterrupt), _signals(None) as cancel:
            assert cancel() is False
            os.kill(os.getpid(), signum)
            for _ in range(1000):  # the handler runs between bytecodes
                if cancel():
                    break
            assert cancel() is True  # ansible-runner polls this and stops ansible-playbook
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        signal.signal(signal.SIGINT, old)
