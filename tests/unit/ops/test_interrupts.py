"""The signal handler itself: inside a shield it records the signal and says so once, on fd 2 directly. It never
goes through ``sys.stderr``: a signal can land in the middle of the main thread's own write to it, and a reentrant
write to a buffered stream raises ``RuntimeError`` right where the shield must hold."""

from __future__ import annotations

import signal
import sys

import pytest

from knobfleet.ops import interrupts


class MidWrite:
    """A stderr caught in the middle of a write: any further write is the reentrant one CPython refuses."""

    def write(self, _text: str) -> int:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    def flush(self) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")


def test_a_signal_during_a_write_to_stderr_is_recorded_not_raised(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(interrupts._state, "told", False)  # put back afterwards: the notice is said once a run
    monkeypatch.setattr(sys, "stderr", MidWrite())
    with interrupts.deferred(keep=True), interrupts.shielded(raise_at_end=False):
        interrupts.request(signal.SIGTERM)
        interrupts.request(signal.SIGINT)  # said once
        assert interrupts.pending()
    with pytest.raises(KeyboardInterrupt):
        interrupts.checkpoint()
    err = capfd.readouterr().err
    assert err.count("knobfleet: SIGTERM: letting the hosts finish their current step") == 1
    assert "SIGINT" not in err
    assert not interrupts.pending()


def test_outside_any_shield_a_signal_is_a_keyboard_interrupt_at_once() -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupts.request(signal.SIGTERM)


@pytest.mark.parametrize(
    ("code", "exits", "said"), [(1, 130, "had already failed and restored"), (0, 0, "had completed")]
)
def test_a_signal_after_the_last_step_is_said_and_a_failed_run_exits_130(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], code: int, exits: int, said: str
) -> None:
    """Issue 56 (LOW): a SIGTERM that arrived during a failing apply's restore, after its last step boundary, was
    dropped: exit 1, nothing said. The run still completes its restore; then the signal is said, and the failed
    run exits 130 as if it had come a step earlier."""
    monkeypatch.setattr(interrupts._state, "told", True)  # the "letting the hosts finish" notice is another test's
    with interrupts.handled():
        with interrupts.deferred(), interrupts.shielded(raise_at_end=False):
            interrupts.request(signal.SIGTERM)  # inside the restore's playbook run
        assert not interrupts.pending()  # dropped at the end of the run, not raised
        got = interrupts.late(code)
    assert got == exits
    assert f"knobfleet: SIGTERM arrived after the run's last step; the run {said}" in capfd.readouterr().err
    assert interrupts.late(code) == code  # said once


def test_a_run_without_a_late_signal_keeps_its_exit_code(capfd: pytest.CaptureFixture[str]) -> None:
    with interrupts.handled(), interrupts.deferred():
        pass
    assert interrupts.late(1) == 1 and capfd.readouterr().err == ""
