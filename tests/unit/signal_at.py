"""The signal-anywhere tests' tracer: the signal handler's own code (``interrupts.request``, what SIGINT and
SIGTERM run) called at the k-th line executed inside the given folders of the package."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from knobfleet.ops import interrupts

PKG = Path(interrupts.__file__).parent.parent


class SignalAt:
    def __init__(self, k: int, folders: tuple[str, ...] = ("ops",)) -> None:
        self.k, self.n, self.fired, self.at = k, 0, False, ""
        self.roots = tuple(str(PKG / f) for f in folders)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and not frame.f_code.co_filename.startswith(self.roots):
            return None
        if event == "line" and not self.fired:
            self.n += 1
            if self.n == self.k:
                self.fired = True
                self.at = f"{Path(frame.f_code.co_filename).relative_to(PKG)}:{frame.f_lineno} ({frame.f_code.co_name})"
                interrupts.request()  # raises here outside a shield or a deferred run, as the real handler does
        return self


@contextmanager
def signal_at(k: int, folders: tuple[str, ...] = ("ops",)) -> Iterator[SignalAt]:
    """Trace the block, signalling at its k-th line under ``folders``; the interrupt state is reset afterwards."""
    tracer = SignalAt(k, folders)
    sys.settrace(tracer)
    try:
        yield tracer
    finally:
        sys.settrace(None)
        interrupts._state.pending = None
        interrupts._state.depth = interrupts._state.deferring = 0
