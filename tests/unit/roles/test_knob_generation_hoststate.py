"""Host state under hostile inputs and faults (issue 24's host-state classes), knob_generation in-process.

Every case builds its hostile thing (FIFO, device node, socket, symlink, hard link, oversized sparse file, odd
entry) in a temp dir the test creates, never on this machine's own files. Faults are injected by wrapping the
``os`` module that knob_generation and module_utils/knob_fs call: at EVERY os call of a composite install (each
one failing once with an OSError), and a full disk after several byte counts. After each: the result names the
step and carries ``steps`` (so the role releases the lock), the lock is free once the role's release ran, no
generation is left ``installing``, the previous files are intact (bytes, mode, owner, group), nothing is left
next to them, and the next apply works."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_commit, knob_fs, knob_observe, knob_store, knob_txn
from tests.unit.roles.test_knob_generation import TXN_OS, Failed, FakeModule, Host, profile, script, unit

SECRET = "root-only-content-7f3a9c"
HAND = "#!/bin/bash\nexport HF_TOKEN=hf_handwritten\nexec /usr/bin/engine --tp 2\n"
HAND_UNIT = "[Service]\nExecStart=/root/serve.sh\n"


class Module(FakeModule):
    def __init__(self, check_mode: bool = False, diff: bool = False) -> None:
        super().__init__(check_mode, diff)
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The os calls of the modules go through FaultyOs (with no fault here), whose fsync is only counted: the
    fault loops run hundreds of installs, and fsync is the one call whose effect a test cannot see."""
    fos = FaultyOs()
    for m in TXN_OS:
        monkeypatch.setattr(m, "os", fos)
    monkeypatch.setattr(knob_fs, "os", fos)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def install(h: Host, n: int, module: FakeModule | None = None, **kw: Any) -> dict[str, Any]:
    p = h.params("install", script_content=script(n), unit_content=unit(n), profile=profile(n), **kw)
    result: dict[str, Any] = knob_txn.HANDLERS["install"](module or Module(), h.store, p)
    return result


def finish(h: Host, generation: int | None, run_id: str = "run-1") -> dict[str, Any]:
    p = h.params("finish", generation=generation, status="good", run_id=run_id)
    result: dict[str, Any] = knob_txn.HANDLERS["finish"](Module(), h.store, p)
    return result


def role_release(h: Host, run_id: str = "run-1") -> None:
    """What the role's ``always`` does after any failure: ask to release (a no-op unless this run holds it)."""
    knob_store.release(Module(), h.store, h.params("release", run_id=run_id))


def hand_written(h: Host, uid: int = 0, gid: int = 0) -> None:
    for path, text, mode in ((h.script, HAND, 0o700), (h.unit, HAND_UNIT, 0o640)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chown(path, uid, gid)
        path.chmod(mode)


def snapshot(path: Path) -> tuple[bytes, int, int, int] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return path.read_bytes(), st.st_mode & 0o7777, st.st_uid, st.st_gid


def statuses(h: Host) -> dict[str, Any]:
    gens = h.state / "generations"
    out = {}
    for d in sorted(gens.iterdir()) if gens.is_dir() else []:
        if d.name.isdigit() and d.is_dir() and not d.is_symlink():
            out[d.name] = json.loads((d / "meta.json").read_text()).get("status")
    return out


def leftovers(h: Host) -> list[str]:
    return sorted(
        p.name
        for d in (h.script.parent, h.unit.parent, h.state / "generations")
        if d.is_dir()
        for p in d.iterdir()
        if "knobfleet" in p.name or p.name.endswith(".tmp")
    )


# --- adoption: metadata kept, hostile files refused ----------------------------------------------------------


def test_adopted_files_come_back_with_their_mode_owner_and_group_after_rollback_to_0(host: Host) -> None:
    hand_written(host, uid=4321, gid=8765)
    install(host, 1)
    finish(host, 1)
    assert (stat.S_IMODE(host.script.stat().st_mode), host.script.stat().st_uid) == (0o755, 0)
    res = host.call("restore", generation=0, run_id="run-2")
    assert res["generation"] == 0
    assert snapshot(host.script) == (HAND.encode(), 0o700, 4321, 8765)
    assert snapshot(host.unit) == (HAND_UNIT.encode(), 0o640, 4321, 8765)


def test_the_automatic_restore_of_a_failed_first_apply_puts_the_mode_back(host: Host) -> None:
    hand_written(host)
    install(host, 1)  # the role then fails readiness: knobfleet restores the previous generation
    host.call("mark", generation=1, status="failed")
    host.call("restore", generation=0, event="restore", leave_status="failed")
    assert snapshot(host.script) == (HAND.encode(), 0o700, 0, 0)
    assert host.meta(1)["status"] == "failed" and host.current() == "generations/0000"


def make_fifo(p: Path) -> None:
    os.mkfifo(p, 0o600)


def make_device(p: Path) -> None:
    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null-like node inside the temp dir


def make_socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


def make_dir(p: Path) -> None:
    p.mkdir()
    (p / "inner").write_text(SECRET)


def make_oversized(p: Path) -> None:
    with open(p, "wb") as fh:  # sparse: no disk used
        fh.write(SECRET.encode())
        fh.truncate(knob_fs.MAX_FILE + 1)


def make_hard_link(p: Path) -> None:
    victim = p.parent.parent / "shadow-like"
    victim.write_text(SECRET + "\n")
    victim.chmod(0o600)
    os.link(victim, p)


def make_symlink(p: Path) -> None:
    victim = p.parent.parent / "shadow-like"
    victim.write_text(SECRET + "\n")
    p.symlink_to(victim)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (make_fifo, "is a FIFO, not a regular file"),
    "char device": (make_device, "is a character device, not a regular file"),
    "socket": (make_socket, "is not a regular file"),
    "directory": (make_dir, "is a directory, not a regular file"),
    "oversized": (make_oversized, "is larger than"),
    "hard link": (make_hard_link, "has 2 hard links"),
    "symlink": (make_symlink, "is a symlink"),
}


