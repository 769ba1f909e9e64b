"""Issue 40's bound: no internal error, no traceback, no hang over 10 s and no memory over 200 MB for any input of
the nine classes of the third audit (docs/SECURITY.md, "Third audit"). One or two representative hostile inputs
per class, each given to the real ``knobfleet`` command line in a subprocess of its own.

How each run is measured: the command runs in a project made by ``knobfleet init`` in the test's temp dir (its
working folder), with HOME there too and KNOBFLEET_STATE_DIR in pytest's temp dir (one for all the cases, so the
catalogs' cache is made once); stdout and stderr go to files. A small wrapper
forks the command and waits for it with ``os.wait4``, which returns that one process's resource usage:
``ru_maxrss`` is its peak resident memory in KiB (Linux), not the sum over every child the test process ever had,
nor the test process's own size (see ``WRAPPER``). A command still running after 10 s is killed and the case
fails. Every server is a thread of the test bound to 127.0.0.1; every FIFO, symlink and
folder is made in the test's temp dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

LIMIT_S = 10.0
LIMIT_KIB = 200 * 1024
EXIT_CODES = {0, 1, 2, 3, 4, 6, 64, 130}  # `knobfleet --help`, "exit codes"


@dataclass
class Run:
    rc: int | None  # None: still running at the limit (killed)
    out: str
    err: str
    seconds: float
    maxrss_kib: int


# Started by the test, it forks the command and waits for it with os.wait4, writing "EXIT_CODE MAXRSS_KIB". Linux
# keeps a process's peak memory across exec, and a child the test process spawns starts its count at the test
# process's size; a child of this small wrapper starts at the wrapper's (about 8 MiB), so the figure is the
# command's own. The wrapper ignores SIGINT: one sent to the group reaches the command alone.
WRAPPER = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    # SIGINT as a terminal would deliver it, even when the suite runs as a background job (`make test &`), whose
    # shell starts it ignored: an ignored disposition survives exec and Python would keep it
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(sys.argv[2], sys.argv[2:])
signal.signal(signal.SIGINT, signal.SIG_IGN)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as fh:
    fh.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def knobfleet(
    tmp_path: Path,
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    vanish_cwd: bool = False,
    interrupt: threading.Event | None = None,
) -> Run:
    """``python -m knobfleet ARGS`` in ``cwd``, its exit code and peak memory from ``os.wait4`` (``WRAPPER``),
    killed at ``LIMIT_S``. ``vanish_cwd``: ``cwd`` is removed once the command is in it, before knobfleet starts
    (``sh`` cds there, removes it and execs python: one process, one measure). ``interrupt``: SIGINT once the event
    is set."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "KNOBFLEET_"))}
    full = {**base, "HOME": str(tmp_path), "KNOBFLEET_STATE_DIR": str(tmp_path / "state"), **(env or {})}
    argv = [sys.executable, "-m", "knobfleet", *args]
    if vanish_cwd:
        argv = ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(cwd), *argv]
        cwd = cwd.parent
    out_file, err_file, usage = tmp_path / "stdout.txt", tmp_path / "stderr.txt", tmp_path / "usage.txt"
    with out_file.open("wb") as out, err_file.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, str(usage), *argv],
            cwd=cwd,
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: the wrapper and the command, signalled together
        )
    started = time.monotonic()
    sent = False
    while proc.poll() is None:
        if interrupt is not None and interrupt.is_set() and not sent:
            os.killpg(proc.pid, signal.SIGINT)
            sent = True
        if time.monotonic() - started > LIMIT_S:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.02)
    seconds = time.monotonic() - started
    rc, maxrss = (int(x) for x in usage.read_text().split()) if usage.exists() else (None, 0)
    return Run(rc, out_file.read_text(errors="replace"), err_file.read_text(errors="replace"), seconds, maxrss)


# --- local servers (127.0.0.1 only) ---------------------------------------------------------------------------


