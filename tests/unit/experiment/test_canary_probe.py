"""The canary's hung-stream probes against real local HTTP servers on 127.0.0.1: the stand-in engine with its
SGLANG_SIM_HANG fault, a server that keeps its stream alive with comments but sends no token, and a port nobody
listens on; every probe bounded in count and time."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from knobfleet.experiment import canary_probe
from knobfleet.experiment.canary import Settings
from knobfleet.experiment.canary_probe import HostProbes, Round, probed
from knobfleet.fleet.hostvars import HostVars
from knobfleet.groups import EngineGroup, Member
from knobfleet.lab.sim.hang import Hang
from knobfleet.lab.sim.server import State
from tests.unit.lab.sim.test_server import free_port
from tests.unit.lab.sim.test_server import server as server  # the fixture: the stand-in on a loopback port


def _hv(url: str, name: str = "lab1") -> HostVars:
    host, port = url.removeprefix("http://").split(":")
    return HostVars(host=name, listen_host=host, port=int(port))


def test_a_stand_in_whose_streams_hang_is_counted_per_probe(server: tuple[str, State]) -> None:
    """Half the stand-in's streams hang (seeded): each hung probe is closed after the bound and counted hung, the
    others complete; the round ends within the bound of its last probe."""
    url, state = server
    state.ready.set()
    state.hang = Hang(0.5, max_s=30, seed=11)
    draws = Hang(0.5, seed=11)
    expected = sum(draws.at(canary_probe.PROBE_TOKENS) is not None for _ in range(8))
    assert 0 < expected < 8  # the seed gives both kinds
    started = time.monotonic()
    got = Round([_hv(url)], probes=8, hang_s=0.6, window_s=0.6).result()
    assert got == {"lab1": HostProbes(sent=8, hung=expected, failed=0)}
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while state.active and time.monotonic() < deadline:  # each closed probe let its held request go
        time.sleep(0.02)
    assert state.active == 0


def test_a_healthy_stand_in_has_no_hung_stream_and_probes_spread_over_the_window(server: tuple[str, State]) -> None:
    url, state = server
    state.ready.set()
    started = time.monotonic()
    got = Round([_hv(url, "a"), _hv(url, "b")], probes=3, hang_s=0.5, window_s=1.5).result()
    assert got == {"a": HostProbes(3, 0, 0), "b": HostProbes(3, 0, 0)}
    assert time.monotonic() - started >= 2 * (1.5 - 0.5) / 3  # the third probe started a window's share later


class _Comments(BaseHTTPRequestHandler):
    """A 200 stream that sends an SSE comment every 0.1 s and never a token (a frontend keeping a dead stream
    alive), for at most 5 s."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        body = b'{"data": [{"id": "m"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for _ in range(50):
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            return


@pytest.fixture
def comments() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), _Comments)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_bytes_without_a_token_are_still_a_hung_stream(comments: str) -> None:
    started = time.monotonic()
    got = Round([_hv(comments)], probes=2, hang_s=0.5, window_s=0.5).result()
    assert got == {"lab1": HostProbes(2, 2, 0)}
    assert time.monotonic() - started < 3  # closed after the bound, not when the server gives up (5 s)


def test_no_stream_at_all_is_a_failed_probe_not_a_hung_one(server: tuple[str, State]) -> None:
    url, _state = server  # not ready: every completion is a 503
    with socket.socket() as s:  # a port nobody listens on: refused
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    got = Round([_hv(url, "busy"), _hv(closed, "gone")], probes=2, hang_s=0.5, window_s=0.5).result()
    assert got == {"busy": HostProbes(2, 0, 2), "gone": HostProbes(2, 0, 2)}


def test_a_probe_that_raises_is_failed_and_every_round_is_bounded() -> None:
    def boom(hv: HostVars, stall_s: float, deadline: float) -> dict[str, object]:
        raise RuntimeError("no")

    hv = HostVars(host="x", listen_host="127.0.0.1", port=9)
    assert Round([hv], probes=99, hang_s=0.1, window_s=0.1, send=boom).result() == {"x": HostProbes(32, 0, 32)}
    assert canary_probe.start([hv], Settings(probes=0)) is None  # probing off: no round at all


def test_only_a_head_that_serves_the_api_is_probed() -> None:
    group = EngineGroup("g", "tp", (Member("a", "127.0.1.1", 0, "rank"), Member("b", "127.0.1.2", 1, "rank")))
    head, follower = (HostVars(host=h, listen_host="127.0.1.1", port=1, group=group) for h in ("a", "b"))
    assert probed(head) and not probed(follower) and probed(HostVars(host="c", listen_host="127.0.1.3", port=1))
