"""The probe's loopback GET (no urllib on the hot path) answers exactly as urllib does, and hands urllib whatever it
would read otherwise (redirects, chunked bodies, proxies, other hosts). A local server on 127.0.0.1 only."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from knobfleet.module_utils import knob_http
from knobfleet.module_utils import knob_observe as ko


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            return
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/ok?q=1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        code = {"/sick": 503, "/nothing": 404}.get(self.path.split("?")[0], 200)
        body = b'{"path": "%s"}' % self.path.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("path", ["/ok", "/ok?x=1#frag", "/sick", "/nothing", "/chunked", "/moved", ""])
def test_the_same_answer_as_urllib(server: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [k for k in __import__("os").environ if k.lower().endswith("_proxy")]:
        monkeypatch.delenv(var)
    assert knob_http.http_get(server + path, 2.0) == knob_http.urllib_get(server + path, 2.0)


def test_only_plain_loopback_urls_without_proxies_take_the_socket(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("http_proxy", raising=False)
    assert knob_http.loopback_get(server + "/ok", 2.0) == (200, b'{"path": "/ok"}')
    assert knob_http.loopback_get(server + "/chunked", 2.0) is None  # urllib decodes it
    assert knob_http.loopback_get(server + "/moved", 2.0) is None  # urllib follows it
    for url in ("https://127.0.0.1/", "http://10.0.0.1/", "http://u@127.0.0.1/", "http://[::1]:80/", "not a url"):
        assert knob_http.loopback_target(url) is None
    assert knob_http.loopback_target("http://localhost:8000/h?x") == ("localhost", 8000, "localhost:8000", "/h?x")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    assert knob_http.loopback_target(server + "/ok") is None  # urllib would ask the proxy


def test_a_refused_connection_is_no_answer() -> None:
    assert knob_http.loopback_get("http://127.0.0.1:9/health", 0.5) == (None, None)


def test_run_output_is_one_bounded_child() -> None:
    assert ko.run_output(["printf", "a=1\\nb=2"], 5) == "a=1\nb=2"
    with pytest.raises(OSError, match="timed out"):
        ko.run_output(["sleep", "5"], 0.2)
    with pytest.raises(OSError):
        ko.run_output(["/nonexistent/knobfleet-test"], 1)
