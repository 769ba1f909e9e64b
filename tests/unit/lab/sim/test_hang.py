"""The stand-in's hung-stream fault (SGLANG_SIM_HANG): seeded picks, a 200 stream that stops sending tokens and is
held until the client leaves, a drain or its bound, and the launcher's refusal of a bad value."""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from knobfleet.lab.sim import hang
from knobfleet.lab.sim.hang import Hang
from knobfleet.lab.sim.server import State
from tests.unit.lab.sim.test_server import free_port, run_launcher
from tests.unit.lab.sim.test_server import server as server  # the fixture: the stand-in on a loopback port


@pytest.mark.parametrize(
    ("env", "fraction", "max_s"),
    [
        ({}, None, None),
        ({"SGLANG_SIM_HANG": "0"}, None, None),
        ({"SGLANG_SIM_HANG": "0.25"}, 0.25, 300.0),
        ({"SGLANG_SIM_HANG": "1", "SGLANG_SIM_HANG_MAX_S": "2.5"}, 1.0, 2.5),
    ],
)
def test_the_fault_is_read_from_the_environment(
    env: dict[str, str], fraction: float | None, max_s: float | None
) -> None:
    got = hang.from_env(env)
    assert (got.fraction, got.max_s) == (fraction, max_s) if got is not None else fraction is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SGLANG_SIM_HANG": "1.5"}, "SGLANG_SIM_HANG='1.5': expected the fraction of streamed requests that hang"),
        ({"SGLANG_SIM_HANG": "nan"}, "SGLANG_SIM_HANG='nan'"),
        ({"SGLANG_SIM_HANG": "some"}, "SGLANG_SIM_HANG='some'"),
        ({"SGLANG_SIM_HANG": "0.1", "SGLANG_SIM_HANG_MAX_S": "0"}, "SGLANG_SIM_HANG_MAX_S='0': expected the seconds"),
        ({"SGLANG_SIM_HANG": "0.1", "SGLANG_SIM_HANG_MAX_S": "7200"}, "SGLANG_SIM_HANG_MAX_S='7200'"),
    ],
)
def test_a_bad_value_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        hang.from_env(env)


def test_a_bad_value_ends_the_launchers_start() -> None:
    proc = run_launcher({"SGLANG_SIM_HANG": "2", "PYTHONPATH": sys.path[0]}, "--model-path=/m", "--port",
                        str(free_port()))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "ValueError: SGLANG_SIM_HANG='2': expected the fraction of streamed requests that hang, 0..1" in proc.stderr


def test_the_picks_are_seeded_and_near_the_fraction() -> None:
    a, b = Hang(0.2, seed=7), Hang(0.2, seed=7)
    picks = [a.at(16) for _ in range(2000)]
    assert picks == [b.at(16) for _ in range(2000)]  # the same seed picks the same requests
    assert picks != [Hang(0.2, seed=8).at(16) for _ in range(2000)]
    hung = [p for p in picks if p is not None]
    assert 0.17 < len(hung) / len(picks) < 0.23 and set(hung) == {0, 1, 2}
    assert {Hang(1.0, seed=1).at(1) for _ in range(50)} == {0}  # a 1-token stream hangs before its token
    assert all(Hang(0.0, seed=1).at(16) is None for _ in range(50))


def _stream(
    url: str, chat: bool = False, timeout: float = 0.5
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    if chat:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": True, "stream": True}
    else:
        body = {"prompt": "hello there", "max_tokens": 8, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})  # fmt: skip
    return conn, conn.getresponse()


def _tokens_until_silence(resp: http.client.HTTPResponse) -> tuple[int, bool]:
    """(token events read, whether the stream went silent: no byte for the connection's 0.5 s timeout)."""
    events = 0
    try:
        for raw in resp:
            line = raw.strip()
            if line.startswith(b"data:") and line != b"data: [DONE]":
                events += 1
            if line == b"data: [DONE]":
                return events, False
    except TimeoutError:
        return events, True
    return events, False


def _wait(what: str, condition: object) -> None:
    deadline = time.monotonic() + 5
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("chat", [False, True])
def test_a_hung_stream_is_a_200_that_stops_sending_tokens_until_the_client_leaves(
    server: tuple[str, State], chat: bool
) -> None:
    url, state = server
    state.ready.set()
    state.hang = Hang(1.0, max_s=30, seed=3)
    after = Hang(1.0, seed=3).at(8)
    assert after is not None
    conn, resp = _stream(url, chat)
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events, silent = _tokens_until_silence(resp)
    assert silent and events == after + (1 if chat else 0)  # chat's role event first, then the tokens sent
    assert state.active == 1  # held: the request has not ended
    resp.close()  # the client gives up: the stand-in lets the request go
    conn.close()
    _wait("the held request ended when its client left", lambda: state.active == 0)


def test_a_drain_or_the_bound_ends_a_hung_stream_without_its_end(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    state.hang = Hang(1.0, max_s=0.8, seed=3)
    conn, resp = _stream(url, timeout=5)  # a client that waits past the bound
    started = time.monotonic()
    body = resp.read()
    assert b"[DONE]" not in body and 0.6 < time.monotonic() - started < 4  # cut at the bound, never completed
    conn.close()
    state.hang = Hang(1.0, max_s=60, seed=3)
    conn, resp = _stream(url, timeout=5)
    threading.Timer(0.3, state.draining.set).start()
    started = time.monotonic()
    assert b"[DONE]" not in resp.read() and time.monotonic() - started < 4  # the drain let it go at once
    conn.close()
    _wait("no request held after the drain", lambda: state.active == 0)


def test_requests_that_do_not_stream_and_streams_not_picked_complete(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    state.hang = Hang(1.0, seed=3)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 4, "ignore_eos": True}),
                 {"Content-Type": "application/json"})  # fmt: skip
    doc = json.loads(conn.getresponse().read())
    assert doc["usage"]["completion_tokens"] == 4
    conn.close()
    state.hang = Hang(0.000001, seed=3)
    conn, resp = _stream(url)
    assert _tokens_until_silence(resp) == (9, False)  # 8 tokens and the final chunk, then [DONE]
    conn.close()


@pytest.fixture(autouse=True)
def _no_hang_left(server: tuple[str, State]) -> Iterator[None]:
    yield
    server[1].draining.set()  # a stream a failed test left held ends before the server stops
