"""Live progress on a terminal; silent when not a TTY or with --json. ``Progress``: a per-host table of Ansible's
task events (rich). ``StatusLine``: one line of counts for commands that stream per-host results, which at a
thousand hosts a table cannot show. ``Rounds``: the progress of a measurement that runs in rounds (``ab``,
``bench --repeats``, the gate): a live line on a terminal, one line per round otherwise (always on stderr)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from knobfleet.fleet.runner import Event


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.rows: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._live: Any = None
        self.status = ""  # a line under the table (``Rounds`` writes it)

    def set_status(self, text: str) -> None:
        with self._lock:
            self.status = text
            if self._live is not None:
                self._live.update(self._render(), refresh=True)  # a round's result shows at once

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
        if not self.status:
            return table
        from rich.console import Group
        from rich.text import Text

        return Group(table, Text(self.status, style="bold"))

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


def duration(seconds: float) -> str:
    """37s, 4m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Rounds:
    """Progress of a measurement in rounds: which round of at most ``limit``, what it has found so far, the time
    per round, the ETA to the last possible round and what comes next.

    On a terminal (``stream`` is a TTY) it is a live line: under ``table``'s task table when that is shown, else
    redrawn in place. Without a terminal it writes one line per finished round, so a log or CI shows it and a
    ``--json`` document on stdout stays as it was."""

    def __init__(
        self,
        what: str,
        limit: int,
        unit: str = "round",
        *,
        at_most: bool = True,
        table: Progress | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.limit, self.unit, self.at_most = what, limit, unit, at_most
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.table = table if table is not None and table.enabled else None
        self.clock = clock
        self.started = clock()
        self._round_started = self.started
        self.k = 0
        self.times: list[float] = []
        self.last = ""  # what the last finished round found
        self._shown = False

    def _of(self, k: int) -> str:
        return f"{self.unit} {k} of {'at most ' if self.at_most else ''}{self.limit}"

    def pace(self) -> str:
        """``1m26s per round, last possible round in ~17m12s`` (empty before the first round ends)."""
        if not self.times:
            return ""
        per = sum(self.times) / len(self.times)
        left = self.limit - len(self.times)
        last = "last possible" if self.at_most else "last"
        eta = f"{last} {self.unit} in ~{duration(per * left)}" if left > 0 else f"that was the {last} {self.unit}"
        return f"{duration(per)} per {self.unit}, {eta}"

    def start(self, k: int, doing: str) -> None:
        """Round ``k`` (1-based) begins; on a terminal the line says what it is doing."""
        self.k, self._round_started = k, self.clock()
        self.step(doing)

    def step(self, doing: str) -> None:
        if not self.live:
            return
        elapsed = duration(self.clock() - self._round_started)
        parts = [f"{self.what}: {self._of(self.k)}", f"{doing} ({elapsed})", self.last, self.pace()]
        self._show(" · ".join(p for p in parts if p))

    def done(self, k: int, found: str, next_step: str) -> str:
        """Round ``k`` ended: ``found`` (the estimate so far), ``next_step`` (what happens now). Returns the line."""
        self.times.append(self.clock() - self._round_started)
        self.last = found
        parts = [f"{self.what}: {self._of(k)} done", found, self.pace(), f"next: {next_step}"]
        line = " · ".join(p for p in parts if p)
        if self.live:
            self._show(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()
        return line

    def _show(self, text: str) -> None:
        if self.table is not None:
            self.table.set_status(text)
            return
        import shutil  # only for a status line on a terminal

        width = shutil.get_terminal_size((160, 24)).columns
        self.stream.write("\r\x1b[K" + (text if len(text) < width else text[: width - 2] + "…"))
        self.stream.flush()
        self._shown = True

    def close(self, final: str | None = None) -> None:
        """Clear the live line; ``final`` (if any) stays on the terminal as a plain line."""
        if self.table is not None:
            self.table.set_status("")
        elif self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = False
        if final and self.live:
            self.stream.write(final + "\n")
        self.stream.flush()
