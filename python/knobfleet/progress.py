"""Live progress on a terminal; silent when not a TTY or with --json. ``Progress``: a per-host table of Ansible's
task events (rich). ``StatusLine``: one line of counts for commands that stream per-host results, which at a
thousand hosts a table cannot show."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from knobfleet.fleet.runner import Event


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.rows: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._live: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._render(), console=Console(stderr=True), refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(box=None, show_header=True, header_style="bold")
        table.add_column("host")
        table.add_column("state")
        table.add_column("task")
        for host, (state, task) in sorted(self.rows.items()):
            table.add_row(host, state, task)
        return table

    def __call__(self, event: Event) -> None:
        if not self.enabled:
            return
        data = event.get("event_data") or {}
        host, task, kind = data.get("host"), str(data.get("task", "")), event.get("event", "")
        if not host:
            return
        state = {
            "runner_on_start": "running",
            "runner_on_ok": "ok",
            "runner_on_failed": "FAILED",
            "runner_on_unreachable": "UNREACHABLE",
            "runner_on_skipped": "skipped",
        }.get(kind)
        if state is None:
            return
        with self._lock:
            self.rows[host] = (state, task[:70])
            if self._live is not None:
                self._live.update(self._render())


class StatusLine:
    """``what: 37/64 hosts · 27 in flight · 36 in sync · 1 drift · 0 unreachable · 0 error`` on stderr, redrawn
    at most 10 times a second; lines written through ``write`` go to stdout above it."""

    def __init__(self, enabled: bool, what: str, total: int, forks: int) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.what, self.total, self.forks = what, total, forks
        self.finished = 0
        self.counts: dict[str, int] = {}
        self.answered: set[str] = set()
        self._shown = False
        self._drawn_at = 0.0
        self._lock = threading.Lock()

    def __enter__(self) -> StatusLine:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._clear()

    def text(self) -> str:
        done = self.finished or len(self.answered)
        flight = min(self.forks, self.total - done)
        counts = " · ".join(f"{self.counts.get(k, 0)} {k.replace('_', ' ')}" for k in ("in_sync", "drift"))
        broken = " · ".join(f"{self.counts.get(k, 0)} {k}" for k in ("unreachable", "error"))
        return f"{self.what}: {done}/{self.total} hosts · {flight} in flight · {counts} · {broken}"

    def _clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < 0.1:
            return
        self._drawn_at = now
        sys.stderr.write("\r\x1b[K" + self.text())
        sys.stderr.flush()
        self._shown = True

    def done(self, status: str) -> None:
        with self._lock:
            self.finished += 1
            self.counts[status] = self.counts.get(status, 0) + 1
            self._draw(force=self.finished == self.total)

    def write(self, text: str) -> None:
        """A result line on stdout (flushed, so pipes see it as it comes), the status line kept below it."""
        with self._lock:
            if self.enabled and sys.stdout.isatty():
                self._clear()
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
            self._draw()

    def event(self, event: Event) -> None:
        """An Ansible event (``--via ansible``): count the hosts that answered."""
        data = event.get("event_data") or {}
        if data.get("host") and event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            with self._lock:
                self.answered.add(str(data["host"]))
                self._draw()
