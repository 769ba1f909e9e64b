"""The stand-in launcher as a multi-node engine (``--nnodes N --node-rank r --dist-init-addr A:P``): real
launcher processes on loopback ports, joined over real TCP. Rank 0 is ready only when every rank joined with the
same settings (env, flags, engine version); a mismatch hangs in init (or exits with the consensus checker);
followers serve only a dummy health endpoint; a rank that goes away ends the other. Every process is ended by
its PID; deadlines are bounds, never measurements."""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from knobfleet.lab import hostfiles, sim
from knobfleet.lab.nspawn import Lab

BOUND_S = 30.0  # a generous bound on anything the launchers do here
BASE_ENV = {"PATH": "/usr/bin:/bin", "SGLANG_SIM_STARTUP_S": "0.2", "SGLANG_SIM_NOISE": "0"}
REPO_PATH = os.pathsep.join(p for p in sys.path if p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def answers(url: str, code: int) -> bool:
    try:
        return get(url)[0] == code
    except OSError:
        return False


def wait_for(cond: Callable[[], object], what: str, timeout: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        time.sleep(0.05)


@dataclass
class Rank:
    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self) -> int:
        return self.proc.wait(timeout=BOUND_S)


class Group:
    """Launchers of one engine group on 127.0.0.1: a rendezvous port and one HTTP port per rank."""

    def __init__(self, tmp: Path, nnodes: int = 2) -> None:
        self.tmp, self.nnodes = tmp, nnodes
        self.dist = f"127.0.0.1:{free_port()}"
        self.ranks: list[Rank] = []

    def start(
        self,
        rank: int,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        module: str = "knobfleet.lab.sim.launch_server",
        pythonpath: str = REPO_PATH,
    ) -> Rank:
        port = free_port()
        log_path = self.tmp / f"rank{rank}-{len(self.ranks)}.log"
        cmd = [sys.executable, "-m", module, "--model-path=/m", "--host=127.0.0.1", f"--port={port}",
               f"--nnodes={self.nnodes}", f"--node-rank={rank}", f"--dist-init-addr={self.dist}", *args]  # fmt: skip
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                env={**BASE_ENV, **(env or {}), "PYTHONPATH": pythonpath},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        r = Rank(proc, f"http://127.0.0.1:{port}", log_path)
        self.ranks.append(r)
        return r

    def end(self) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                os.kill(r.proc.pid, signal.SIGKILL)  # only the processes this test started, by PID
            r.proc.wait(timeout=BOUND_S)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    yield g
    g.end()


def ready_pair(group: Group, env: dict[str, str] | None = None) -> tuple[Rank, Rank]:
    r0 = group.start(0, env)
    r1 = group.start(1, env)
    wait_for(lambda: answers(r0.base + "/health", 200), "rank 0 ready")
    return r0, r1


def server_info(rank: Rank) -> dict[str, Any]:
    code, body = get(rank.base + "/get_server_info")
    assert code == 200
    info: dict[str, Any] = json.loads(body)
    return info


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def titles(pid: int) -> list[str]:
    found = []
    for child in children(pid):
        try:
            found.append((Path(f"/proc/{child}") / "cmdline").read_bytes().split(b"\0")[0].decode())
        except OSError:
            continue
    return sorted(found)


# -- a group that agrees ------------------------------------------------------------------------------------


def test_rank_0_waits_for_every_rank_then_serves_and_reports_them(group: Group) -> None:
    r0 = group.start(0, args=("--tp-size=2",))
    wait_for(lambda: answers(r0.base + "/get_server_info", 200), "rank 0's HTTP API up")
    info = server_info(r0)
    assert info["ranks"] == [{"rank": 1, "joined": False, "address": None, "fingerprint": None}]
    assert get(r0.base + "/health")[0] == 503 and get(r0.base + "/health_generate")[0] == 503
    r1 = group.start(1, args=("--tp-size=2",))
    wait_for(lambda: answers(r0.base + "/health", 200), "rank 0 ready once rank 1 joined")
    assert get(r0.base + "/health_generate")[0] == 200
    info = server_info(r0)
    assert (info["nnodes"], info["node_rank"], info["dist_init_addr"]) == (2, 0, group.dist)
    assert info["version"] == sim.__version__
    [peer] = info["ranks"]
    assert (peer["rank"], peer["joined"], peer["address"]) == (1, True, "127.0.0.1")
    assert len(peer["fingerprint"]) == 16
    # the follower: a dummy health endpoint only, and the same worker processes as rank 0
    assert get(r1.base + "/health") == (200, b"")
    assert get(r1.base + "/health_generate") == (200, b"")
    assert get(r1.base + "/get_server_info")[0] == 404
    assert get(r1.base + "/v1/models")[0] == 404
    want = ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    wait_for(lambda: titles(r1.proc.pid) == want, "the follower's renamed workers")
    wait_for(lambda: titles(r0.proc.pid) == want, "rank 0's renamed workers")
    assert "The server is fired up and ready to roll!" in r0.log
    assert "Init torch distributed ends. Joined rank 0" in r1.log


def test_sigterm_on_both_ranks_stops_the_group_cleanly(group: Group) -> None:
    r0, r1 = ready_pair(group)
    r0.proc.send_signal(signal.SIGTERM)
    r1.proc.send_signal(signal.SIGTERM)
    assert (r0.wait(), r1.wait()) == (0, 0)
    assert "Process group watchdog" not in r0.log and "is gone" not in r1.log


def test_rank_0_stops_accepting_ranks_as_soon_as_it_drains(group: Group) -> None:
    """On SIGTERM rank 0 closes the rendezvous port at once (a follower restarted now must not join the old
    process), while the request in flight still runs."""
    r0, _ = ready_pair(group, {"SGLANG_SIM_TIME_SCALE": "1", "SGLANG_SIM_DRAIN_TIMEOUT_S": "120"})
    body = json.dumps({"prompt": "long", "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(r0.base + "/v1/completions", body, {"Content-Type": "application/json"})

    def stream() -> None:
        try:
            with urllib.request.urlopen(req, timeout=BOUND_S) as resp:
                while resp.readline():
                    pass
        except (OSError, http.client.HTTPException):  # rank 0 is killed mid-stream at the end of the test
            pass

    threading.Thread(target=stream, daemon=True).start()
    wait_for(lambda: in_flight(r0) == 1, "a request in flight")
    r0.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "Received signal 15" in r0.log, "rank 0 draining")
    host, port = group.dist.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()
    assert r0.proc.poll() is None, "rank 0 is still draining its request"


def in_flight(rank: Rank) -> int:
    text = get(rank.base + "/metrics")[1].decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs")]
    return int(float(lines[0].rsplit(" ", 1)[1])) if lines else 0


# -- a rank that goes away ends the other ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("killed", "survivor", "line"),
    [
        (1, 0, "Process group watchdog thread terminated with exception: NCCL error: remote process exited or there "
               "was a network error (rank 1 (127.0.0.1) is gone)"),
        (0, 1, "[Rank 1] NCCL error: remote process exited or there was a network error (rank 0 at {dist} is gone)"),
    ],
)  # fmt: skip
def test_a_rank_that_goes_away_ends_the_other_with_an_error(
    group: Group, killed: int, survivor: int, line: str
) -> None:
    ranks = ready_pair(group)
    os.kill(ranks[killed].proc.pid, signal.SIGKILL)
    assert ranks[survivor].wait() != 0
    assert line.format(dist=group.dist) in ranks[survivor].log


def test_a_follower_that_leaves_before_the_group_formed_may_join_again(group: Group) -> None:
    """Until every rank is in, a rank may come and go (rank 0 still waits in init); once all are in, it serves."""
    group.nnodes = 3
    r0 = group.start(0)
    first = group.start(1)
    wait_for(lambda: answers(first.base + "/health", 200), "rank 1 joined")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.wait()
    wait_for(lambda: server_info(r0)["ranks"][0]["joined"] is False, "rank 0 saw rank 1 leave")
    assert get(r0.base + "/health")[0] == 503 and r0.proc.poll() is None
    group.start(1)
    group.start(2)
    wait_for(lambda: answers(r0.base + "/health", 200), "rank 0 ready with ranks 1 and 2")
    assert [(p["rank"], p["joined"]) for p in server_info(r0)["ranks"]] == [(1, True), (2, True)]


# -- ranks that disagree --------------------------------------------------------------------------------------


MISMATCHES = [
    pytest.param({"SGLANG_SM120_MMA_TARGET_CTAS": "768"}, (), "SGLANG_SM120_MMA_TARGET_CTAS: <unset> != 768", id="env"),
    pytest.param({}, ("--tp-size=2",), "tp_size: 1 != 2", id="flag"),
]


@pytest.mark.parametrize(("env", "args", "diff"), MISMATCHES)
def test_a_mismatched_rank_hangs_rank_0_in_init(
    group: Group, env: dict[str, str], args: tuple[str, ...], diff: str
) -> None:
    r0 = group.start(0)
    r1 = group.start(1, env, args)
    line = f"init: waiting in the first collective: rank 1 (127.0.0.1) {diff} (ranks disagree; this hangs)"
    wait_for(lambda: line in r0.log, "rank 0 names the difference")
    assert get(r0.base + "/health")[0] == 503 and get(r0.base + "/health_generate")[0] == 503
    assert server_info(r0)["ranks"][0]["joined"] is True
    assert r0.proc.poll() is None and r0.log.count("init: waiting") == 1
    # the follower's health proves nothing (its server may bind after rank 0 logged: a loaded machine)
    wait_for(lambda: answers(r1.base + "/health", 200), "the follower's health answers 200")


@pytest.mark.parametrize(("env", "args", "diff"), MISMATCHES)
def test_the_consensus_checker_exits_rank_0_naming_the_difference(
    group: Group, env: dict[str, str], args: tuple[str, ...], diff: str
) -> None:
    checker = {"SGLANG_ENABLE_RANK_CONSENSUS_CHECKER": "1"}
    r0 = group.start(0, checker)
    group.start(1, {**checker, **env}, args)
    assert r0.wait() == 1
    assert "Traceback (most recent call last):" in r0.log
    assert f"RuntimeError: rank settings differ: rank 1 (127.0.0.1) {diff}" in r0.log
    assert "fired up" not in r0.log


@pytest.fixture
def installs(tmp_path: Path) -> Callable[[str], str]:
    """Install the stand-in as the lab does (``Lab._install_sim``) under a fresh root; returns its site folder."""
    count = iter(range(100))

    def install(version: str) -> str:
        root = tmp_path / f"root{next(count)}"
        Lab(tmp_path / "state")._install_sim(root)
        site = root / hostfiles.SIM_SITE.lstrip("/")
        assert (site / "VERSION").read_text() == sim.__version__ + "\n"
        if version != sim.__version__:
            (site / "VERSION").write_text(version + "\n")
        return str(site.parent)

    return install


@pytest.mark.parametrize(
    ("v0", "v1", "diff"),
    [
        (sim.__version__, sim.__version__, None),
        ("0.5.1-sim", "0.5.1-sim", None),
        (sim.__version__, "0.5.1-sim", f"engine_version: {sim.__version__} != 0.5.1-sim"),
    ],
)
def test_ranks_must_run_the_same_engine_version(
    group: Group, installs: Callable[[str], str], v0: str, v1: str, diff: str | None
) -> None:
    """The version comes from the installed package's VERSION file; ranks with different ones disagree."""
    r0 = group.start(0, module="sglang_sim.launch_server", pythonpath=installs(v0))
    group.start(1, module="sglang_sim.launch_server", pythonpath=installs(v1))
    if diff is None:
        wait_for(lambda: answers(r0.base + "/health", 200), "rank 0 ready")
        assert server_info(r0)["version"] == v0
    else:
        wait_for(lambda: f"rank 1 (127.0.0.1) {diff} (ranks disagree" in r0.log, "rank 0 names the versions")
        assert get(r0.base + "/health")[0] == 503


# -- usage errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--node-rank=1",), "argument --node-rank: 1 is not in 0..0 (--nnodes 1)"),
        (("--nnodes=2", "--node-rank=2", "--dist-init-addr=127.0.0.1:1"), "argument --node-rank: 2 is not in 0..1"),
        (("--nnodes=2", "--node-rank=-1", "--dist-init-addr=127.0.0.1:1"), "argument --node-rank: -1 is not in 0..1"),
        (("--nnodes=2", "--node-rank=1"), "--nnodes 2 needs --dist-init-addr HOST:PORT"),
        (("--nnodes=2", "--dist-init-addr=127.0.0.1"), "argument --dist-init-addr: expected HOST:PORT"),
        (("--nnodes=2", "--dist-init-addr=127.0.0.1:99999"), "argument --dist-init-addr: expected HOST:PORT"),
        (("--nnodes=0",), "argument --nnodes: must be at least 1, got 0"),
    ],
)
def test_bad_rank_flags_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "knobfleet.lab.sim.launch_server", "--model-path=/m", *args],
        env={**BASE_ENV, "PYTHONPATH": REPO_PATH},
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: launch_server.py") and f"launch_server.py: error: {message}" in proc.stderr
    assert proc.stdout == ""
