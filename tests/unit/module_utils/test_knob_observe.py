"""The host readers behind every probe (module_utils/knob_observe.py) and the probe module itself, in-process
against temp dirs, this test's own process and a local HTTP server: bounded reads that never follow a link
or open a special file, generations, locks and the ledger as the live-state rule receives them, the health
and info endpoints, and secret values hashed before the document leaves the host."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from ansible.module_utils import basic

from knobfleet.module_utils import knob_http, knob_procfs
from knobfleet.module_utils import knob_observe as ko
from knobfleet.module_utils.knob_redact import redact_value

REPO = Path(__file__).resolve().parents[3]


# --- files ------------------------------------------------------------------------------------------------------


def test_read_bounded_reads_up_to_the_limit_and_says_when_it_cut(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    data, cut, st = ko.read_bounded(str(f), 10)
    assert (data, cut, st.st_size) == (b"x" * 10, False, 10)
    data, cut, _ = ko.read_bounded(str(f), 9)
    assert (data, cut) == (b"x" * 9, True)
    big = tmp_path / "big"
    big.write_bytes(b"y" * 200_000)  # several reads
    data, cut, _ = ko.read_bounded(str(big), 150_000)
    assert len(data) == 150_000 and cut


def test_file_info_of_a_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "serve.sh"
    f.write_text("#!/bin/bash\nexec x\n")
    f.chmod(0o750)
    info = ko.file_info(str(f))
    assert info == {
        "path": str(f),
        "exists": True,
        "sha256": hashlib.sha256(b"#!/bin/bash\nexec x\n").hexdigest(),
        "mode": "0750",
        "uid": f.stat().st_uid,
        "gid": f.stat().st_gid,
        "owner": "root",
        "group": "root",
        "mtime": f.stat().st_mtime,
        "size": 19,
        "content": "#!/bin/bash\nexec x\n",
    }
    os.chown(f, 54321, 54321)  # ids without a name on this host
    assert (ko.file_info(str(f))["owner"], ko.file_info(str(f))["group"]) == ("54321", "54321")


def test_file_info_never_follows_a_link_or_opens_a_special_file(tmp_path: Path) -> None:
    assert ko.file_info(str(tmp_path / "missing")) == {"path": str(tmp_path / "missing"), "exists": False}
    target = tmp_path / "target"
    target.write_text("secret\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    info = ko.file_info(str(link))
    assert info["exists"] is True and info["error"].startswith("symlink: ") and "content" not in info
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert ko.file_info(str(fifo))["error"] == "special file: not a regular file"
    assert ko.file_info(str(tmp_path))["error"].startswith("special file: ")


# --- systemd and processes ------------------------------------------------------------------------------------------


def test_parse_props() -> None:
    text = "MainPID=12\nDropInPaths=\nExecStart={ path=/x ; argv[]=/x a=b }\nnoise\n"
    assert ko.parse_props(text) == {"MainPID": "12", "DropInPaths": "", "ExecStart": "{ path=/x ; argv[]=/x a=b }"}


def test_unit_props_without_systemctl_is_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    props = ko.unit_props("x.service", "/nonexistent/private")  # no systemd socket either
    assert list(props) == ["error"] and "systemctl" in props["error"]


def own_cgroup() -> str:
    line = Path("/proc/self/cgroup").read_text().splitlines()[0]
    return line.split(":", 2)[2]


def test_this_process_as_the_probe_sees_it() -> None:
    me = knob_procfs.process(os.getpid(), knob_procfs.boot_time(), os.sysconf("SC_CLK_TCK"))
    assert me is not None
    assert me["pid"] == os.getpid() and me["ppid"] == os.getppid()
    own = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[:-1]
    assert me["cmdline"] == [c.decode() for c in own] and me["comm"] == Path("/proc/self/comm").read_text().strip()
    assert me["env"].get("PATH") == os.environ.get("PATH")
    assert knob_procfs.boot_time() <= me["start_epoch"] <= time.time()
    assert knob_procfs.boot_time() > 1_000_000_000
    assert knob_procfs.process(2**22 + 12345, 0, 100) is None  # gone (beyond pid_max)


def test_the_processes_of_a_cgroup() -> None:
    assert knob_procfs.cgroup_pids("") == []
    assert knob_procfs.cgroup_pids("/no/such/cgroup") == []
    pids = knob_procfs.cgroup_pids(own_cgroup())
    if not pids:
        pytest.skip("this host has no cgroup2 tree at /sys/fs/cgroup for this process")
    assert os.getpid() in pids and pids == sorted(pids)
    assert os.getpid() in [p["pid"] for p in knob_procfs.unit_processes(own_cgroup())]


def test_parse_environ() -> None:
    raw = b"A=1\0B=x=y\0NOEQ\0C=\xff\0\xffD=2\0"
    env = knob_procfs.parse_environ(raw)
    assert env["A"] == "1" and env["B"] == "x=y" and env["C"] == "\ufffd" and "NOEQ" not in env
    assert env["\udcffD"] == "2"  # a name that is not UTF-8 keeps its bytes (surrogateescape)


# --- generations, lock, ledger --------------------------------------------------------------------------------------


def state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    for n, meta in (("0000", {"generation": 0, "status": "adopted"}), ("0001", {"generation": 1, "status": "good"})):
        d = state / "generations" / n
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps(meta))
        (d / "serve.sh").write_text(f"#!/bin/bash\nexport HF_TOKEN=t{n}\nexec x\n")
        (d / "dropins").mkdir()
    (state / "generations" / "0002").mkdir()
    (state / "generations" / "0002" / "meta.json").write_text("[1, 2]")
    (state / "generations" / "0003").mkdir()
    (state / "generations" / "0003" / "meta.json").write_text("{broken")
    (state / "generations" / ".0004.tmp").mkdir()
    (state / "current").symlink_to("generations/0001")
    return state


def test_generations_as_the_rule_reads_them(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    g = ko.generations(str(state))
    assert g["exists"] is True and g["current"] == 1 and g["lock"] is None and g["ledger"] == []
    assert [e["generation"] for e in g["list"]] == [0, 1, 2, 3]
    assert g["list"][1] == {
        "generation": 1,
        "files": ["dropins", "meta.json", "serve.sh"],
        "meta": json.loads((state / "generations/0001/meta.json").read_text()),
    }
    assert "meta" not in g["list"][2] and "meta" not in g["list"][3]
    assert g["errors"][0] == f"{state}/generations/0002/meta.json: not a JSON object"
    assert g["errors"][1].startswith(f"{state}/generations/0003/meta.json: ")
    assert list(g["current_files"]) == ["serve.sh"]  # no meta.json, no folders
    assert g["current_files"]["serve.sh"]["content"].startswith("#!/bin/bash\nexport HF_TOKEN=t0001")


@pytest.mark.parametrize(
    ("lock", "seen"),
    [
        (None, None),
        ('{"run_id": "r1", "operator": "ann"}', {"run_id": "r1", "operator": "ann"}),
        ("[1]", {"corrupt": "not a JSON object"}),
        ("{half", "corrupt"),
        ("x" * (64 * 1024 + 1), {"corrupt": "larger than 65536 bytes"}),
    ],
)
def test_the_lock_as_the_rule_reads_it(tmp_path: Path, lock: str | None, seen: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if lock is not None:
        (state / "lock").write_text(lock)
    got = ko.generations(str(state))["lock"]
    if seen == "corrupt":
        assert list(got) == ["corrupt"] and got["corrupt"]
    else:
        assert got == seen


def test_no_state_dir_at_all(tmp_path: Path) -> None:
    g = ko.generations(str(tmp_path / "none"))
    assert g == {"exists": False, "current": None, "list": [], "errors": [], "lock": None, "ledger": []}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "current").symlink_to("generations/notanumber")
    assert ko.generations(str(tmp_path / "bad"))["current"] is None


def test_the_ledger_tail_is_bounded_and_shows_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    assert ko.ledger_tail(str(path)) == []
    lines = [json.dumps({"event": "apply", "n": i}) for i in range(100)]
    path.write_text("\n".join([*lines, "not json", "[1, 2]", ""]) + "\n")
    out = ko.ledger_tail(str(path))
    assert out[:2] == [{"event": "apply", "n": 0}, {"event": "apply", "n": 1}]
    assert out[-2:] == [{"event": "unreadable", "raw": "not json"}, {"event": "unreadable", "raw": "[1, 2]"}]
    tail = ko.ledger_tail(str(path), max_bytes=100)  # the first, partial line of the window is dropped
    assert all(e.get("event") in ("apply", "unreadable") for e in tail)
    assert tail[-1] == {"event": "unreadable", "raw": "[1, 2]"} and len(tail) < 10
    assert all("n" not in e or e["n"] >= 95 for e in tail)


def test_read_json_refuses_what_it_cannot_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "j.json"
    f.write_text('{"a": 1}')
    assert ko.read_json(str(f)) == {"a": 1}
    with pytest.raises(ValueError, match=r"^larger than 4 bytes$"):
        ko.read_json(str(f), 4)


def test_dropins_in_every_systemd_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    for base, name in ((etc, "b.conf"), (etc, "a.conf"), (run, "c.conf"), (run, "ignored.txt")):
        (base / "e.service.d").mkdir(parents=True, exist_ok=True)
        (base / "e.service.d" / name).write_text("[Service]\n")
    monkeypatch.setattr(ko, "DROPIN_DIRS", (str(etc), str(run), str(tmp_path / "usr")))
    assert [Path(d["path"]).name for d in ko.dropins("e.service")] == ["a.conf", "b.conf", "c.conf"]
    assert all(d["exists"] and d["content"] == "[Service]\n" for d in ko.dropins("e.service"))


# --- HTTP ------------------------------------------------------------------------------------------------------------


class Engine(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, b"no"))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_get(engine: str) -> None:
    Engine.routes = {"/health": (200, b"ok"), "/sick": (503, b"busy")}
    assert knob_http.http_get(engine + "/health", 2.0) == (200, b"ok")
    assert knob_http.http_get(engine + "/sick", 2.0) == (503, None)
    assert knob_http.http_get(engine + "/nothing", 2.0) == (404, None)
    assert knob_http.http_get("", 2.0) == (None, None)
    assert knob_http.http_get("http://127.0.0.1:9/health", 0.5) == (None, None)  # refused
    assert knob_http.http_get("not a url", 0.5) == (None, None)


# --- the whole document -----------------------------------------------------------------------------------------------


def test_observe_hashes_secrets_before_the_document_leaves(tmp_path: Path, engine: str) -> None:
    state = state_dir(tmp_path)
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nexport HF_TOKEN=live\nexport MY_CRED=c\nexec x\n")
    unit = tmp_path / "e.service"
    unit.write_text("[Service]\n")
    Engine.routes = {"/health": (200, b"ok"), "/info": (200, json.dumps({"api_key": "k", "tp_size": 2}).encode())}
    opts = {
        "service": "knobfleet-unit-test-absent",
        "script_path": str(script),
        "unit_path": str(unit),
        "state_dir": str(state),
        "health_url": engine + "/health",
        "info_url": engine + "/info",
        "http_timeout_s": 2.0,
        "secret": ["MY_CRED"],
    }
    doc = ko.observe(opts)
    assert doc["schema_version"] == 1 and doc["unit"] == "knobfleet-unit-test-absent.service"
    assert doc["health"] == 200 and doc["health_url"] == engine + "/health"
    assert doc["server_info"] == {"api_key": redact_value("k"), "tp_size": 2}
    shown = doc["files"]["script"]["content"]
    assert "live" not in shown and redact_value("live") in shown and redact_value("c") in shown
    stored = doc["generations"]["current_files"]["serve.sh"]["content"]
    assert "t0001" not in stored and redact_value("t0001") in stored
    assert doc["files"]["unit"]["content"] == "[Service]\n" and doc["generations"]["current"] == 1
    assert doc["processes"] == [] and doc["probe_s"] >= 0
    Engine.routes["/info"] = (200, b"not json")
    assert ko.observe(opts)["server_info"] is None
    Engine.routes["/info"] = (500, b"{}")
    assert ko.observe({**opts, "http_timeout_s": None})["server_info"] is None


def test_redact_each_process_env() -> None:
    doc: dict[str, Any] = {"processes": [{"env": {"HF_TOKEN": "a", "X": "1"}}, {"env": None}], "files": {}}
    out = ko.redact(doc, ())
    assert out["processes"][0]["env"] == {"HF_TOKEN": redact_value("a"), "X": "1"} and out["processes"][1]["env"] == {}


# --- the probe module ------------------------------------------------------------------------------------------------


def load_probe() -> Any:
    for util in ("knob_fs", "knob_live", "knob_observe"):
        sys.modules.setdefault(
            f"ansible.module_utils.{util}", importlib.import_module(f"knobfleet.module_utils.{util}")
        )
    spec = importlib.util.spec_from_file_location(
        "knob_role_knob_probe", REPO / "roles/knob_probe/library/knob_probe.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_module_returns_the_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kp = load_probe()
    args = {
        "service": "knobfleet-unit-test-absent",
        "script_path": str(tmp_path / "serve.sh"),
        "unit_path": str(tmp_path / "e.service"),
        "state_dir": str(tmp_path / "state"),
        "_ansible_check_mode": True,
    }
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    with pytest.raises(SystemExit) as info:
        kp.main()
    out = capsys.readouterr().out
    res = json.loads(out[out.index("{") :])
    assert info.value.code == 0 and res["step"] == "probe" and res["changed"] is False
    assert res["probe"]["files"]["script"] == {"path": str(tmp_path / "serve.sh"), "exists": False}
    assert res["probe"]["generations"]["exists"] is False and res["probe"]["health"] is None
    assert kp.probe({**args, "health_url": "", "info_url": ""})["service"] == "knobfleet-unit-test-absent"


@pytest.mark.parametrize("reader", ["ledger", "meta", "json"])
def test_a_state_file_hard_linked_to_another_file_is_never_read(tmp_path: Path, reader: str) -> None:
    """A ledger or meta.json hard-linked to another file (a root-only secret, say) is refused unread: the
    ledger as one ``unreadable`` entry, the others as OSError(EMLINK). The test links a file it made itself."""
    import errno

    secret = tmp_path / "root-only"
    secret.write_text('{"event": "apply", "token": "s3cr3t"}\n')
    secret.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir()
    linked = state / ("ledger.jsonl" if reader == "ledger" else "meta.json")
    os.link(secret, linked)
    if reader == "ledger":
        (entry,) = ko.ledger_tail(str(linked))
        assert entry == {"event": "unreadable", "raw": "ledger has 2 hard links, not read"}
        return
    with pytest.raises(OSError) as exc:
        ko.read_json(str(linked)) if reader == "json" else ko.read_bounded(str(linked))
    assert exc.value.errno == errno.EMLINK and "s3cr3t" not in str(exc.value)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda sd: os.symlink("/etc", sd / "current"), "current points to '/etc', not to a generation"),
        (lambda sd: os.symlink("generations/../../x", sd / "current"), "not to a generation"),
        (lambda sd: (sd / "current").write_text("3\n"), "current is not a link to a generation"),
        (lambda sd: (sd / "current").mkdir(), "current is not a link to a generation"),
    ],
    ids=["to-etc", "escaping", "a-file", "a-folder"],
)
def test_a_hand_edited_current_is_damage_not_never_applied(tmp_path: Path, make: Any, why: str) -> None:
    """knobfleet applied here (a generation exists) and ``current`` was edited by hand: the probe says so, and the
    rule reports an unreadable generation (verify/drift: error) instead of "never applied by knobfleet"."""
    from knobfleet.module_utils.knob_live import expected_from_generation

    sd = tmp_path / "state"
    (sd / "generations" / "0001").mkdir(parents=True)
    make(sd)
    gens = ko.generations(str(sd))
    assert gens["current"] is None and why in gens["current_error"]
    expected, problem = expected_from_generation({"generations": gens})
    assert expected is None and problem is not None and why in problem and "rollback --to N" in problem
    # the advice is one rollback and apply accept: both refuse a `current` that is no such link (issue 56, LOW)
    assert "remove it on the host, then `knobfleet rollback --to N` or apply again" in problem


def test_a_real_current_link_is_read(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    (sd / "generations" / "0007").mkdir(parents=True)
    os.symlink("generations/0007", sd / "current")
    gens = ko.generations(str(sd))
    assert gens["current"] == 7 and "current_error" not in gens
