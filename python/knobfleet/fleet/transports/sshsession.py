"""The ssh transport's kept interpreters (``drift --watch``): one ``Session`` per host, an ssh process running the
host's cached probe entry in session mode (probeboot.serve), asked one line per call; ``Sessions``, the pool of
them one ``SshTransport`` keeps as its state.

Only a call with ``persist`` (``--watch``) loads this module (the transport creates its pool then): a one-shot
``drift`` never does.
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import threading
import time


class Session:
    """One host's probe interpreter kept across calls (``drift --watch``): an ssh process running the host's
    cached entry in session mode (probeboot.serve). Each call writes one line and reads one line back, so a
    repeated probe costs the host neither an ssh session, nor an interpreter start, nor loading the entry."""

    def __init__(self, argv: list[str], first: bytes) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pending = b""
        self.first = first.replace(b"\n", b" ") + b"\n"  # the call's private options: the first line

    def request(self, deadline: float) -> bytes | None:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(self.first + b"{}\n")
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return None
        self.first = b""
        fd = proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def close(self) -> None:
        """End the session: end of input for the host's side, then the ssh process (killed if it lingers)."""
        proc = self.proc
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class Sessions:
    """The sessions one ssh transport keeps (its state): keyed by their exact argv, at most ``max_open`` of them
    (each is an ssh process on the controller; hosts past that are asked the one-shot way). ``close_all`` (and
    exit) ends them, which ends the hosts' side."""

    def __init__(self, max_open: int = 256) -> None:
        self.max_open = max_open
        self._open: dict[tuple[str, ...], Session] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def ask(self, argv: list[str], first: bytes, deadline: float) -> bytes | None:
        """The answer of the session for ``argv`` (opened if need be), or None when it failed or was late (then
        it is closed: the caller runs the call the usual way, and the next call opens a new one)."""
        key = tuple(argv)
        with self._lock:
            session = self._open.get(key)
            if session is None and len(self._open) >= self.max_open:
                return None
        try:
            if session is None:
                session = Session(argv, first)
                with self._lock:
                    self._open[key] = session
            line = session.request(deadline)
        except OSError:
            line = None
        if line is None and session is not None:
            with self._lock:
                self._open.pop(key, None)
            session.close()
        return line

    def close_all(self) -> int:
        """Close every open session; how many there were."""
        with self._lock:
            sessions = list(self._open.values())
            self._open.clear()
        for session in sessions:
            session.close()
        return len(sessions)