@pytest.mark.parametrize("which", ["script", "unit"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_at_a_managed_path_is_refused_at_adoption(host: Host, case: str, which: str) -> None:
    hand_written(host)
    path = host.script if which == "script" else host.unit
    path.unlink()
    make, says = HOSTILE[case]
    make(path)
    with pytest.raises(Failed) as err:
        install(host, 1, Module(check_mode=False, diff=True))
    r = err.value.result
    assert r["failed_step"] == "begin" and r["steps"] == {} and r["refused"]
    assert r["msg"].count("\n") == 0 and r["msg"].startswith(f"cannot adopt {path}: ") and says in r["msg"]
    assert r["msg"].endswith("nothing was changed")
    assert SECRET not in json.dumps(r)  # nothing of it shipped to the controller
    assert not (host.state / "lock").exists() and statuses(host) == {}
    assert not (host.state / "ledger.jsonl").exists()


@pytest.mark.parametrize("case", ["hard link", "fifo", "oversized", "char device"])
def test_plan_diffs_never_show_a_hostile_file_at_the_script_path(host: Host, case: str) -> None:
    host.script.parent.mkdir(parents=True)
    HOSTILE[case][0](host.script)
    res = install(host, 1, Module(check_mode=True, diff=True))
    (d,) = [d for d in res["diff"] if d["before_header"] == str(host.script)]
    assert SECRET not in json.dumps(res) and d["before"].endswith("not shown)\n")


def test_a_symlinked_parent_directory_is_refused_at_adoption_and_releases_the_lock(host: Host) -> None:
    real = host.root / "real"
    real.mkdir()
    (real / "serve.sh").write_text(HAND)
    host.script.parent.symlink_to(real)
    with pytest.raises(Failed) as err:
        install(host, 1)
    assert err.value.result["failed_step"] == "begin" and "symlink" in err.value.result["msg"]
    assert not (host.state / "lock").exists()


# --- fault injection at every os call of the composite install -----------------------------------------------

WRAPPED = (
    "open", "read", "pread", "write", "fsync", "fstat", "stat", "lstat", "rename", "link", "unlink", "mkdir",
    "rmdir", "symlink", "readlink", "fchown", "fchmod", "scandir", "listdir",
)  # fmt: skip


class FaultyOs:
    """The ``os`` module, with call number ``fail_at`` of the wrapped functions raising OSError(``err``), or
    writes running out of space after ``budget`` bytes (after which creating anything fails too)."""

    def __init__(self, fail_at: int | None = None, err: int = errno.EIO, budget: int | None = None) -> None:
        self.calls: list[str] = []
        self.fail_at, self.err, self.budget = fail_at, err, budget

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in WRAPPED:
            return real

        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append(name)
            if self.fail_at is not None and len(self.calls) - 1 == self.fail_at:
                raise OSError(self.err, os.strerror(self.err), f"injected-{name}")
            if name == "fsync":
                return None
            if self.budget is not None:
                creating = name in ("mkdir", "symlink", "link") or (name == "open" and args[1] & os.O_CREAT)
                if name == "write":
                    if self.budget <= 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "disk")
                    n = os.write(args[0], bytes(args[1])[: self.budget])
                    self.budget -= n
                    return n
                if creating and self.budget <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "disk")
            return real(*args, **kw)

        return call


