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


def test_only_http_and_https_are_opened() -> None:
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "127.0.0.1:9090", "http://"):
        with pytest.raises(PromError, match=r"http:// or https:// only|not a URL"):
            Prometheus(url)


def test_credentials_are_sent_and_never_shown() -> None:
    import base64

    seen: list[str] = []

    class Auth(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(500)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prom = Prometheus(f"http://admin:s3cr%40t@127.0.0.1:{server.server_port}")
        with pytest.raises(PromError) as exc:
            prom.query("up")
        assert "s3cr" not in str(exc.value) and "admin" not in str(exc.value)
        assert str(exc.value).startswith(f"http://***@127.0.0.1:{server.server_port}/api/v1/query: HTTP 500")
        assert seen == ["Basic " + base64.b64encode(b"admin:s3cr@t").decode()]
    finally:
        server.shutdown()


def test_a_trickling_server_cannot_hold_a_request_past_its_deadline() -> None:
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(200):  # a byte every 50 ms: each read is quick, the whole answer takes 10 s
            if stop.is_set():
                break
            try:
                conn.sendall(b"{")
            except OSError:
                break
            time.sleep(0.05)
        conn.close()

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    started = time.monotonic()
    try:
        with pytest.raises(PromError, match=r"no complete answer within 1s"):
            Prometheus(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1.0).query("up")
        assert time.monotonic() - started < 3.0
    finally:
        stop.set()
        t.join(timeout=5)
        listener.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"status": "success", "data": []}',
        b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}',
        b'{"status": "success", "data": {"resultType": "vector", "result": [{"value": "x"}]}}',
        b'{"status": "success", "data": {"resultType": "scalar", "result": 5}}',
        b"[1, 2]",
        b"[" * 50000 + b"]" * 50000,
    ],
)
def test_an_answer_of_the_wrong_shape_is_one_line(body: bytes) -> None:
    class Odd(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PromError) as exc:
            Prometheus(f"http://127.0.0.1:{server.server_port}").query("up")
        assert "not a Prometheus API answer" in str(exc.value) and "\n" not in str(exc.value)
    finally:
        server.shutdown()


def test_json_output_never_holds_infinity() -> None:
    from knobfleet import report_text

    text = report_text.to_json({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


@pytest.mark.parametrize(
    ("name", "matchers", "selector"),
    [
        ("sglang:num_running_reqs", "", '{__name__=~"sglang:num_running_reqs|sglang_num_running_reqs"}'),
        (
            "vllm:e2e_request_latency_seconds_sum",
            'host=~"a|b"',
            '{__name__=~"vllm:e2e_request_latency_seconds_sum|vllm_e2e_request_latency_seconds_sum", host=~"a|b"}',
        ),
        ("smg_router_requests_total", "", "smg_router_requests_total"),  # no colon: one spelling
        ("up", 'job="engine"', 'up{job="engine"}'),
    ],
)
def test_series_matches_both_spellings_of_a_colon_name(name: str, matchers: str, selector: str) -> None:
    from knobfleet.telemetry.prom import series

    assert series(name, matchers) == selector
