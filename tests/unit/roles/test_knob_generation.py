"""The on-host module roles/knob_serve/library/knob_generation.py, run in-process through its functions.

The module is loaded from the role with importlib (so coverage counts its lines), its ``ansible.module_utils``
imports answered by knobfleet.module_utils; a fake AnsibleModule stands in for Ansible's, and temporary
directories are the host: the state dir, the serve script's and the unit's directories. The tests run as root,
as the module does on a host, so knob_fs writes root-owned files with the modes the module asks for.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from knobfleet.module_utils import knob_commit, knob_fs, knob_guards, knob_restore, knob_store, knob_txn
from tests.unit.probedocs import probe_doc as running_doc

REPO = Path(__file__).resolve().parents[3]
HAND_SCRIPT = "#!/bin/bash\nexport CTAS=256\nexec /usr/bin/engine --tp 2\n"
HAND_UNIT = "[Service]\nExecStart=/root/serve.sh\n"


def load_role_module(role: str, name: str) -> ModuleType:
    for util in ("knob_fs", "knob_http", "knob_live", "knob_observe", "knob_redact", "knob_txn"):
        sys.modules.setdefault(
            f"ansible.module_utils.{util}", importlib.import_module(f"knobfleet.module_utils.{util}")
        )
    spec = importlib.util.spec_from_file_location(f"knob_role_{name}", REPO / "roles" / role / "library" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kg = load_role_module("knob_serve", "knob_generation")
# The host transaction the module runs lives in module_utils (knob_txn and the files it imports): the seams the
# tests replace are there. ``VALIDATE``: the real validate_staged (the fixtures replace knob_commit's).
TXN_OS = (knob_store, knob_guards, knob_commit, knob_restore)  # the transaction's files that call ``os``
VALIDATE = knob_commit.validate_staged


class Failed(Exception):
    """What ``fail_json`` raises here (Ansible's ends the process)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg"))
        self.result = result


class FakeModule:
    """The part of AnsibleModule the module uses: check and diff mode, fail_json, run_command (recorded)."""

    def __init__(self, check_mode: bool = False, diff: bool = False) -> None:
        self.check_mode = check_mode
        self._diff = diff
        self.commands: list[list[str]] = []

    def fail_json(self, **result: Any) -> None:
        raise Failed(result)

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        self.commands.append(list(argv))
        return 0, "", ""


class Host:
    """A host's filesystem under a temp dir, and the module's parameters for it (defaults as in main())."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "var/lib/knobfleet/svc"
        self.script = root / "root/serve.sh"
        self.unit = root / "etc/systemd/system/svc.service"
        self.store = knob_store.Store(str(self.state))

    def params(self, action: str, **kw: Any) -> dict[str, Any]:
        p: dict[str, Any] = {
            "action": action,
            "state_dir": str(self.state),
            "script_path": str(self.script),
            "unit_path": str(self.unit),
            "script_content": None,
            "unit_content": None,
            "run_id": "run-1",
            "operator": "alice",
            "controller": "ctl",
            "profile": None,
            "generation": None,
            "status": None,
            "reason": "",
            "break_lock": False,
            "keep": 10,
            "leave_status": "rolled-back",
            "event": "rollback",
            "engine": None,
            "secret": [],
            "service_user": "root",
            "foreign_dropins": "ignore",
            "health_url": "",
            "info_url": "",
        }
        p.update(kw)
        return p

    def call(self, action: str, module: FakeModule | None = None, **kw: Any) -> dict[str, Any]:
        handler = knob_txn.HANDLERS[action]
        result: dict[str, Any] = handler(module or FakeModule(), self.store, self.params(action, **kw))
        return result

    def hand_written(self) -> None:
        for path, text, mode in ((self.script, HAND_SCRIPT, 0o700), (self.unit, HAND_UNIT, 0o640)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)

    def stage(self, script: str, unit: str, **kw: Any) -> dict[str, Any]:
        return self.call("stage", script_content=script, unit_content=unit, **kw)

    def apply(self, n: int, run_id: str = "run-1", status: str | None = "good", **kw: Any) -> dict[str, Any]:
        """begin, stage profile p<n>, commit (and mark), as one apply-profile run does."""
        self.call("begin", run_id=run_id)
        self.stage(script(n), unit(n), run_id=run_id)
        res = self.call("commit", run_id=run_id, profile=profile(n), **kw)
        if status:
            self.call("mark", run_id=run_id, generation=res["generation"], status=status)
        self.call("release", run_id=run_id)
        return res

    def meta(self, n: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "generations" / f"{n:04d}" / "meta.json").read_text())
        return data

    def current(self) -> str:
        return os.readlink(self.state / "current")

    def ledger(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.state / "ledger.jsonl").read_text().splitlines()]

    def generations(self) -> list[str]:
        return sorted(os.listdir(self.state / "generations"))


def script(n: int) -> str:
    return f"#!/bin/bash\nset -euo pipefail\nexport CTAS={n}\nexec /usr/bin/engine --tp {n}\n"


def unit(n: int) -> str:
    return f"[Service]\nExecStart=/root/serve.sh\nRestartSec={n}\n"


def profile(n: int) -> dict[str, Any]:
    return {"name": f"p{n}", "version": 1, "hash": f"sha256:{n:064x}"}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """bash -n and systemd-analyze verify are the host's tools: recorded here, not run."""
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(
        knob_commit, "validate_staged", lambda module, kind, path, script_path: seen.append((kind, path))
    )
    return seen


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# --- begin: lock and adopt ---------------------------------------------------------------------------------


def test_begin_adopts_the_hand_written_files_as_generation_0(host: Host) -> None:
    host.hand_written()
    res = host.call("begin")
    assert (res["changed"], res["adopted"], res["generation"], res["locked"]) == (True, True, 0, True)
    meta = host.meta(0)
    assert (meta["status"], meta["profile"], meta["run_id"], meta["operator"]) == ("adopted", None, "run-1", "alice")
    assert meta["files"] == {  # the mode, owner and group they had, so a restore puts those back too
        "script": {
            "path": str(host.script),
            "sha256": sha(HAND_SCRIPT),
            "name": "serve.sh",
            "mode": 0o700,
            "uid": 0,
            "gid": 0,
        },
        "unit": {
            "path": str(host.unit),
            "sha256": sha(HAND_UNIT),
            "name": "svc.service",
            "mode": 0o640,
            "uid": 0,
            "gid": 0,
        },
    }
    stored = host.state / "generations/0000"
    assert (stored / "serve.sh").read_text() == HAND_SCRIPT and mode(stored / "serve.sh") == 0o600
    assert (stored / "svc.service").read_text() == HAND_UNIT
    assert host.current() == "generations/0000"
    assert mode(host.state) == 0o700 and mode(host.state / "ledger.jsonl") == 0o600
    (adopt,) = host.ledger()
    assert (adopt["event"], adopt["generation"], adopt["files"]) == ("adopt", 0, ["script", "unit"])
    assert json.loads((host.state / "lock").read_text())["run_id"] == "run-1"
    # the installed files are left as they were
    assert host.script.read_text() == HAND_SCRIPT and mode(host.script) == 0o700


def test_begin_on_a_host_without_files_adopts_an_empty_generation_0(host: Host) -> None:
    res = host.call("begin")
    assert res["adopted"] and host.meta(0)["files"] == {}
    assert host.generations() == ["0000"]


def test_begin_again_by_the_same_run_changes_nothing(host: Host) -> None:
    host.hand_written()
    host.call("begin")
    res = host.call("begin")
    assert (res["changed"], res["adopted"], res["generation"]) == (False, False, 0)
    assert "locked" not in res and len(host.ledger()) == 1


def test_begin_in_check_mode_writes_nothing(host: Host) -> None:
    host.hand_written()
    res = host.call("begin", FakeModule(check_mode=True))
    assert (res["changed"], res["lock"], res["generation"]) == (False, None, None)
    assert not host.state.exists()


def test_begin_tightens_a_state_dir_an_older_knobfleet_left_open(host: Host) -> None:
    host.state.mkdir(parents=True)
    host.state.chmod(0o755)
    host.call("begin")
    assert mode(host.state) == 0o700


def test_adopting_a_symlinked_script_is_refused(host: Host) -> None:
    host.hand_written()
    target = host.root / "elsewhere.sh"
    target.write_text(HAND_SCRIPT)
    host.script.unlink()
    host.script.symlink_to(target)
    with pytest.raises(Failed, match=r"cannot adopt .*serve.sh.*regular files only"):
        host.call("begin")
    assert not (host.state / "generations/0000").exists()


def test_a_second_applier_fails_fast_naming_the_holder(host: Host) -> None:
    host.call("begin", run_id="run-1", operator="alice")
    with pytest.raises(Failed) as exc:
        host.call("begin", run_id="run-2", operator="bob")
    assert exc.value.result["lock_held"] is True
    assert str(exc.value).startswith("locked by alice (run run-1) since ")
    assert "--break-lock" in str(exc.value)
    assert json.loads((host.state / "lock").read_text())["run_id"] == "run-1"


def test_release_frees_only_the_holders_lock(host: Host) -> None:
    host.call("begin", run_id="run-1")
    assert host.call("release", run_id="run-2") == {"changed": False}
    assert (host.state / "lock").exists()
    assert host.call("release", FakeModule(check_mode=True), run_id="run-1") == {"changed": False}
    assert host.call("release", run_id="run-1") == {"changed": False, "released": True}
    assert not (host.state / "lock").exists()
    assert host.call("release", run_id="run-1") == {"changed": False}


# --- lock breaking -----------------------------------------------------------------------------------------


def test_breaking_the_lock_of_a_killed_apply_marks_its_generation_interrupted(host: Host) -> None:
    host.hand_written()
    host.call("begin", run_id="run-1", operator="alice")
    host.stage(script(1), unit(1), run_id="run-1")
    assert host.call("commit", run_id="run-1", profile=profile(1))["generation"] == 1
    # run-1 is killed here: generation 1 stays 'installing' and the lock stays held
    assert host.meta(1)["status"] == "installing"
    res = host.call("begin", run_id="run-2", operator="bob", break_lock=True)
    assert res["broke_lock"]["run_id"] == "run-1" and res["interrupted"] == [1]
    meta = host.meta(1)
    assert meta["status"] == "interrupted"
    assert meta["reason"] == "apply interrupted (lock of run run-1 broken by bob)"
    assert json.loads((host.state / "lock").read_text())["run_id"] == "run-2"
    broken = host.ledger()[-1]
    assert (broken["event"], broken["holder"]["run_id"], broken["interrupted"]) == ("lock-broken", "run-1", [1])
    assert not list(host.state.glob("lock.broken-*"))
    assert host.meta(0)["status"] == "adopted"  # only 'installing' generations are marked


def test_break_lock_is_atomic_a_second_breaker_finds_nothing(host: Host) -> None:
    host.call("begin", run_id="run-1")
    assert knob_store.break_lock(host.store, {"run_id": "run-2"}) is True
    assert knob_store.break_lock(host.store, {"run_id": "run-3"}) is False
    assert not (host.state / "lock").exists()


def test_an_unreadable_lock_is_reported_as_corrupt(host: Host) -> None:
    host.call("begin", run_id="run-1")
    (host.state / "lock").write_text("{not json")
    holder = knob_store.lock_holder(host.store)
    assert holder["run_id"] == "?" and holder["corrupt"]
    with pytest.raises(Failed, match=r"locked by \? \(run \?\)"):
        host.call("begin", run_id="run-2")


# --- stage and commit --------------------------------------------------------------------------------------


def test_stage_writes_and_validates_only_what_changed(host: Host, no_validation: list[tuple[str, str]]) -> None:
    host.call("begin")
    res = host.stage(script(1), unit(1))
    assert (res["changed"], res["staged"]) == (True, ["script", "unit"])
    assert [kind for kind, _ in no_validation] == ["script", "unit"]
    assert (host.state / "staging/serve.sh").read_text() == script(1)
    assert mode(host.state / "staging/serve.sh") == 0o755 and mode(host.state / "staging/svc.service") == 0o644
    res = host.stage(script(1), unit(2))
    assert res["staged"] == ["unit"] and len(no_validation) == 3


def test_stage_in_check_mode_diffs_against_the_installed_files(host: Host) -> None:
    host.hand_written()
    res = host.call("stage", FakeModule(check_mode=True, diff=True), script_content=script(1), unit_content=HAND_UNIT)
    assert (res["changed"], res["staged"]) == (True, ["script"])
    (d,) = res["diff"]
    assert (d["before"], d["after"], d["before_header"]) == (HAND_SCRIPT, script(1), str(host.script))
    assert not host.state.exists()


def test_commit_stores_and_installs_a_new_generation(host: Host) -> None:
    host.hand_written()
    host.call("begin")
    host.stage(script(1), unit(1))
    res = host.call("commit", profile=profile(1), engine={"name": "sglang"}, health_url="http://h/health")
    assert (res["changed"], res["generation"], res["previous"], res["files_changed"]) == (True, 1, 0, True)
    assert (res["script_sha256"], res["unit_sha256"]) == (sha(script(1)), sha(unit(1)))
    assert host.script.read_text() == script(1) and mode(host.script) == 0o755
    assert host.unit.read_text() == unit(1) and mode(host.unit) == 0o644
    assert host.script.stat().st_uid == 0
    meta = host.meta(1)
    assert (meta["status"], meta["profile"], meta["version"], meta["hash"]) == (
        "installing",
        "p1",
        1,
        profile(1)["hash"],
    )
    assert (meta["previous"], meta["engine"], meta["ready_url"], meta["run_id"]) == (
        0,
        "sglang",
        "http://h/health",
        "run-1",
    )
    assert meta["files"]["script"] == {
        "path": str(host.script),
        "sha256": sha(script(1)),
        "name": "serve.sh",
        "uid": 0,
        "mode": knob_store.SCRIPT_MODE,
        "gid": 0,
    }
    assert (host.state / "generations/0001/serve.sh").read_text() == script(1)
    assert host.current() == "generations/0001"
    apply = host.ledger()[-1]
    assert (apply["event"], apply["generation"], apply["previous"], apply["profile"]) == ("apply", 1, 0, "p1")
    assert not list((host.state / "generations").glob(".*.tmp"))


def test_commit_numbers_generations_after_the_newest(host: Host) -> None:
    host.hand_written()
    assert [host.apply(n)["generation"] for n in (1, 2, 3)] == [1, 2, 3]
    assert host.generations() == ["0000", "0001", "0002", "0003"]


def test_commit_without_staged_files_fails(host: Host) -> None:
    host.call("begin")
    with pytest.raises(Failed, match=r"staged files missing .*the stage action must run first"):
        host.call("commit", profile=profile(1))


def test_commit_in_check_mode_changes_nothing(host: Host) -> None:
    host.hand_written()
    host.call("begin")
    host.stage(script(1), unit(1))
    res = host.call("commit", FakeModule(check_mode=True), profile=profile(1))
    assert (res["changed"], res["generation"], res["files_changed"]) == (True, 0, True)
    assert host.generations() == ["0000"] and host.script.read_text() == HAND_SCRIPT


def probe_doc(host: Host, env: dict[str, str], cmdline: list[str]) -> dict[str, Any]:
    """What knob_observe.observe would see on a host running the installed generation."""
    files = {
        key: {"path": str(path), "exists": True, "sha256": sha(path.read_text()), "mtime": 0}
        for key, path in (("script", host.script), ("unit", host.unit))
    }
    main = {"pid": 42, "comm": "engine", "env": env, "cmdline": cmdline, "start_epoch": 10}
    return running_doc(main, props={"MainPID": "42"}, unit="svc.service", files=files, generations={})


def test_commit_of_unchanged_files_asks_the_live_rule(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.hand_written()
    host.apply(1)
    live = {"CTAS": "1"}
    monkeypatch.setattr(knob_commit, "observe", lambda p: probe_doc(host, live, ["/usr/bin/engine", "--tp", "1"]))
    host.call("begin")
    host.stage(script(1), unit(1))
    res = host.call("commit", profile=profile(1))
    assert (res["changed"], res["generation"], res["files_changed"]) == (False, 1, False)
    assert "restart_reason" not in res and host.generations() == ["0000", "0001"]
    # the files are right but the engine runs other env: restart it, no new generation
    live["CTAS"] = "7"
    res = host.call("commit", profile=profile(1))
    assert (res["changed"], res["generation"], res["actions"]) == (True, 1, ["restart"])
    assert res["restart_reason"] == "live state differs from the installed files (env_mismatch)"
    restart = host.ledger()[-1]
    assert (restart["event"], restart["generation"]) == ("restart", 1)
    assert host.generations() == ["0000", "0001"]


@pytest.mark.parametrize(
    "by_hand",
    [lambda h: h.script.chmod(0o777), lambda h: h.unit.chmod(0o600), lambda h: os.chown(h.unit, 0, 1)],
    ids=["chmod-script", "chmod-unit", "chgrp-unit"],
)
def test_commit_of_right_files_with_another_mode_or_owner_stores_a_generation(host: Host, by_hand: Any) -> None:
    """A chmod or chown by hand is drift (file_access_changed): the next apply installs a new generation, which
    puts the recorded mode and owner back."""
    host.hand_written()
    host.apply(1)
    by_hand(host)
    host.call("begin")
    host.stage(script(1), unit(1))
    res = host.call("commit", profile=profile(1))
    assert (res["changed"], res["generation"], res["files_changed"]) == (True, 2, True)
    assert (mode(host.script), mode(host.unit)) == (0o755, 0o644)
    assert (host.unit.stat().st_uid, host.unit.stat().st_gid) == (0, 0)


def test_commit_of_the_same_files_under_another_profile_hash_stores_a_generation(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    host.call("begin")
    host.stage(script(1), unit(1))
    res = host.call("commit", profile={**profile(1), "hash": "sha256:" + "f" * 64})
    assert (res["changed"], res["generation"], res["files_changed"]) == (True, 2, False)


# --- all-or-nothing install --------------------------------------------------------------------------------


def break_unit_dir_mid_way(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Just before the unit is written (the script already is), its directory is swapped for a symlink: the
    real knob_fs write then refuses it, as it would on a host where someone raced the apply."""
    real_put = knob_fs.Install.put

    def put(self: Any, path: str, data: bytes, mode: int, uid: int = 0, gid: int = 0) -> None:
        if path == str(host.unit) and not host.unit.parent.is_symlink():
            moved = host.root / "elsewhere"
            shutil.move(str(host.unit.parent), str(moved))
            host.unit.parent.symlink_to(moved)
        real_put(self, path, data, mode, uid, gid)

    monkeypatch.setattr(knob_fs.Install, "put", put)


def test_a_failed_install_puts_back_every_file_already_written(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.hand_written()
    host.call("begin")
    host.stage(script(1), unit(1))
    break_unit_dir_mid_way(host, monkeypatch)
    with pytest.raises(Failed) as exc:
        host.call("commit", profile=profile(1))
    res, msg = exc.value.result, str(exc.value)
    assert res["rolled_back"] is True
    assert msg.startswith("cannot install generation 0001 (")
    assert f"{host.script} put back as it was;" in msg
    assert msg.endswith("generation 0001 removed; generation 0000 is still live")
    assert host.script.read_text() == HAND_SCRIPT and mode(host.script) == 0o700
    assert (host.root / "elsewhere/svc.service").read_text() == HAND_UNIT
    assert host.generations() == ["0000"] and host.current() == "generations/0000"
    assert [e["event"] for e in host.ledger()] == ["adopt"]


def test_a_failed_first_install_removes_what_it_wrote(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.unit.parent.mkdir(parents=True)
    host.call("begin")
    host.stage(script(1), unit(1))
    break_unit_dir_mid_way(host, monkeypatch)
    with pytest.raises(Failed, match=r"generation 0001 removed; generation 0000 is still live"):
        host.call("commit", profile=profile(1))
    assert not host.script.exists()
    assert host.generations() == ["0000"]


def test_a_generation_that_cannot_be_stored_installs_nothing(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.hand_written()
    host.call("begin")
    host.stage(script(1), unit(1))
    real_write = knob_store.write_at

    def full_disk(dfd: int, name: str, data: bytes, mode: int, uid: int = 0, gid: int = 0) -> None:
        if name == "meta.json":
            raise OSError(28, "No space left on device", name)
        real_write(dfd, name, data, mode, uid, gid)

    monkeypatch.setattr(knob_store, "write_at", full_disk)
    with pytest.raises(Failed) as exc:
        host.call("commit", profile=profile(1))
    assert exc.value.result["errno"] == 28
    assert str(exc.value).startswith("cannot store generation 0001 in ")
    assert str(exc.value).endswith("nothing was installed, generation 0000 is still live")
    assert host.script.read_text() == HAND_SCRIPT
    assert sorted(os.listdir(host.state / "generations")) == ["0000"]


# --- mark and prune ----------------------------------------------------------------------------------------


def test_mark_records_status_and_reason(host: Host) -> None:
    host.hand_written()
    host.apply(1, status=None)
    res = host.call("mark", generation=1, status="failed", reason="not ready after 60s")
    assert res == {"changed": True, "generation": 1, "status": "failed", "pruned": []}
    meta = host.meta(1)
    assert (meta["status"], meta["reason"]) == ("failed", "not ready after 60s")
    mark = host.ledger()[-1]
    assert (mark["event"], mark["generation"], mark["status"]) == ("mark", 1, "failed")


def test_mark_in_check_mode_only_says_whether_it_would_change(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    check = FakeModule(check_mode=True)
    assert host.call("mark", check, generation=1, status="good") == {"changed": False, "generation": 1}
    assert host.call("mark", check, generation=1, status="failed") == {"changed": True, "generation": 1}
    assert host.meta(1)["status"] == "good"


def test_mark_of_a_missing_generation_fails(host: Host) -> None:
    host.call("begin")
    with pytest.raises(Failed, match=r"cannot read .*/generations/0007/meta.json"):
        host.call("mark", generation=7, status="good")


def test_marking_good_prunes_beyond_keep(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    host.apply(2, status="failed")
    host.apply(3)
    host.apply(4)
    host.apply(5, status=None)
    res = host.call("mark", generation=5, status="good", keep=2)
    # kept: 0 (adopted), the last 2 good (4, 5; 4 is also the previous good one); older ones go, failed too
    assert res["pruned"] == [1, 2, 3]
    assert host.generations() == ["0000", "0004", "0005"]
    prune = host.ledger()[-1]
    assert (prune["event"], prune["generations"], prune["keep"]) == ("prune", [1, 2, 3], 2)


def test_prune_keeps_failed_generations_newer_than_the_oldest_kept_good_one(host: Host) -> None:
    host.hand_written()
    for n, status in ((1, "good"), (2, "good"), (3, "failed"), (4, "good")):
        host.apply(n, status=status)
    assert knob_store.prune(host.store, 2) == [1]
    assert host.generations() == ["0000", "0002", "0003", "0004"]
    assert knob_store.prune(host.store, 0) == [] and knob_store.prune(host.store, 2) == []


def test_prune_never_removes_current_or_the_previous_good_one(host: Host) -> None:
    host.hand_written()
    for n in (1, 2, 3):
        host.apply(n)
    host.apply(4, status="failed")
    assert knob_store.prune(host.store, 1) == [1, 2]
    # kept: current (4, failed), the newest good (3) which is also the way back, and generation 0
    assert host.generations() == ["0000", "0003", "0004"]


# --- restore -----------------------------------------------------------------------------------------------


def test_restore_goes_back_to_the_previous_good_generation(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    host.apply(2, status=None)
    res = host.call("restore", reason="gate rejected", run_id="run-2")
    assert (res["changed"], res["generation"], res["previous"]) == (True, 1, 2)
    assert (res["profile"], res["version"], res["hash"]) == ("p1", 1, profile(1)["hash"])
    assert res["dropins_restored"] == []
    assert host.script.read_text() == script(1) and mode(host.script) == 0o755
    assert host.unit.read_text() == unit(1) and mode(host.unit) == 0o644
    assert host.current() == "generations/0001"
    left = host.meta(2)
    assert (left["status"], left["reason"]) == ("rolled-back", "gate rejected")
    event = host.ledger()[-1]
    assert (event["event"], event["generation"], event["previous"], event["reason"]) == (
        "rollback",
        1,
        2,
        "gate rejected",
    )


def test_restore_to_generation_0_reinstalls_the_hand_written_files(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    res = host.call("restore", generation=0, leave_status="failed", event="restore")
    assert (res["generation"], res["previous"], res["profile"]) == (0, 1, None)
    assert host.script.read_text() == HAND_SCRIPT and host.unit.read_text() == HAND_UNIT
    assert host.meta(1)["status"] == "failed"
    assert host.ledger()[-1]["event"] == "restore"


def test_restore_leaves_a_failed_generation_failed(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    host.apply(2, status="failed")
    host.call("restore", reason="roll back")
    assert host.meta(2)["status"] == "failed"


def test_restore_in_check_mode_changes_nothing(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    host.apply(2)
    res = host.call("restore", FakeModule(check_mode=True))
    assert res == {"changed": True, "generation": 1, "previous": 2}
    assert host.script.read_text() == script(2) and host.current() == "generations/0002"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("alter", r"generation 0001: .*/serve.sh does not match its recorded sha256; refusing; nothing changed"),
        ("delete", r"generation 0001: .*/serve.sh was deleted; refusing to roll back to it; nothing changed"),
        ("meta", r"generations/0001/meta.json is unreadable .*pick another with --to N; nothing changed"),
    ],
)
def test_restore_refuses_a_damaged_generation(host: Host, damage: str, message: str) -> None:
    host.hand_written()
    host.apply(1)
    host.apply(2)
    stored = host.state / "generations/0001"
    if damage == "alter":
        (stored / "serve.sh").write_text(script(9))
    elif damage == "delete":
        (stored / "serve.sh").unlink()
    else:
        (stored / "meta.json").write_text("[]")
    ledger = host.ledger()
    with pytest.raises(Failed, match=message):
        host.call("restore", generation=1)
    assert host.script.read_text() == script(2) and host.current() == "generations/0002"
    assert host.ledger() == ledger


def test_restore_to_a_generation_that_does_not_exist(host: Host) -> None:
    host.hand_written()
    host.apply(1)
    with pytest.raises(Failed, match=r"generation 0005 does not exist on this host \(have: 0000, 0001\); nothing"):
        host.call("restore", generation=5)


def test_restore_without_an_earlier_good_generation(host: Host) -> None:
    host.hand_written()
    host.call("begin")
    (host.state / "generations/0000/meta.json").write_text(json.dumps({"status": "failed", "files": {}}))
    with pytest.raises(Failed, match=r"no earlier good generation to go back to \(current 0\); nothing changed"):
        host.call("restore")


def test_restore_to_a_generation_without_files_uninstalls(host: Host) -> None:
    host.call("begin")  # nothing was installed before knobfleet: generation 0 holds no files
    host.stage(script(1), unit(1))
    host.call("commit", profile=profile(1))
    assert host.script.exists() and host.unit.exists()
    module = FakeModule()
    res = host.call("restore", module, generation=0, event="restore", reason="first apply failed")
    assert (res["uninstalled"], res["generation"], res["previous"]) == (True, 0, 1)
    assert sorted(res["removed"]) == sorted([str(host.script), str(host.unit)])
    assert module.commands == [["systemctl", "disable", "--now", "svc.service"], ["systemctl", "daemon-reload"]]
    assert not host.script.exists() and not host.unit.exists()
    assert host.current() == "generations/0000"
    left = host.meta(1)
    assert (left["status"], left["reason"]) == ("rolled-back", "first apply failed")
    event = host.ledger()[-1]
    assert (event["event"], event["generation"], event["previous"]) == ("uninstall", 0, 1)


def test_uninstall_in_check_mode_changes_nothing(host: Host) -> None:
    host.call("begin")
    host.stage(script(1), unit(1))
    host.call("commit", profile=profile(1))
    module = FakeModule(check_mode=True)
    res = host.call("restore", module, generation=0, event="restore")
    assert res == {"changed": True, "generation": 0, "previous": 1, "uninstalled": True}
    assert module.commands == [] and host.script.exists()


def test_a_rollback_to_a_generation_without_files_is_refused(host: Host) -> None:
    host.call("begin")
    host.stage(script(1), unit(1))
    host.call("commit", profile=profile(1))
    with pytest.raises(Failed, match=r"generation 0000 holds no files .*nothing changed"):
        host.call("restore", generation=0, event="rollback")
    assert host.script.exists()


# --- foreign drop-ins under policy remove --------------------------------------------------------------------


def test_removed_dropins_travel_with_the_generation_and_come_back_on_restore(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.hand_written()
    admin = host.unit.parent / "svc.service.d"
    admin.mkdir()
    dropin = admin / "override.conf"
    dropin.write_text("[Service]\nEnvironment=CTAS=1024\n")
    monkeypatch.setattr(
        knob_guards, "dropins", lambda unit: [{"path": str(p), "exists": True} for p in sorted(admin.glob("*.conf"))]
    )
    host.call("begin", foreign_dropins="remove")
    host.stage(script(1), unit(1))
    res = host.call("commit", profile=profile(1), foreign_dropins="remove")
    assert res["dropins_removed"] == [str(dropin)] and res["generation"] == 1
    assert not dropin.exists()
    assert (host.state / "generations/0001/dropins/override.conf").read_text() == "[Service]\nEnvironment=CTAS=1024\n"
    assert host.meta(1)["dropins_removed"] == [str(dropin)]
    res = host.call("restore", generation=0)
    assert res["dropins_restored"] == [str(dropin)]
    assert dropin.read_text() == "[Service]\nEnvironment=CTAS=1024\n"


def test_foreign_dropins_refuse_the_host_under_policy_fail(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.hand_written()
    monkeypatch.setattr(
        knob_guards, "dropins", lambda unit: [{"path": "/run/systemd/system/svc.service.d/x.conf", "exists": True}]
    )
    with pytest.raises(Failed) as exc:
        host.call("begin", foreign_dropins="fail")
    assert exc.value.result["refused"] is True and "foreign drop-in /run/systemd/system/svc.service.d/x.conf" in str(
        exc.value
    )
    assert not host.state.exists()
    with pytest.raises(Failed, match=r"is not in .*svc.service.d, so knobfleet will not remove it"):
        host.call("begin", foreign_dropins="remove")


def test_a_staged_script_bash_rejects_fails_the_task(host: Host, tmp_path: Path) -> None:
    staged = tmp_path / "serve.sh"
    staged.write_text("#!/bin/bash\nexec engine --tp 2 'unterminated\n")
    validate = VALIDATE  # the real one, not the fixture's
    with pytest.raises(Failed, match=r"^bash -n rejected the staged script: "):
        validate(FakeModule(), "script", str(staged), str(host.script))
    staged.write_text(script(1))
    validate(FakeModule(), "script", str(staged), str(host.script))


def test_a_serve_script_that_cannot_be_replaced_is_not_put_back_nor_stuck(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 56 (LOW): an immutable serve script (``chattr +i``: the rename over it fails with EPERM) was recorded
    as changed before its write, so the refusal said "could not put back … restore by hand" of a file nothing had
    touched. Now only a file whose rename happened is put back."""
    import errno as errno_

    host.hand_written()
    host.call("begin")
    host.stage(script(1), unit(1))
    real_rename = knob_fs.os.rename

    def rename(src: Any, dst: Any, *args: Any, **kw: Any) -> None:
        into = os.readlink(f"/proc/self/fd/{kw['dst_dir_fd']}") if "dst_dir_fd" in kw else ""
        if dst == host.script.name and into == str(host.script.parent):
            raise PermissionError(errno_.EPERM, "Operation not permitted", str(host.script))
        real_rename(src, dst, *args, **kw)

    monkeypatch.setattr(knob_fs.os, "rename", rename)
    with pytest.raises(Failed) as exc:
        host.call("commit", profile=profile(1))
    msg = str(exc.value)
    assert "could not put back" not in msg and "put back as it was" not in msg, msg
    assert msg.startswith(f"cannot install generation 0001 ({host.script}: Operation not permitted)")
    assert msg.endswith("generation 0001 removed; generation 0000 is still live")
    assert host.script.read_text() == HAND_SCRIPT
    assert not [p.name for p in host.script.parent.iterdir() if "knobfleet-prev" in p.name or "knobfleet-tmp" in p.name]
    assert host.generations() == ["0000"] and host.current() == "generations/0000"


def test_drifts_advice_for_a_current_that_is_a_file_is_what_rollback_accepts(host: Host) -> None:
    """Issue 56 (LOW): drift advised `rollback --to N` for a `current` that is a regular file, which rollback
    refuses. The advice now says to remove it first: then the restore to generation N works."""
    host.hand_written()
    host.apply(1)
    host.apply(2)
    link = host.state / "current"
    link.unlink()
    link.write_text("2\n")  # a hand edit
    with pytest.raises((Failed, OSError), match="is not a symlink to generations/NNNN; remove it"):
        host.call("restore", generation=1, reason="roll back")
    link.unlink()  # what drift's advice says first
    res = host.call("restore", generation=1, reason="roll back")
    assert res["generation"] == 1 and host.current() == "generations/0001"