@contextmanager
def faulty(monkeypatch: pytest.MonkeyPatch, fos: FaultyOs) -> Iterator[FaultyOs]:
    with monkeypatch.context() as m:
        for txn in TXN_OS:
            m.setattr(txn, "os", fos)
        m.setattr(knob_fs, "os", fos)
        yield fos


def first_apply(h: Host) -> None:
    hand_written(h)


def second_apply(h: Host) -> None:
    hand_written(h)
    install(h, 1, run_id="run-0")
    finish(h, 1, run_id="run-0")


SCENARIOS = {"first apply (adopt + install)": first_apply, "a later apply": second_apply}


def count_calls(tmp_path: Path, prepare: Callable[[Host], None], monkeypatch: pytest.MonkeyPatch) -> int:
    h = Host(tmp_path / "count")
    prepare(h)
    with faulty(monkeypatch, FaultyOs()) as fos:
        install(h, 2)
    return len(fos.calls)


def state_of(h: Host) -> dict[str, Any]:
    link = h.state / "current"
    return {
        "script": snapshot(h.script),
        "unit": snapshot(h.unit),
        "current": os.readlink(link) if link.is_symlink() else None,
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_an_os_error_at_every_call_of_the_install_leaves_the_host_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    prepare = SCENARIOS[scenario]
    total = count_calls(tmp_path, prepare, monkeypatch)
    assert total > 50  # the install really was walked call by call
    ended: dict[str, int] = {}
    for k in range(total):
        h = Host(tmp_path / f"k{k}")
        prepare(h)
        before = state_of(h)
        with faulty(monkeypatch, FaultyOs(fail_at=k, err=(errno.EIO, errno.EACCES, errno.ENOSPC)[k % 3])):
            try:
                install(h, 2)
                how = "ok"
            except Failed as exc:
                how = exc.result["failed_step"]
                assert isinstance(exc.result.get("steps"), dict) and "\n" not in exc.result["msg"]
        ended[how] = ended.get(how, 0) + 1
        if how == "ok":  # a fault the install could do without (a lookup that has a fallback)
            finish(h, max(int(n) for n in statuses(h)))
            assert h.script.read_text() == script(2)
            # a failed cleanup of the way back (the unlink of a hard link to the old file) may leave that link;
            # the next apply removes it
            assert set(leftovers(h)) <= {".serve.sh.knobfleet-prev", ".svc.service.knobfleet-prev"}
            install(h, 3, run_id="run-9")
            assert leftovers(h) == []
        else:
            verify_failed(h, before)
    assert {"begin", "stage", "commit"} <= set(ended), ended  # faults landed in every step


def verify_failed(h: Host, before: dict[str, Any]) -> None:
    role_release(h)
    assert not (h.state / "lock").exists()
    assert snapshot(h.script) == before["script"] and snapshot(h.unit) == before["unit"]
    assert "installing" not in statuses(h).values()
    cur = os.readlink(h.state / "current") if (h.state / "current").is_symlink() else None
    assert cur == before["current"] or (before["current"] is None and cur in (None, "generations/0000"))
    assert leftovers(h) == [], leftovers(h)
    res = install(h, 3, run_id="run-9")
    gen = res["steps"]["commit"]["generation"]
    finish(h, gen, run_id="run-9")
    assert h.script.read_text() == script(3) and statuses(h)[f"{gen:04d}"] == "good"
    assert not (h.state / "lock").exists()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("budget", [0, 1, 17, 100, 300, 700, 1500, 4000])
def test_a_full_disk_at_any_byte_count_leaves_the_host_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str, budget: int
) -> None:
    h = Host(tmp_path)
    SCENARIOS[scenario](h)
    before = state_of(h)
    with faulty(monkeypatch, FaultyOs(budget=budget)):
        try:
            install(h, 2)
            failed = None
        except Failed as exc:
            failed = exc.result
    if failed is None:  # the budget was enough for everything
        finish(h, max(int(n) for n in statuses(h)))
        assert h.script.read_text() == script(2)
    else:
        assert isinstance(failed.get("steps"), dict) and "\n" not in failed["msg"]
        verify_failed(h, before)


