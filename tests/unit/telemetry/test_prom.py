"""The Prometheus client against a real HTTP server on loopback that answers as Prometheus's API does: values,
scalars, alerts, and each failure as one line naming the URL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from knobfleet.telemetry.prom import PromError, Prometheus

ANSWERS: dict[str, tuple[int, Any]] = {
    "up": (
        200,
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"job": "engine", "host": "lab1"}, "value": [1.0, "1"]},
                    {"metric": {"job": "node", "host": "lab1"}, "value": [1.0, "0"]},
                ],
            },
        },
    ),
    "scalar(1)": (200, {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "1.5"]}}),
    "up[5m]": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
    "bad(": (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}),
    "junk": (200, "not json"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/api/v1/query":
            code, body = ANSWERS[parse_qs(url.query)["query"][0]]
        elif url.path == "/api/v1/alerts":
            code, body = (
                200,
                {
                    "status": "success",
                    "data": {
                        "alerts": [{"labels": {"alertname": "KnobfleetDrift", "host": "lab2"}, "state": "firing"}]
                    },
                },
            )
        elif url.path == "/-/ready":
            code, body = 200, "Prometheus Server is Ready."
        else:
            code, body = 404, "404 page not found"
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def prom() -> Iterator[Prometheus]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Prometheus(f"http://127.0.0.1:{server.server_address[1]}/", timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()


def test_instant_vector_and_scalar(prom: Prometheus) -> None:
    assert [(s.labels["job"], s.value) for s in prom.query("up")] == [("engine", 1.0), ("node", 0.0)]
    assert [s.value for s in prom.query("scalar(1)")] == [1.5]
    assert prom.ready()


def test_alerts(prom: Prometheus) -> None:
    (alert,) = prom.alerts()
    assert (alert.name, alert.state, alert.labels["host"]) == ("KnobfleetDrift", "firing", "lab2")


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("bad(", "/api/v1/query: HTTP 400: parse error at char 5"),
        ("junk", "/api/v1/query: not a Prometheus API answer (invalid JSON)"),
        ("up[5m]", ": query 'up[5m]' gave a matrix, expected an instant vector"),
    ],
)
def test_failures_are_one_line(prom: Prometheus, expr: str, message: str) -> None:
    with pytest.raises(PromError) as info:
        prom.query(expr)
    assert str(info.value) == prom.url + message


def test_unreachable_names_the_url_and_the_fix() -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prom = Prometheus(f"http://127.0.0.1:{port}", timeout_s=2)
    assert not prom.ready()
    with pytest.raises(PromError) as info:
        prom.query("up")
    assert str(info.value).startswith(f"http://127.0.0.1:{port}: Prometheus unreachable (")
    assert str(info.value).endswith("start it (`knobfleet lab up --monitoring` in the lab) or pass --prometheus URL")
    assert "\n" not in str(info.value)
