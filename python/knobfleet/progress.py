"""Live per-host progress on a terminal (rich); silent when not a TTY or with --json."""

from __future__ import annotations

import sys
import threading
from typing import Any

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