def test_a_failed_lock_write_leaves_no_lock(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    hand_written(host)
    host.store.ensure()
    with faulty(monkeypatch, FaultyOs(budget=0)), pytest.raises(Failed):
        install(host, 1)
    assert not (host.state / "lock").exists()


# --- a generation left installing, the lock, break-lock ------------------------------------------------------


def test_an_installing_generation_without_a_lock_does_not_wedge_the_host(host: Host) -> None:
    hand_written(host)
    install(host, 1)  # killed here: the lock is then removed by hand (the old manual steps did that)
    (host.state / "lock").unlink()
    res = install(host, 2, run_id="run-2")
    assert res["steps"]["begin"]["interrupted"] == [1]
    assert host.meta(1)["status"] == "interrupted" and "never finished" in host.meta(1)["reason"]
    finish(host, 2, run_id="run-2")
    events = [e["event"] for e in host.ledger()]
    assert events.index("interrupted") < len(events) - 1 - events[::-1].index("apply")


def test_break_lock_marks_every_installing_generation_interrupted(host: Host) -> None:
    hand_written(host)
    install(host, 1)
    res = install(host, 2, run_id="run-2", break_lock=True)
    assert res["steps"]["begin"]["broke_lock"]["run_id"] == "run-1"
    assert res["steps"]["begin"]["interrupted"] == [1] and host.meta(1)["status"] == "interrupted"


def test_a_refusal_after_the_lock_releases_it(host: Host) -> None:
    hand_written(host)
    install(host, 1)
    finish(host, 1)
    os.mkfifo(host.state / "generations/0001/meta.json.fifo")
    (host.state / "ledger.jsonl").unlink()
    os.mkfifo(host.state / "ledger.jsonl")
    with pytest.raises(Failed) as err:
        install(host, 2, run_id="run-2")
    assert err.value.result["failed_step"] == "begin" and "ledger.jsonl is a FIFO" in err.value.result["msg"]
    assert not (host.state / "lock").exists()


@pytest.mark.parametrize("kind", ["fifo", "directory", "bad json", "list"])
def test_an_unreadable_lock_holds_the_host_until_broken_and_never_blocks(host: Host, kind: str) -> None:
    hand_written(host)
    host.store.ensure()
    lock = host.state / "lock"
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    else:
        lock.write_text("{" if kind == "bad json" else "[]")
    with pytest.raises(Failed) as err:
        install(host, 1)
    assert err.value.result["lock_held"] and err.value.result["steps"] == {}
    res = install(host, 1, break_lock=True)
    assert res["steps"]["begin"]["locked"] and host.script.read_text() == script(1)
    finish(host, 1)
    assert not lock.exists() and not list(host.state.glob("lock.broken-*"))


# --- prune and walks --------------------------------------------------------------------------------------


def corrupt_meta(kind: str, meta: Path) -> None:
    meta.unlink()
    if kind == "fifo":
        os.mkfifo(meta)
    elif kind == "list":
        meta.write_text("[1, 2]\n")
    elif kind == "bad json":
        meta.write_text("{not json\n")
    elif kind == "symlink":
        meta.symlink_to("/dev/null")


@pytest.mark.parametrize("kind", ["fifo", "list", "bad json", "symlink"])
def test_prune_never_deletes_a_generation_it_cannot_read(host: Host, kind: str) -> None:
    hand_written(host)
    for n in (1, 2):
        install(host, n, run_id=f"r{n}")
        finish(host, n, run_id=f"r{n}")
    host.call("mark", generation=1, status="failed")
    corrupt_meta(kind, host.state / "generations/0001/meta.json")
    for n in (3, 4, 5):
        install(host, n, run_id=f"r{n}")
        p = host.params("finish", generation=n, status="good", run_id=f"r{n}", keep=1)
        knob_txn.HANDLERS["finish"](Module(), host.store, p)
    assert (host.state / "generations/0001").is_dir()  # unreadable: kept
    assert not (host.state / "generations/0002").exists() and not (host.state / "generations/0003").exists()


def test_a_symlinked_generation_is_never_followed_nor_deleted(host: Host) -> None:
    hand_written(host)
    victim = host.root / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep\n")
    (victim / "meta.json").write_text(json.dumps({"status": "failed"}))
    host.store.ensure()
    (host.state / "generations" / "0001").symlink_to(victim)
    os.mkfifo(host.state / "generations" / "0002")
    (host.state / "generations" / "notes").write_text("x")
    for n in (3, 4, 5):
        install(host, n, run_id=f"r{n}")
        res = install(host, n, run_id=f"r{n}")  # same run: already locked by it, nothing new
        gen = res["steps"]["commit"]["generation"]
        p = host.params("finish", generation=gen, status="good", run_id=f"r{n}", keep=1)
        knob_txn.HANDLERS["finish"](Module(), host.store, p)
    assert sorted(os.listdir(victim)) == ["meta.json", "precious"]
    assert (host.state / "generations/0001").is_symlink() and host.store.numbers()[0] == 0
    g = knob_observe.generations(str(host.state))
    assert any("0001: not a directory" in e for e in g["errors"]) and 1 not in [e["generation"] for e in g["list"]]


# --- ledger, oversized and special files at the script path ------------------------------------------------


def test_a_truncated_ledger_line_never_swallows_the_next_entry(host: Host) -> None:
    hand_written(host)
    install(host, 1)
    with open(host.state / "ledger.jsonl", "ab") as fh:
        fh.write(b'{"event": "apply", "generat')  # cut short by a crash or a full disk
    finish(host, 1)
    tail = knob_observe.ledger_tail(str(host.state / "ledger.jsonl"))
    assert [e["event"] for e in tail][-2:] == ["unreadable", "mark"]


def test_a_fifo_at_the_ledger_is_read_without_blocking(host: Host) -> None:
    host.state.mkdir(parents=True)
    os.mkfifo(host.state / "ledger.jsonl")
    g = knob_observe.generations(str(host.state))
    assert g["ledger"] == [{"event": "unreadable", "raw": "ledger is a FIFO, not a regular file"}]


@pytest.mark.parametrize("case", ["oversized", "fifo", "char device", "socket"])
def test_apply_replaces_an_oversized_or_special_file_at_the_script_path(host: Host, case: str) -> None:
    hand_written(host)
    install(host, 1)
    finish(host, 1)
    host.script.unlink()
    HOSTILE[case][0](host.script)
    install(host, 2, run_id="run-2")
    finish(host, 2, run_id="run-2")
    assert host.script.read_text() == script(2) and stat.S_ISREG(host.script.lstat().st_mode)
    assert leftovers(host) == []


# --- paths ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where,says",
    [
        ("unit", "is the unit file"),
        ("ledger", "lies in knobfleet's state dir"),
        ("state", "lies in knobfleet's state dir"),
        ("meta", "may not be named meta.json"),
    ],
)
def test_the_script_path_may_not_point_at_the_unit_or_the_state(host: Host, where: str, says: str) -> None:
    hand_written(host)
    path = {
        "unit": str(host.unit),
        "ledger": str(host.state / "ledger.jsonl"),
        "state": str(host.state),
        "meta": str(host.root / "opt/meta.json"),
    }[where]
    with pytest.raises(Failed) as err:
        install(host, 1, script_path=path)
    r = err.value.result
    assert says in r["msg"] and "\n" not in r["msg"] and r["msg"].endswith("nothing was changed")
    assert not host.state.exists() or not (host.state / "lock").exists()
    assert snapshot(host.unit) == (HAND_UNIT.encode(), 0o640, 0, 0)