@dataclass
class Servers:
    stops: list[Callable[[], None]] = field(default_factory=list)

    def http(self, status: int, body: bytes) -> str:
        """A server answering every GET with ``status`` and ``body``; its URL."""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

        def stop() -> None:
            server.shutdown()
            server.server_close()

        self.stops.append(stop)
        return f"http://127.0.0.1:{server.server_address[1]}"

    def raw(self, answer: Callable[[socket.socket, threading.Event], None]) -> tuple[str, threading.Event]:
        """A server that reads a request and runs ``answer(conn, stop)`` on each connection; its URL, and an event
        set once the first request has been read."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.2)
        stop, asked = threading.Event(), threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with conn:
                    conn.settimeout(5)
                    try:
                        conn.recv(65536)
                        asked.set()
                        answer(conn, stop)
                    except OSError:
                        pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(timeout=5)
            listener.close()

        self.stops.append(halt)
        return f"http://127.0.0.1:{listener.getsockname()[1]}", asked


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while not stop.is_set():  # a byte every 50 ms: every read is quick, the answer never complete
        conn.sendall(b"{")
        time.sleep(0.05)


def silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(LIMIT_S + 5)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    try:
        yield s
    finally:
        for stop in s.stops:
            stop()


# --- the project each command runs in -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state folder for every case: the catalogs' cache made by the first is read by the others."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    from knobfleet.project import init

    init(tmp_path / "proj")
    return tmp_path / "proj"


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def bomb_inventory(proj: Path) -> Path:
    from tests.unit.fleet.test_inventory_aliases import bomb

    inv = proj / "bomb-inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.1.1\n")
    (inv / "group_vars" / "all" / "bomb.yml").write_text(bomb() + "knob_serve_host_env: {X: *a9}\n")
    return inv


def host_inventory(proj: Path, extra: str = "", service: str = "sglang-decode") -> Path:
    inv = proj / "one-host.yml"
    inv.write_text(
        f"all:\n  hosts:\n    gpu1:\n      ansible_host: 127.0.1.1\n      knob_serve_service: {service}\n"
        "      knob_serve_port: 30000\n" + "".join(f"      {line}\n" for line in extra.splitlines())
    )
    return inv


def sweep(results: str) -> str:
    return '{"check": {"ok": true}, "gpu": {"name": "H200", "cc": "9.0", "sms": 132}, "results": ' + results + "}"


ROW = '{"batch": 8, "heads": 16, "context": 4096, "block_h": 16, "target_ctas": 512, "nsplit": 4, "ctas": 512, '


@dataclass
class Case:
    """What to run and what it must answer (always too: within 10 s, under 200 MB, an exit code of the list, no
    traceback, no internal error)."""

    args: list[str]
    rc: int
    says: list[str]  # each in stderr
    lines: int = 1  # stderr holds at most this many lines
    never: list[str] = field(default_factory=list)  # in neither stdout nor stderr
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "."  # the working folder, in the project
    vanish_cwd: bool = False
    interrupt: threading.Event | None = None


def case_1_writer_at_a_fifo(proj: Path, servers: Servers) -> Case:
    os.mkfifo(proj / "profiles" / "profiles.lock")
    return Case(["profiles", "lock"], 1, ["profiles.lock: is a FIFO (named pipe)", "nothing was written"])


def case_1_writer_at_a_dangling_symlink(proj: Path, servers: Servers) -> Case:
    os.symlink(proj.parent / "outside-the-project.lock", proj / "profiles" / "profiles.lock")
    return Case(["profiles", "lock"], 1, ["profiles.lock: is a symlink", "nothing was written"])


def case_2_alias_bomb(proj: Path, servers: Servers) -> Case:
    inv = bomb_inventory(proj)
    return Case(
        ["render", "mybase", "-i", str(inv), "--what", "env"],
        1,
        ["host lab1: knob_serve_host_env holds more than 100,000 values", "(an alias bomb?)"],
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def case_2_inventory_folder_loop(proj: Path, servers: Servers) -> Case:
    inv = proj / "loop-inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.1.1\n")
    os.symlink("..", inv / "group_vars" / "all" / "up")
    return Case(["render", "mybase", "-i", str(inv), "--what", "env"], 64, ["a symlink back to a folder above it"])


def case_3_secret_by_name(proj: Path, servers: Servers) -> Case:
    (proj / "profiles" / "leaky.yaml").write_text(
        "schema_version: 1\nname: leaky\nversion: 1\nengine: sglang\nenv:\n  DB_PASS: hunter2hunter2\n"
    )
    return Case(["profiles", "validate", "leaky"], 1, ["env.DB_PASS: a secret does not belong"], never=["hunter2"])


def case_3_secret_by_shape(proj: Path, servers: Servers) -> Case:
    (proj / "profiles" / "leaky.yaml").write_text(
        "schema_version: 1\nname: leaky\nversion: 1\nengine: sglang\nenv:\n"
        "  SGLANG_UPSTREAM: 'postgres://app:hunter2hunter2@db:5432/x'\n"
    )
    return Case(["profiles", "validate", "leaky"], 1, ["the value looks like a secret"], never=["hunter2"])


def case_4_prometheus_deep_answer(proj: Path, servers: Servers) -> Case:
    url = servers.http(200, deep(50_000))
    return Case(["load-profile", "--prometheus", url, "--json"], 1, ["not a Prometheus API answer"])


def case_4_prometheus_password_typed_raw(proj: Path, servers: Servers) -> Case:
    return Case(
        ["load-profile", "--prometheus", "http://admin:pa/ss#w@127.0.0.1:1", "--json"],
        1,
        ["http://***@127.0.0.1:1"],
        never=["admin", "pa/ss"],
    )


def case_4_prometheus_trickling(proj: Path, servers: Servers) -> Case:
    url, _asked = servers.raw(trickle)
    return Case(["load-profile", "--prometheus", url, "--json"], 1, ["no complete answer within"])


def case_5_sweep_5000_digits(proj: Path, servers: Servers) -> Case:
    (proj / "sweep.json").write_text(sweep("[" + ROW + '"attn_us": ' + "9" * 5000 + ', "total_us": 12.0}]'))
    return Case(["waves", "calibrate", "sweep.json"], 1, ["sweep.json"])


def case_5_sweep_nested_deep(proj: Path, servers: Servers) -> Case:
    (proj / "sweep.json").write_bytes(deep(100_000))
    return Case(["waves", "calibrate", "sweep.json"], 1, ["sweep.json: nested too deep"])


def case_5_weights_nan(proj: Path, servers: Servers) -> Case:
    return Case(["waves", "mybase", "--suggest", "--weights", "48=nan,64=inf"], 64, ["--weights '48=nan,64=inf'"])


def case_6_vanished_working_folder(proj: Path, servers: Servers) -> Case:
    gone = proj / "gone"
    gone.mkdir()
    return Case(["profiles", "list"], 1, ["knobfleet: "], cwd="gone", vanish_cwd=True)


def case_6_profile_path_loop(proj: Path, servers: Servers) -> Case:
    os.symlink(proj / "loop1.yaml", proj / "loop0.yaml")
    os.symlink(proj / "loop0.yaml", proj / "loop1.yaml")
    return Case(["profiles", "show", "./loop0.yaml"], 1, [".yaml: cannot read", "Too many levels of symbolic links"])


def case_6_state_folder_loop(proj: Path, servers: Servers) -> Case:
    os.symlink(proj / "state-loop", proj / "state-loop")
    return Case(["render", "mybase", "--what", "env"], 1, ["state-loop"], env={"KNOBFLEET_STATE_DIR": "state-loop"})


def case_7_ansible_cfg_fifo(proj: Path, servers: Servers) -> Case:
    (proj / "ansible.cfg").unlink()
    os.mkfifo(proj / "ansible.cfg")
    return Case(
        ["render", "mybase", "--what", "env"],
        64,
        ["ansible.cfg", "is a FIFO (named pipe); Ansible reads it at start"],
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def _vault_script(proj: Path, body: str) -> str:
    script = proj / "vault.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o700)
    return "./vault.sh"


def case_7_vault_script_never_stops(proj: Path, servers: Servers) -> Case:
    script = _vault_script(proj, "while :; do echo hunter2hunter2; done")
    return Case(
        ["render", "mybase", "--what", "env", "--vault-password-file", script],
        1,
        ["vault password script vault.sh: wrote more than 64 KiB; it was stopped"],
        never=["hunter2"],
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def case_7_vault_script_never_answers(proj: Path, servers: Servers) -> Case:
    script = _vault_script(proj, "echo hunter2hunter2 >&2; exec sleep 60")
    return Case(
        ["render", "mybase", "--what", "env", "--vault-password-file", script],
        1,
        ["vault password script vault.sh: no answer within"],
        never=["hunter2"],
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def case_8_reserved_unit_instance(proj: Path, servers: Servers) -> Case:
    host_inventory(proj, service="serial-getty@ttyS0")
    return Case(
        ["render", "mybase", "-i", "one-host.yml", "--what", "env"],
        1,
        ["'serial-getty@ttyS0' is a unit the host itself needs"],
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def case_8_loader_variable_in_a_profile(proj: Path, servers: Servers) -> Case:
    (proj / "profiles" / "ldp.yaml").write_text(
        "schema_version: 1\nname: ldp\nversion: 1\nengine: sglang\nenv:\n  LD_PRELOAD: /opt/x.so\n"
    )
    return Case(["profiles", "validate", "ldp"], 1, ["env.LD_PRELOAD: a loader variable"])


def case_9_router_deep_answer(proj: Path, servers: Servers) -> Case:
    url = servers.http(200, deep(50_000))
    host_inventory(proj, f"knob_router_url: {url}")
    return Case(
        ["router", "status", "-i", "one-host.yml"],
        4,
        [],
        lines=0,
        env={"KNOBFLEET_INVENTORY_CACHE": "0"},
    )


def case_9_interrupted_while_waiting(proj: Path, servers: Servers) -> Case:
    url, asked = servers.raw(silent)
    return Case(["load-profile", "--prometheus", url, "--json"], 130, ["knobfleet: interrupted"], interrupt=asked)


CASES = [
    case_1_writer_at_a_fifo,
    case_1_writer_at_a_dangling_symlink,
    case_2_alias_bomb,
    case_2_inventory_folder_loop,
    case_3_secret_by_name,
    case_3_secret_by_shape,
    case_4_prometheus_deep_answer,
    case_4_prometheus_password_typed_raw,
    case_4_prometheus_trickling,  # the client's 6 s deadline for the whole request
    case_5_sweep_5000_digits,
    case_5_sweep_nested_deep,
    case_5_weights_nan,
    case_6_vanished_working_folder,
    case_6_profile_path_loop,
    case_6_state_folder_loop,
    case_7_ansible_cfg_fifo,
    case_7_vault_script_never_stops,
    case_7_vault_script_never_answers,  # stopped at 6 s
    case_8_reserved_unit_instance,
    case_8_loader_variable_in_a_profile,
    case_9_router_deep_answer,
    case_9_interrupted_while_waiting,
]


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__.removeprefix("case_"))
def test_a_hostile_input_is_answered_within_the_bounds(
    tmp_path: Path, state: Path, project: Path, servers: Servers, make: Callable[[Path, Servers], Case]
) -> None:
    case = make(project, servers)
    env = {"KNOBFLEET_STATE_DIR": str(state), **case.env}
    cwd = project / case.cwd
    run = knobfleet(tmp_path, cwd, *case.args, env=env, vanish_cwd=case.vanish_cwd, interrupt=case.interrupt)
    shown = (
        f"rc {run.rc} in {run.seconds:.1f}s, {run.maxrss_kib // 1024} MiB\n"
        f"stdout: {run.out[:2000]}\nstderr: {run.err[:2000]}"
    )
    assert run.rc is not None, f"still running after {LIMIT_S:g}s\n{shown}"
    assert run.maxrss_kib < LIMIT_KIB, shown
    assert run.rc in EXIT_CODES and run.rc == case.rc, shown
    assert "Traceback" not in run.err + run.out and "internal error" not in run.err, shown
    assert len(run.err.strip().splitlines()) <= case.lines, shown
    for text in case.says:
        assert text in run.err, shown
    for text in case.never:
        assert text not in run.out + run.err, shown


def test_the_cases_cover_the_nine_classes() -> None:
    """Each case is named ``case_<class>_…``: every class of the audit has one that is held to the bounds."""
    held = {int(c.__name__.split("_")[1]) for c in CASES if callable(c)}
    assert held == set(range(1, 10))
