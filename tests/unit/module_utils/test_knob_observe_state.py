"""The probe's process state (``/proc/PID/stat`` field 3) and verify's liveness witness (a bounded one-token
completion), on processes and servers this test starts itself (loopback only)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from knobfleet.lab.sim.engine import Engine, EngineConfig
from knobfleet.lab.sim.model import KernelKnobs
from knobfleet.lab.sim.server import State, make_server
from knobfleet.module_utils import knob_http, knob_procfs


def _state(pid: int) -> str:
    btime, hz = knob_procfs.boot_time(), os.sysconf("SC_CLK_TCK")
    proc = knob_procfs.process(pid, btime, hz)
    assert proc is not None
    return str(proc["state"])


def test_a_stopped_process_reads_T_and_a_zombie_Z() -> None:
    # The child says when it is about to sleep: while the interpreter is still starting it may read "D" (paging
    # its own files in from a busy disk) or "R"; once it sleeps it reads "S".
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10
        while _state(child.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(child.pid) == "S"
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(child.pid) == "T"
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z" and time.monotonic() < deadline:  # dead, not yet reaped by us
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine_url() -> Iterator[str]:
    cfg = EngineConfig(KernelKnobs(), 188, time_scale=0.001, noise=0.0, overlap=False, max_running=8, seed=1)
    engine = Engine(cfg)
    state = State({"model_path": "/m"}, {}, engine, expose_env=False, model_name="/m")
    state.ready.set()
    httpd = make_server("127.0.0.1", free_port(), state)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    engine.stop()
    httpd.shutdown()
    httpd.server_close()


def test_liveness_is_a_one_token_completion(engine_url: str) -> None:
    got = knob_http.liveness(engine_url + "/v1/completions", 5.0)
    assert got["status"] == 200 and got["url"] == engine_url + "/v1/completions" and got["timeout_s"] == 5.0


def test_liveness_of_an_engine_that_accepts_but_never_answers_is_bounded() -> None:
    """A hung engine (its API process accepts, its stopped worker never generates): no status, within the bound."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/v1/completions"
        got = knob_http.liveness(url, 0.3)
    assert got["status"] is None


def test_liveness_of_nothing_listening_and_an_error_status(engine_url: str) -> None:
    assert knob_http.liveness(f"http://127.0.0.1:{free_port()}/v1/completions", 1.0)["status"] is None
    assert knob_http.liveness(engine_url + "/v1/no-such-endpoint", 2.0)["status"] == 404
