"""The on-host readiness module (roles/knob_serve/library/knob_ready.py) through main(), in-process, with
Ansible's real AnsibleModule: systemd is a small stand-in answering the module's systemctl and journalctl
commands, the engine's health endpoint a local HTTP server. What is done, when the engine counts as ready, and
every way it fails (exited, restarted by systemd, not ready in time, a systemctl that fails) with the
journal attached."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from ansible.module_utils import basic

REPO = Path(__file__).resolve().parents[3]


def load() -> Any:
    for util in ("knob_fs", "knob_live", "knob_observe", "knob_redact", "knob_startup", "knob_store", "knob_cache"):
        sys.modules.setdefault(
            f"ansible.module_utils.{util}", importlib.import_module(f"knobfleet.module_utils.{util}")
        )
    spec = importlib.util.spec_from_file_location(
        "knob_role_knob_ready", REPO / "roles/knob_serve/library/knob_ready.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kr = load()


class Systemd:
    """One unit's state and the commands the module ran; ``on_show`` may change the state as time goes by."""

    def __init__(self) -> None:
        self.enabled, self.active, self.pid, self.restarts, self.status = "disabled", "inactive", "0", 0, "0"
        self.ran: list[list[str]] = []
        self.fail: dict[str, str] = {}  # verb -> stderr of a failing systemctl
        self.shows = 0
        self.on_show: Any = None
        self.log = "engine: loading\nengine: boom\n"

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        self.ran.append(list(argv))
        if argv[0] == "journalctl":
            return 0, self.log, ""
        verb = argv[1]
        if verb in self.fail:
            return 1, "", self.fail[verb]
        if verb == "is-enabled":
            return (0 if self.enabled == "enabled" else 1), self.enabled + "\n", ""
        if verb == "is-active":
            return (0 if self.active == "active" else 3), self.active + "\n", ""
        if verb == "enable":
            self.enabled = "enabled"
        elif verb in ("restart", "start"):
            self.active, self.pid = "active", str(int(self.pid or 0) + 100)
        elif verb == "show":
            self.shows += 1
            if self.on_show:
                self.on_show(self)
            props = {
                "MainPID": self.pid,
                "NRestarts": str(self.restarts),
                "ActiveState": self.active,
                "SubState": "running" if self.active == "active" else "dead",
                "ControlGroup": "",
                "ExecMainStatus": self.status,
            }
            return 0, "".join(f"{k}={v}\n" for k, v in props.items()), ""
        return 0, "", ""


class Health(BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        status = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def systemd(monkeypatch: pytest.MonkeyPatch) -> Systemd:
    fake = Systemd()
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: fake.run_command(argv, **kw))
    return fake


def ready(capsys: pytest.CaptureFixture[str], **args: Any) -> tuple[int, dict[str, Any]]:
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": {"service": "e.service", **args}}).encode()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        kr.main()
    out = capsys.readouterr().out
    return int(info.value.code or 0), json.loads(out[out.index("{") :])


