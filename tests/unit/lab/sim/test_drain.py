"""The stand-in drains on SIGTERM like SGLang: health 503 at once, new requests refused, the ones in flight run to
their end ([DONE]), then it exits 0; a watchdog bounds the wait; SGLANG_FORCE_SHUTDOWN skips it. A real
launcher process on a loopback port, a real signal."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from knobfleet.fleet.router import parse_inflight
from knobfleet.lab.loadgen import classify_stream


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_for(cond: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not after {timeout}s"
        time.sleep(0.05)


@pytest.fixture
def launcher(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {"PATH": "/usr/bin:/bin", "SGLANG_SIM_STARTUP_S": "0.2", "SGLANG_SIM_TIME_SCALE": "0.25",
           "SGLANG_SIM_NOISE": "0", **getattr(request, "param", {})}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "knobfleet.lab.sim.launch_server", "--model-path=/m", "--host=127.0.0.1",
         f"--port={port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ok(base + "/health"), "stand-in ready")
    yield proc, base
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def in_flight(base: str) -> int:
    """Running + queued requests, read from /metrics as the router steps read them."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        return parse_inflight(r.read().decode(), ("sglang:num_running_reqs", "sglang:num_queue_reqs"))


def _ok(url: str) -> bool:
    try:
        return status(url) == 200
    except OSError:
        return False


def stream_one(base: str, max_tokens: int, out: dict[str, object]) -> None:
    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"prompt": "drain", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out["status"] = resp.status
    out["outcome"] = classify_stream(iter(resp.readline, b""))
    conn.close()


def test_sigterm_drains_in_flight_requests_then_exits(launcher: tuple[subprocess.Popen[str], str]) -> None:
    proc, base = launcher
    result: dict[str, object] = {}
    t = threading.Thread(target=stream_one, args=(base, 256, result))
    t.start()
    wait_for(lambda: in_flight(base) == 1, "in flight")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: status(base + "/health") == 503, "health 503 while draining")
    req = urllib.request.Request(base + "/v1/completions", json.dumps({"prompt": "x"}).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 503 and b"shutting down" in refused.value.read()
    t.join(timeout=60)
    assert result["status"] == 200
    assert result["outcome"] == ("ok", 257, True)  # 256 tokens + the final chunk, then [DONE]
    assert proc.wait(timeout=30) == 0
    log = proc.stdout.read() if proc.stdout else ""
    assert "draining 1 request(s) in flight" in log and "Graceful shutdown: no request in flight." in log


@pytest.mark.parametrize(
    ("launcher", "line"),
    [
        ({"SGLANG_SIM_DRAIN_TIMEOUT_S": "0.3"}, "Graceful shutdown watchdog: 1 request(s) still running after 0.3s"),
        ({"SGLANG_FORCE_SHUTDOWN": "1"}, "Received signal 15"),
    ],
    indirect=["launcher"],
)
def test_watchdog_and_force_shutdown_cut_the_stream(launcher: tuple[subprocess.Popen[str], str], line: str) -> None:
    proc, base = launcher
    result: dict[str, object] = {}
    t = threading.Thread(target=stream_one, args=(base, 4000, result))
    t.start()
    wait_for(lambda: in_flight(base) == 1, "in flight")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    t.join(timeout=30)
    outcome = result.get("outcome")
    assert isinstance(outcome, tuple) and outcome[0] == "truncated"
    assert line in (proc.stdout.read() if proc.stdout else "")
