"""fleet.router_kinds: the sglang kind's requests for each API generation, checked against a recording HTTP
server on a loopback port that answers like the generation it plays (0.3 is checked against the real router in
tests/integration/test_router.py); the step factory and the checks built from host vars."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.fleet.router import Outcome, RouterError
from knobfleet.fleet.router_kinds import (
    LEGACY,
    SGLangRouter,
    hosts_out_of_router,
    route_of,
    router_for,
    stop_covers_drain,
)

W1, W2 = "http://127.0.1.1:30000", "http://127.0.1.2:30000"


class Recorder(BaseHTTPRequestHandler):
    generation = "0.2"
    workers: ClassVar[list[str]] = []
    seen: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self.seen.append(f"{self.command} {self.path} {body}".strip())
        gen = self.generation
        if self.command == "GET" and self.path == "/workers" and gen == "0.2":
            self._send(200, {"workers": [{"url": u, "is_healthy": True} for u in self.workers]})
        elif self.command == "GET" and self.path == "/list_workers" and gen == LEGACY:
            self._send(200, {"urls": self.workers})
        elif self.command == "DELETE" and self.path.startswith("/workers/") and gen == "0.2":
            self._send(200 if self.path == "/workers/http%3A%2F%2F127.0.1.1%3A30000" else 404, {"error": "no such"})
        elif self.command == "POST" and self.path == "/workers" and gen == "0.2":
            self._send(200, {"status": "ok"})
        elif self.command == "POST" and self.path.startswith(("/add_worker?", "/remove_worker?")) and gen == LEGACY:
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    do_GET = do_POST = do_DELETE = _handle


@pytest.fixture(params=["0.2", LEGACY])
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[str, type[Recorder]]]:
    handler = type("R", (Recorder,), {"generation": request.param, "workers": [W1, W2], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def test_older_generations_remove_and_add_by_url(fake: tuple[str, type[Recorder]]) -> None:
    url, handler = fake
    router = SGLangRouter(url)
    assert [w.url for w in router.list_workers()] == [W1, W2]
    router.remove(W1)
    router.add(W1)
    if handler.generation == "0.2":
        assert router.detect() == "0.2"
        assert handler.seen[-3:] == [
            "GET /workers",
            "DELETE /workers/http%3A%2F%2F127.0.1.1%3A30000",
            'POST /workers {"url": "http://127.0.1.1:30000"}',
        ]
    else:
        assert router.detect() == LEGACY
        assert handler.seen[-2:] == [
            "POST /remove_worker?url=http%3A%2F%2F127.0.1.1%3A30000",
            "POST /add_worker?url=http%3A%2F%2F127.0.1.1%3A30000",
        ]


@pytest.mark.parametrize("fake", ["0.2"], indirect=True)
def test_a_refused_removal_is_typed(fake: tuple[str, type[Recorder]]) -> None:
    url, _ = fake
    with pytest.raises(RouterError) as err:
        SGLangRouter(url).remove(W2)
    assert err.value.outcome is Outcome.UNKNOWN_WORKER
    assert str(err.value) == f"router {url}: remove {W2} refused (404): no such"


def test_unreachable_and_unknown_kind() -> None:
    with pytest.raises(RouterError) as err:
        SGLangRouter("http://127.0.0.1:9").list_workers()
    assert err.value.outcome is Outcome.UNREACHABLE and "check knob_router_url" in str(err.value)
    with pytest.raises(RouterError, match="knob_router_kind 'nginx': unknown router kind; known: sglang"):
        router_for("nginx", "http://127.0.0.1:9")


def hv(host: str, **extra: Any) -> Any:
    base = {"ansible_host": "127.0.1.1", "knob_serve_listen_host": "127.0.1.1", "knob_serve_port": 30000}
    return from_inventory_vars(host, {**base, **extra}, "inventory")


def test_a_route_from_host_vars() -> None:
    assert route_of(hv("lab1"), set()) is None
    out: set[str] = set()
    route = route_of(hv("lab1", knob_router_url="http://127.0.0.1:30080", knob_drain_timeout=7,
                        knob_router_max_unavailable="25%", knob_serve_readiness_timeout_s=45), out)  # fmt: skip
    assert route is not None
    assert (route.worker_url, route.drain_timeout_s, route.max_unavailable) == (W1, 7, "25%")
    assert route.router.url == "http://127.0.0.1:30080" and route.out is out and route.inflight is not None
    assert route.healthy_timeout_s == 45


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"knob_router_url": "http://127.0.0.1:30080", "knob_drain_timeout": 30}, None),
        (
            {"knob_router_url": "http://127.0.0.1:30080", "knob_drain_timeout": 60, "knob_serve_timeout_stop_s": 60},
            "host lab1: knob_serve_timeout_stop_s (60) must exceed knob_drain_timeout (60): systemd would kill an "
            "engine still draining",
        ),
    ],
)
def test_stop_covers_drain(extra: dict[str, Any], reason: str | None) -> None:
    assert stop_covers_drain(hv("lab1", **extra)) == reason


def test_hosts_out_of_router(fake: tuple[str, type[Recorder]]) -> None:
    url, handler = fake
    handler.workers = [W2]
    hosts = [hv("lab1", knob_router_url=url), hv("lab3"), hv("lab4", knob_router_url="http://127.0.0.1:9")]
    found = hosts_out_of_router(hosts)
    assert found[url] == ["lab1"]
    assert found["http://127.0.0.1:9"][0].startswith("router http://127.0.0.1:9: unreachable")
