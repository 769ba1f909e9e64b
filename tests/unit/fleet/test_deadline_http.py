"""One deadline for a whole HTTP exchange (knobfleet.deadline_http), and the router client built on it: a server
on 127.0.0.1 that trickles its headers or its body a byte at a time, or never ends a chunked body, holds neither
the router client nor a drain past its bound; a plain answer still comes back whole."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from knobfleet.deadline_http import DeadlineExceeded, exchange
from knobfleet.fleet.router import Outcome, RouterError
from knobfleet.fleet.router_kinds import SGLangRouter

OK_BODY = b'{"workers": []}'


def serve(behaviour: str) -> Iterator[str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            try:
                if behaviour == "whole":
                    conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(OK_BODY) + OK_BODY)
                elif behaviour == "trickle-headers":
                    for b in head:
                        if stop.is_set():
                            return
                        conn.sendall(bytes([b]))
                        time.sleep(0.05)
                elif behaviour == "trickle-body":
                    conn.sendall(head + b"Content-Length: 100000\r\n\r\n")
                    while not stop.is_set():
                        conn.sendall(b" ")
                        time.sleep(0.05)
                elif behaviour in ("http10-trickle-body", "close-trickle-body"):
                    # the connection is to close after this answer: http.client drops conn.sock (issue 56)
                    head = b"HTTP/1.0 200 OK\r\n" if behaviour.startswith("http10") else head + b"Connection: close\r\n"
                    conn.sendall(head + b"\r\n")
                    while not stop.is_set():
                        conn.sendall(b" ")
                        time.sleep(0.05)
                elif behaviour == "endless-chunks":
                    conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
                    while not stop.is_set():
                        conn.sendall(b"1\r\n \r\n")
                        time.sleep(0.01)
                elif behaviour == "silent":
                    stop.wait(30)
            except OSError:
                return

    def loop() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


@pytest.fixture(
    params=["trickle-headers", "trickle-body", "http10-trickle-body", "close-trickle-body", "endless-chunks", "silent"]
)
def hostile(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from serve(request.param)


@pytest.fixture
def whole() -> Iterator[str]:
    yield from serve("whole")


def test_a_whole_answer_comes_back(whole: str) -> None:
    assert exchange(whole + "/workers", timeout_s=5) == (200, OK_BODY)


def test_no_answer_holds_the_exchange_past_its_deadline(hostile: str) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"no complete answer within 0\.6s"):
        exchange(hostile + "/workers", timeout_s=0.6)
    assert time.monotonic() - started < 3.0


def test_the_router_client_is_bounded_too(hostile: str) -> None:
    started = time.monotonic()
    with pytest.raises(RouterError) as exc:
        SGLangRouter(hostile, timeout=0.6).list_workers()
    assert exc.value.outcome in (Outcome.UNREACHABLE, Outcome.REFUSED)
    assert "\n" not in str(exc.value)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/", "http:///nohost", "gopher://x/"])
def test_only_http_urls_are_opened(url: str) -> None:
    with pytest.raises(ValueError, match="only http:// and https://"):
        exchange(url)
