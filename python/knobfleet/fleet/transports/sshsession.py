"""The ssh transport's kept interpreters (``drift --watch``): one ``Session`` per host, an ssh process running the
host's cached probe entry in session mode (probeboot.serve), asked one line per call.

Only a call with ``persist`` (``--watch``) loads this module (``ssh.iter_function`` imports it then): a one-shot
``drift`` never does. ``ssh.Session`` is this class, importable from there as before.
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import threading
import time
from typing import ClassVar


class Session:
    """One host's probe interpreter kept across calls (``drift --watch``): an ssh process running the host's
    cached entry in session mode (probeboot.serve). Each call writes one line and reads one line back, so a
    repeated probe costs the host neither an ssh session, nor an interpreter start, nor loading the entry.
    Sessions are keyed by their exact argv; ``close_all`` (and exit) ends them, which ends the host's side. At most
    ``MAX_OPEN`` are kept (each is an ssh process on the controller); hosts past that are asked the one-shot way."""

    MAX_OPEN: ClassVar[int] = 256
    _open: ClassVar[dict[tuple[str, ...], Session]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, argv: list[str], first: bytes) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pending = b""
        self.first = first.replace(b"\n", b" ") + b"\n"  # the call's private options: the first line

    @classmethod
    def ask(cls, argv: list[str], first: bytes, deadline: float) -> bytes | None:
        """The answer of the session for ``argv`` (opened if need be), or None when it failed or was late (then
        it is closed: the caller runs the call the usual way, and the next call opens a new one)."""
        key = tuple(argv)
        with cls._lock:
            session = cls._open.get(key)
            if session is None and len(cls._open) >= cls.MAX_OPEN:
                return None
        try:
            if session is None:
                session = cls(argv, first)
                with cls._lock:
                    cls._open[key] = session
            line = session.request(deadline)
        except OSError:
            line = None
        if line is None and session is not None:
            with cls._lock:
                cls._open.pop(key, None)
            session.close()
        return line

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

    @classmethod
    def close_all(cls) -> int:
        """Close every open session; how many there were."""
        with cls._lock:
            sessions = list(cls._open.values())
            cls._open.clear()
        for session in sessions:
            session.close()
        return len(sessions)


atexit.register(Session.close_all)