def test_restart_until_the_health_check_answers(
    systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    Health.answers = [503, 503, 200]
    systemd.active, systemd.pid = "active", "7"
    rc, res = ready(
        capsys,
        url=url,
        daemon_reload=True,
        restart=True,
        script_path=str(tmp_path / "s.sh"),
        unit_path=str(tmp_path / "e.service"),
        state_dir=str(tmp_path / "state"),
    )
    assert rc == 0 and res["step"] == "ready" and res["changed"] is True
    assert res["done"] == ["daemon-reload", "restart"] and res["main_pid"] == 107 and res["n_restarts"] == 0
    assert res["ready_s"] >= 0.2  # two 503s, 0.1 s apart
    assert ["systemctl", "daemon-reload"] in systemd.ran and ["systemctl", "restart", "e.service"] in systemd.ran
    assert res["probe"]["unit"] == "e.service" and res["probe"]["health"] == 200


def test_only_a_daemon_reload_is_no_change(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Health.answers = [200]
    systemd.active, systemd.pid, systemd.enabled = "active", "5", "enabled"
    rc, res = ready(capsys, url=url, daemon_reload=True, enable=True, start=True)
    assert rc == 0 and res["done"] == ["daemon-reload"] and res["changed"] is False and "probe" not in res


def test_enable_and_start_a_stopped_engine(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Health.answers = [200]
    rc, res = ready(capsys, url=url, enable=True, start=True)
    assert rc == 0 and res["done"] == ["enable", "start"] and res["changed"] is True and res["main_pid"] == 100


def test_check_mode_says_what_it_would_do(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, res = ready(capsys, url=url, daemon_reload=True, restart=True, _ansible_check_mode=True)
    assert rc == 0 and res == {**res, "changed": True, "step": "ready", "would": ["daemon-reload", "restart"]}
    assert [c[1] for c in systemd.ran] == ["is-enabled", "is-active"]


def test_an_engine_that_exits_during_start_up(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Health.answers = [503]

    def crash(s: Systemd) -> None:
        if s.shows >= 3:
            s.active, s.pid, s.status = "failed", "0", "1"

    systemd.on_show = crash
    rc, res = ready(capsys, url=url, restart=True)
    assert rc == 1 and res["step"] == "ready"
    assert res["msg"] == "engine exited during start-up (unit failed, exit status 1)"
    assert res["journal"] == ["engine: loading", "engine: boom"] and res["state"]["ActiveState"] == "failed"


CRASH_LOG = (
    "Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "memory_pool.py", line 9, in alloc\n'
    "    copy_all_layer_kv_cache_cpu(\n"
    "NotImplementedError: sgl_kernel.copy_all_layer_kv_cache_cpu: no sgl_kernel CPU kernels in this install\n"
    + "".join(f"systemd: restart noise {i}\n" for i in range(20))
)


def test_the_engines_last_error_reaches_the_message_through_the_restart_noise(
    systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash whose traceback is further up than the journal tail systemd's restart lines fill: the exception
    line is put first in the journal and named in the message; journalctl reads this start's lines only."""
    Health.answers = [503]
    systemd.log = CRASH_LOG

    def crash(s: Systemd) -> None:
        if s.shows >= 3:
            s.active, s.pid, s.status = "failed", "0", "9"

    systemd.on_show = crash
    rc, res = ready(capsys, url=url, restart=True)
    cause = "NotImplementedError: sgl_kernel.copy_all_layer_kv_cache_cpu: no sgl_kernel CPU kernels in this install"
    assert (
        rc == 1
        and res["msg"]
        == f"engine exited during start-up (unit failed, exit status 9); the engine's last error: {cause}"
    )
    assert (
        res["journal"][0] == cause and len(res["journal"]) == 16 and res["journal"][-1] == "systemd: restart noise 19"
    )
    (cmd,) = [c for c in systemd.ran if c[0] == "journalctl"]
    assert cmd[cmd.index("--since") + 1].startswith("@")


@pytest.mark.parametrize(
    ("lines", "cause"),
    [
        (["ValueError: bad", "later: fine"], "ValueError: bad"),
        (["KeyError: 'x'", "RuntimeError: second"], "RuntimeError: second"),
        (["torch.OutOfMemoryError: CUDA out of memory"], "torch.OutOfMemoryError: CUDA out of memory"),
        (["SystemExit"], "SystemExit"),
        (["KeyboardInterrupt"], "KeyboardInterrupt"),
        (["  NotImplementedError: indented  "], "NotImplementedError: indented"),
        (["error: lowercase is a log line, not an exception"], None),
        (["INFO Error handling is on"], None),
        (["The Error: prose"], None),
        (["E" * 3000 + "Error: huge"], None),
        ([], None),
    ],
)
def test_last_error_is_the_last_exception_line(lines: list[str], cause: str | None) -> None:
    assert kr.last_error(lines) == cause
    assert kr.failed(lines) == (f"; the engine's last error: {cause}" if cause else "")


def test_an_engine_systemd_restarted_is_not_ready(
    systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Health.answers = [503]

    def restarted(s: Systemd) -> None:
        if s.shows == 3:
            s.pid, s.restarts = "101", 1

    systemd.on_show = restarted
    rc, res = ready(capsys, url=url, restart=True)
    assert rc == 1
    assert res["msg"] == "systemd restarted the engine during start-up (main PID 100 -> 101, restarts 0 -> 1)"


def test_a_restart_within_the_grace_period(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Health.answers = [200]

    def restarted(s: Systemd) -> None:
        if s.shows == 4:
            s.pid = "102"

    systemd.on_show = restarted
    rc, res = ready(capsys, url=url, restart=True, grace_s=1)
    assert rc == 1 and res["msg"] == (
        "systemd restarted the engine within 1s after becoming ready (main PID 100 -> 102, restarts 0 -> 0)"
    )


@pytest.mark.parametrize(("answers", "said"), [([503], "503"), ([], "nothing (connection refused)")])
def test_not_ready_in_time(
    systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str], answers: list[int], said: str
) -> None:
    Health.answers = answers
    target = url if answers else "http://127.0.0.1:9/health"
    rc, res = ready(capsys, url=target, restart=True, timeout_s=0)
    assert rc == 1 and res["msg"] == f"not ready after 0s: {target} answered {said}"
    assert res["journal"] == ["engine: loading", "engine: boom"] and res["waited_s"] >= 0


def test_a_failing_systemctl_is_named(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    systemd.fail = {"restart": "Job for e.service failed.\n"}
    rc, res = ready(capsys, url=url, restart=True)
    assert rc == 1 and res["msg"] == "systemctl restart e.service failed: Job for e.service failed."
    assert res["journal"] == ["engine: loading", "engine: boom"]
    systemd.fail = {"daemon-reload": "no bus"}
    rc, res = ready(capsys, url=url, daemon_reload=True)
    assert rc == 1 and res["msg"] == "systemctl daemon-reload failed: no bus" and res["journal"] == []
    systemd.fail = {"show": "Unit e.service not loaded."}
    rc, res = ready(capsys, url=url)
    assert rc == 1 and res["msg"] == "systemctl show e.service failed: Unit e.service not loaded."


def test_a_restart_is_measured_from_systemd_and_the_journal_and_kept_in_the_ledger(
    systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's stop, start-to-ready and phases (the catalog's patterns over the journal's JSON lines since the
    start, on systemd's monotonic clock), returned and appended to the service's ledger as an event ``start``."""
    import time

    from knobfleet.module_utils.knob_store import Store

    Health.answers = [200]
    systemd.active, systemd.pid = "active", "7"
    now = int(time.monotonic() * 1e6)
    stamps = {
        "ActiveExitTimestampMonotonic": now - 9_000_000,
        "InactiveEnterTimestampMonotonic": now - 8_000_000,
        "InactiveExitTimestampMonotonic": now - 7_000_000,
        "ExecMainStartTimestampMonotonic": now - 6_000_000,
    }
    lines = [(now - 5_000_000, "Load weight end. elapsed=1.00 s"), (now - 2_000_000, "Capture decode CUDA graph end.")]
    journal = "\n".join(json.dumps({"__MONOTONIC_TIMESTAMP": str(at), "MESSAGE": m}) for at, m in lines)
    plain = systemd.run_command

    def answer(argv: list[str], **kw: Any) -> tuple[int, str, str]:
        if argv[:2] == ["systemctl", "show"] and "Timestamp" in argv[-1]:
            systemd.ran.append(list(argv))
            return 0, "".join(f"{k}={v}\n" for k, v in stamps.items()), ""
        if argv[0] == "journalctl" and "json" in argv:
            systemd.ran.append(list(argv))
            return 0, journal, ""
        return plain(argv, **kw)

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, argv, **kw: answer(argv, **kw))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    phases = [
        {"name": "weights", "pattern": "^Load weight end"},
        {"name": "cuda_graph", "pattern": "CUDA graph end"},
        {"name": "never_logged", "pattern": "^nothing"},
    ]
    cache = tmp_path / "cache" / "sglang"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.bin").write_bytes(b"x")
    rc, res = ready(
        capsys, url=url, restart=True, state_dir=str(state), phases=phases, run_id="r1", cache_dir=str(cache)
    )
    assert rc == 0, res
    s = res["startup"]
    assert (s["kind"], s["stop_s"], s["pre_s"], s["cache"]) == ("restart", 1.0, 1.0, "warm")
    assert 7.0 <= s["start_s"] < 9.0
    assert [(p["phase"], p["s"]) for p in s["phases"][:2]] == [("weights", 1.0), ("cuda_graph", 3.0)]
    assert s["phases"][-1]["phase"] == "serving" and len(s["phases"]) == 3
    (cmd,) = [c for c in systemd.ran if c[0] == "journalctl"]
    assert cmd[cmd.index("--since") + 1].startswith("@")
    (entry,) = [json.loads(x) for x in Path(Store(str(state)).ledger).read_text().splitlines()]
    assert entry["event"] == "start" and entry["run_id"] == "r1" and entry["start_s"] == s["start_s"]
    assert entry["generation"] is None and "time" in entry


def test_no_start_no_measure(systemd: Systemd, url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    Health.answers = [200]
    systemd.active, systemd.pid, systemd.enabled = "active", "5", "enabled"
    rc, res = ready(capsys, url=url, start=True, state_dir=str(tmp_path))
    assert rc == 0 and "startup" not in res and not (tmp_path / "ledger.jsonl").exists()
