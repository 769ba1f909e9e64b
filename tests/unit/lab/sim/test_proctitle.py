"""Renamed workers: set_proctitle overwrites argv and environ like setproctitle; checked from outside
through /proc, on real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knobfleet.lab.sim.proctitle import memory_areas

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

CHILD = """
import ctypes, json, os, subprocess, sys
from knobfleet.lab.sim.proctitle import set_proctitle
title = sys.argv[1]
set_proctitle("x" * int(title[2:]) if title.startswith("x*") else title)
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
seen = {
    "os_environ": os.environ.get("KNOBFLEET_T"),
    "getenv": (libc.getenv(b"KNOBFLEET_T") or b"").decode(),
    "child": subprocess.run(["/bin/sh", "-c", "echo $KNOBFLEET_T"], capture_output=True, text=True).stdout.strip(),
}
print(json.dumps(seen), flush=True)
sys.stdin.read()
"""


def run_renamed(title: str, **extra_env: str) -> tuple[bytes, bytes, bytes, dict[str, str]]:
    """Start a child that renames itself; read its /proc entries from here while it waits."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path), "KNOBFLEET_T": "v-123", **extra_env}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, title],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        seen = json.loads(proc.stdout.readline())
        proc_dir = Path(f"/proc/{proc.pid}")
        cmdline, environ, comm = ((proc_dir / n).read_bytes() for n in ("cmdline", "environ", "comm"))
        proc.stdin.close()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return cmdline, environ, comm, seen


def fields(raw: bytes) -> list[bytes]:
    return [f for f in raw.split(b"\0") if f]


def test_title_replaces_cmdline_and_environ_is_gone_but_in_effect() -> None:
    cmdline, environ, comm, seen = run_renamed("sglang::scheduler_TP0")
    assert fields(cmdline) == [b"sglang::scheduler_TP0"]
    assert b"KNOBFLEET_T" not in environ and fields(environ) == []
    assert comm == b"sglang::schedul\n"  # TASK_COMM_LEN
    assert seen == {"os_environ": "v-123", "getenv": "v-123", "child": "v-123"}


def test_spt_noenv_keeps_environ_intact() -> None:
    cmdline, environ, _, seen = run_renamed("sglang::scheduler_TP1", SPT_NOENV="1")
    assert fields(cmdline) == [b"sglang::scheduler_TP1"]
    assert b"KNOBFLEET_T=v-123" in fields(environ) and b"SPT_NOENV=1" in fields(environ)
    assert seen["getenv"] == "v-123"


def test_a_long_title_is_cut_to_the_area() -> None:
    cmdline, _, _, _ = run_renamed("x*100000", SPT_NOENV="1")
    assert len(cmdline) < 10_000 and cmdline == b"x" * (len(cmdline) - 1) + b"\0"


def test_memory_areas_are_ordered() -> None:
    arg_start, arg_end, env_start, env_end = memory_areas()
    assert 0 < arg_start < arg_end <= env_start <= env_end


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_launcher_workers_are_renamed_like_sglang_schedulers(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "SGLANG_SIM_STARTUP_S": "30",
        "SGLANG_SM120_MMA_TARGET_CTAS": "512",
    }
    log = (tmp_path / "out").open("wb")
    argv = ["--model-path=/m", "--host=127.0.0.1", f"--port={free_port()}", "--tp", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "knobfleet.lab.sim.launch_server", *argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        titles: dict[bytes, bytes] = {}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(titles) < 3:
            time.sleep(0.2)
            titles = {}
            for pid in children(proc.pid):
                try:
                    cmd = fields(Path(f"/proc/{pid}/cmdline").read_bytes())
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
                if len(cmd) == 1 and cmd[0].startswith(b"sglang::"):
                    titles[cmd[0]] = environ
        assert sorted(titles) == [b"sglang::detokenizer", b"sglang::scheduler_TP0", b"sglang::scheduler_TP1"]
        assert all(b"SGLANG_SM120_MMA_TARGET_CTAS" not in e for e in titles.values())
        main_environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert b"SGLANG_SM120_MMA_TARGET_CTAS=512" in fields(main_environ)  # the main process is not renamed
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
