"""One HTTP exchange with one deadline for the whole of it (connect, request, headers, body), for the clients that
talk to servers of the operator's (routers, engines' /metrics, Prometheus): a server that trickles its answer a
byte at a time, or stops in the middle of its headers, cannot hold a rollout past its bound. A timer shuts the
socket down at the deadline, so even a read inside ``http.client``'s header parser returns at once.

Standard library only. http(s) only; no proxy variable is read (these servers are the operator's own, the lab's on
loopback); no redirect is followed.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping

CHUNK = 64 * 1024


class DeadlineExceeded(TimeoutError):
    """The whole exchange did not complete before its deadline."""


def exchange(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    max_body: int = 4 * 1024 * 1024,
) -> tuple[int, bytes]:
    """(status, body) of one request to ``url``, all of it within ``timeout_s``; an HTTP error status is returned,
    not raised. ``DeadlineExceeded`` past the deadline, ``OSError`` when the server cannot be reached,
    ``ValueError`` for a URL that is not http(s)://host[:port]. The body is cut at ``max_body`` bytes."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{parts.scheme or 'no'} scheme: only http:// and https:// URLs are opened")
    deadline = time.monotonic() + timeout_s
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    expired = threading.Event()
    held: list[socket.socket] = []  # the connected socket, kept: http.client drops conn.sock once an answer says the
    # connection will close (HTTP/1.0, Connection: close) and reads the body through its own file object

    def cut() -> None:
        expired.set()
        for sock in [*held, conn.sock]:
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if conn.sock is not None:
            held.append(conn.sock)
            if expired.is_set():  # the timer fired while connecting: cut what it could not see
                cut()
        conn.request(method, target, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        chunks: list[bytes] = []
        total = 0
        while total < max_body:
            chunk = resp.read1(min(CHUNK, max_body - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if expired.is_set() or time.monotonic() > deadline:
            raise DeadlineExceeded(f"no complete answer within {timeout_s:g}s")
        return resp.status, b"".join(chunks)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or time.monotonic() > deadline:
            raise DeadlineExceeded(f"no complete answer within {timeout_s:g}s") from None
        if isinstance(exc, OSError):
            raise
        raise OSError(f"bad HTTP answer ({type(exc).__name__})") from None
    finally:
        timer.cancel()
        conn.close()
