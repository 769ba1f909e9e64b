"""Ctrl-C (SIGINT) and SIGTERM on the controller while hosts change: released or restored, never left locked.

``handled()`` (the CLI wraps the commands that change hosts in it) makes both signals raise
``KeyboardInterrupt`` in the main thread, as Ctrl-C does by default, with one difference: inside a
``shielded()`` section (a playbook run that changes hosts, a restore) a signal is recorded, not raised, and
raised when the section ends. The role then finishes the hosts' current call and releases their locks in its
``always`` (every call is bounded: the readiness timeout at most), and the rollout undoes what it did at the
next step boundary (``checkpoint``), exactly as for any other failure: restore, then the slots' undo. The
command then exits 130. SIGKILL stays the one hard stop (``--break-lock`` clears what it leaves).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from knobfleet.errors import EXIT_INTERRUPTED, KnobfleetError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KnobfleetError):
    """The run was interrupted (SIGINT, SIGTERM) and what it changed was undone; ``report`` says how."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class _State:
    depth = 0  # shielded sections entered
    deferring = 0  # deferred() sections entered: a signal waits for the next checkpoint, wherever it arrives
    pending: int | None = None  # a signal that arrived inside one
    told = False
    dropped: int | None = None  # a signal that arrived after the run's last boundary (``deferred``)


_state = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.depth > 0 or _state.deferring > 0:
        if _state.pending is None and not _state.told:
            _state.told = True
            # os.write, not sys.stderr: the handler may run inside the main thread's own write to stderr, and a
            # reentrant write to a buffered stream raises RuntimeError right where the shield must hold.
            with contextlib.suppress(OSError):
                os.write(
                    2,
                    f"knobfleet: {signal.Signals(signum).name}: letting the hosts finish their current step (they "
                    "release their locks), then restoring what this run changed\n".encode(),
                )
        _state.pending = signum
        return
    raise KeyboardInterrupt


@contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM become deferred-inside-a-shield ``KeyboardInterrupt``s while the block runs (main thread
    only; elsewhere it changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    _state.dropped = None
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _state.pending, _state.told = None, False


@contextmanager
def deferred(keep: bool = False) -> Iterator[None]:
    """The whole of a run that changes hosts (a rollout, a rollback): a signal never raises where it arrives, only
    at the run's next ``checkpoint``, its step boundaries, where the run knows what every host has done so far (a
    ``KeyboardInterrupt`` between two lines of bookkeeping would leave a host changed and reported untouched). A
    signal after the last boundary is dropped: the run completed and its report says so; with ``keep``, it stays
    pending for the caller's next ``checkpoint`` (a step inside a larger run: the canary's apply)."""
    _state.deferring += 1
    try:
        yield
    finally:  # one statement (no call in it): a signal cannot land between leaving and dropping what is pending
        _state.deferring, _state.pending, _state.dropped = (
            _state.deferring - 1,
            None if _state.deferring == 1 and _state.depth == 0 and not keep else _state.pending,
            _state.pending if _state.deferring == 1 and _state.depth == 0 and not keep and _state.pending is not None
            else _state.dropped,
        )  # fmt: skip


@contextmanager
def shielded(raise_at_end: bool = True) -> Iterator[None]:
    """Hold a signal until the block ends (nested blocks: until the outermost ends); then raise it, or, with
    ``raise_at_end=False`` or inside ``deferred()``, leave it for the caller's next ``checkpoint`` (it has results to
    read first)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
    if raise_at_end and _state.deferring == 0:  # inside deferred(), the run's own boundaries raise it
        checkpoint()


def late(code: int) -> int:
    """The exit code of a run that ``handled()`` wrapped, once it ended: a signal that arrived after its last step
    was not acted on (the run had completed, or failed and restored what it changed); it is said in one line, and
    a run that failed exits 130 (interrupted), as it would have had the signal come a step earlier."""
    if _state.dropped is None:
        return code
    name, _state.dropped = signal.Signals(_state.dropped).name, None
    import sys

    done = "had completed" if code == 0 else "had already failed and restored what it changed"
    sys.stderr.write(f"knobfleet: {name} arrived after the run's last step; the run {done}\n")
    return code if code == 0 else EXIT_INTERRUPTED


def pending() -> bool:
    """Whether a signal is waiting for the next checkpoint."""
    return _state.pending is not None


def request(signum: int = signal.SIGINT) -> None:
    """What the handler does, for a caller that is not the signal machinery (tests, a controller-side stop)."""
    _handler(signum, None)


def checkpoint() -> None:
    """A step boundary: raise a signal that arrived inside a shield (outside any shield)."""
    if _state.depth == 0 and _state.pending is not None:
        _state.pending = None
        raise KeyboardInterrupt