def group_writable(d: Path) -> None:
    os.chown(d, 0, 4242)
    d.chmod(0o775)


@pytest.mark.parametrize(
    "make,says",
    [
        (lambda d: d.chmod(0o777), "writable by every user"),
        (lambda d: group_writable(d), "writable by group 4242"),
        (lambda d: os.chown(d, 4242, 0), "owned by uid 4242"),
    ],
)
def test_a_script_dir_a_non_root_user_can_change_is_refused_for_root(host: Host, make: Any, says: str) -> None:
    hand_written(host)
    make(host.script.parent)
    with pytest.raises(Failed) as err:
        install(host, 1)
    assert says in err.value.result["msg"] and "knob_serve_allow_writable_script_dir" in err.value.result["msg"]
    assert not (host.state / "lock").exists() and statuses(host) == {}
    module = Module()
    res = install(host, 1, module, allow_writable_script_dir=True)  # the override: a warning, and it applies
    assert says in module.warnings[0] and res["steps"]["begin"]["warning"] == module.warnings[0]
    install(host, 1, Module(), service_user="nobody", run_id="run-1")  # not root: not root's risk


def test_manual_steps_install_each_file_with_its_recorded_mode(tmp_path: Path) -> None:
    import subprocess

    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.ops.transaction import manual_steps

    text = manual_steps(HostVars(host="h", address="127.0.1.9"), 0)
    assert "rm -f" not in text and "--break-lock" in text
    line = next(x for x in text.splitlines() if "install $(" in x)
    cmd = line.split("$(", 1)[1].rsplit(") ", 2)[0]
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"files": {"script": {"mode": 0o700, "uid": 5, "gid": 6}}}))
    cmd = cmd.replace(cmd.split("' ", 1)[1].split()[0], str(meta))
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "-m 0700 -o 5 -g 6", out.stderr
