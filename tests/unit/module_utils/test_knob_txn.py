"""The host transaction as plain importable code: module_utils/knob_txn (begin, mark, release, verify, the composite
calls, ``run``), knob_commit (stage, commit), knob_restore, knob_store (generations, ledger, lock, prune) and
knob_guards, imported directly, without Ansible and without the role's module. A stand-in for AnsibleModule
records what the transaction asks of it; temp dirs are the host (the tests run as root, as the module does).
roles/knob_serve/library/knob_generation.py keeps only its documentation, its argument spec and ``main``."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet import paths
from knobfleet.fleet.transports.base import bundle
from knobfleet.module_utils import knob_commit, knob_pkgmeta, knob_restore, knob_store, knob_txn

REPO = Path(__file__).resolve().parents[3]
LIBRARY = REPO / "roles" / "knob_serve" / "library" / "knob_generation.py"
HAND_SCRIPT = "#!/bin/bash\nexport CTAS=256\nexec /usr/bin/engine --tp 2\n"
HAND_UNIT = "[Service]\nExecStart=/root/serve.sh\n"


class Failed(Exception):
    """What ``fail_json`` raises here (Ansible's ends the process)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg"))
        self.result = result


class Exited(Exception):
    """What ``exit_json`` raises here."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("step"))
        self.result = result


class Module:
    """What the transaction uses of AnsibleModule (knob_store.Module)."""

    def __init__(self, params: dict[str, Any] | None = None, check_mode: bool = False) -> None:
        self.params = params or {}
        self.check_mode = check_mode
        self._diff = False
        self.warnings: list[str] = []
        self.commands: list[list[str]] = []

    def fail_json(self, **result: Any) -> None:
        raise Failed(result)

    def exit_json(self, **result: Any) -> None:
        raise Exited(result)

    def warn(self, warning: str) -> None:
        self.warnings.append(warning)

    def run_command(self, args: list[str]) -> tuple[int, str, str]:
        self.commands.append(list(args))
        return 0, "", ""


@pytest.fixture(autouse=True)
def no_host_tools(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """bash -n and systemd-analyze are the host's tools, and so are its package unit directories: not used here."""
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)
    monkeypatch.setattr(knob_pkgmeta, "PACKAGE_UNIT_DIRS", (str(tmp_path_factory.mktemp("no-package-units")),))


class Host:
    def __init__(self, root: Path) -> None:
        self.state = root / "var/lib/knobfleet/svc"
        self.script = root / "root/serve.sh"
        self.unit = root / "etc/systemd/system/svc.service"
        self.store = knob_store.Store(str(self.state))

    def params(self, action: str, **kw: Any) -> dict[str, Any]:
        p: dict[str, Any] = {
            **dict.fromkeys(("script_content", "unit_content", "profile", "generation", "status", "engine")),
            "action": action,
            "after": "apply",
            "state_dir": str(self.state),
            "script_path": str(self.script),
            "unit_path": str(self.unit),
            "run_id": "run-1",
            "operator": "alice",
            "controller": "ctl:4242",
            "reason": "",
            "break_lock": False,
            "keep": 10,
            "leave_status": "rolled-back",
            "event": "rollback",
            "secret": [],
            "secret_key": "",
            "service_user": "root",
            "foreign_dropins": "ignore",
            "health_url": "",
            "info_url": "",
        }
        p.update(kw)
        return p

    def call(self, action: str, **kw: Any) -> dict[str, Any]:
        result: dict[str, Any] = knob_txn.HANDLERS[action](Module(), self.store, self.params(action, **kw))
        return result

    def hand_written(self) -> None:
        for path, text in ((self.script, HAND_SCRIPT), (self.unit, HAND_UNIT)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def apply(self, n: int, run_id: str) -> dict[str, Any]:
        self.call("begin", run_id=run_id)
        self.call("stage", run_id=run_id, script_content=script(n), unit_content=unit(n))
        res = self.call("commit", run_id=run_id, profile=profile(n))
        self.call("mark", run_id=run_id, generation=res["generation"], status="good")
        self.call("release", run_id=run_id)
        return res

    def ledger(self) -> list[str]:
        return [json.loads(line)["event"] for line in (self.state / "ledger.jsonl").read_text().splitlines()]


def script(n: int) -> str:
    return f"#!/bin/bash\nexport CTAS={n}\nexec /usr/bin/engine --tp {n}\n"


def unit(n: int) -> str:
    return f"[Service]\nExecStart=/root/serve.sh\nRestartSec={n}\n"


def profile(n: int) -> dict[str, Any]:
    return {"name": f"p{n}", "version": 1, "hash": f"sha256:{n:064x}"}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_two_applies_and_a_rollback_through_the_transaction(host: Host) -> None:
    host.hand_written()
    assert host.apply(1, "run-1")["generation"] == 1
    assert host.apply(2, "run-2")["generation"] == 2
    assert host.script.read_text() == script(2)
    res = host.call("restore", run_id="run-3", reason="back")
    assert (res["generation"], res["previous"], res["profile"]) == (1, 2, "p1")
    assert host.script.read_text() == script(1) and host.unit.read_text() == unit(1)
    assert os.readlink(host.state / "current") == "generations/0001"
    assert host.store.meta(2)["status"] == "rolled-back" and host.store.meta(0)["status"] == "adopted"
    events = ["adopt", "apply", "mark", "apply", "mark", "rollback"]
    assert host.ledger() == events and not (host.state / "lock").exists()
    assert knob_store.previous_good(host.store, 2) == 1 and knob_store.statuses(host.store)[2] == "rolled-back"


def test_the_composite_install_and_finish(host: Host) -> None:
    host.hand_written()
    res = host.call("install", script_content=script(1), unit_content=unit(1), profile=profile(1))
    assert list(res["steps"]) == ["begin", "stage", "commit"] and res["steps"]["commit"]["generation"] == 1
    res = host.call("finish", generation=1, status="good")
    assert list(res["steps"]) == ["mark", "release"] and res["steps"]["release"] == {"changed": False, "released": True}


def test_run_names_the_step_in_every_result_and_failure(host: Host) -> None:
    with pytest.raises(Exited) as done:
        knob_txn.run(Module(host.params("release")))
    assert done.value.result == {"step": "release", "changed": False}
    with pytest.raises(Failed) as failed:
        knob_txn.run(Module(host.params("mark", generation=7, status="good")))
    assert failed.value.result["step"] == "mark"
    assert str(failed.value).startswith(f"cannot read {host.state}/generations/0007/meta.json: ")


def test_a_restore_with_nothing_to_go_back_to_changes_nothing(host: Host) -> None:
    host.hand_written()
    host.apply(1, "run-1")
    with pytest.raises(Failed, match=r"^generation 0009 does not exist on this host \(have: 0000, 0001\)"):
        knob_restore.restore(Module(), host.store, host.params("restore", generation=9))
    assert os.readlink(host.state / "current") == "generations/0001"


def test_the_role_module_keeps_its_documentation_spec_and_a_thin_main() -> None:
    tree = ast.parse(LIBRARY.read_text())
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert names == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["main"]
    imported = [(n.module, [a.name for a in n.names]) for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert imported[-2:] == [
        ("ansible.module_utils.basic", ["AnsibleModule"]),
        ("ansible.module_utils.knob_txn", ["run"]),
    ]
    choices = next(
        k.value
        for c in ast.walk(tree)
        if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "dict"
        for k in c.keywords
        if k.arg == "action"
    )
    actions = ast.literal_eval(next(k.value for k in choices.keywords if k.arg == "choices"))  # type: ignore[attr-defined]
    assert sorted(actions) == sorted(knob_txn.HANDLERS)


def test_the_transaction_imports_without_ansible() -> None:
    """Plain code on the controller too: importable where Ansible is not (no ``ansible`` import on the way)."""
    program = (
        "import sys\n"
        "class NoAnsible:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ansible' or name.startswith('ansible.'):\n"
        "            raise ImportError('no ansible here: ' + name)\n"
        "sys.meta_path.insert(0, NoAnsible())\n"
        "from knobfleet.module_utils import knob_txn\n"
        "print(sorted(knob_txn.HANDLERS))\n"
    )
    got = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == repr(sorted(knob_txn.HANDLERS))


def test_the_role_module_ships_the_transaction_files() -> None:
    """The fast path's bundle (and Ansible's module_utils finder, from the same import lines) carries every file of
    the transaction, each after the files it imports."""
    utils = json.loads(bundle(LIBRARY.read_bytes(), paths.module_utils_dir()))["utils"]
    order = [n for n, _text in utils]
    assert {"knob_store", "knob_guards", "knob_commit", "knob_restore", "knob_txn"} <= set(order)
    for n, text in utils:
        for dep in set(re.findall(r"ansible\.module_utils\.(knob_[a-z_]+) import", text)) - {n}:
            assert order.index(dep) < order.index(n), (dep, n)


# --- the lock refusal carries fields -------------------------------------------------------------------------


def test_a_lock_refusal_carries_the_holders_fields(host: Host) -> None:
    host.call("begin", run_id="run-1", operator="alice", controller="ctl-host:4242")
    with pytest.raises(Failed) as exc:
        host.call("begin", run_id="run-2", operator="bob")
    res = exc.value.result
    lock = res["lock"]
    assert res["lock_held"] is True and "refused" not in res
    assert (lock["run_id"], lock["operator"], lock["controller"]) == ("run-1", "alice", "ctl-host:4242")
    assert (lock["holder_host"], lock["holder_pid"], lock["path"]) == ("ctl-host", 4242, str(host.state / "lock"))
    assert lock["since"] == json.loads((host.state / "lock").read_text())["since"]
    # the message a person reads is as it was
    assert res["msg"] == (
        f"locked by alice (run run-1) since {lock['since']} from ctl-host:4242; if that applier was killed, break the "
        "lock with --break-lock"
    )


def test_an_unreadable_lock_is_refused_with_what_is_known(host: Host) -> None:
    host.call("begin", run_id="run-1")
    (host.state / "lock").write_text("{not json")
    with pytest.raises(Failed) as exc:
        host.call("begin", run_id="run-2")
    lock = exc.value.result["lock"]
    assert lock["corrupt"] and lock["run_id"] == "?" and lock["path"] == str(host.state / "lock")
    assert lock["holder_host"] is None and lock["holder_pid"] is None


def test_losing_the_race_for_the_lock_is_the_same_refusal(host: Host) -> None:
    """Another run takes the lock between this begin's read of it (none) and its O_EXCL create."""
    host.call("begin", run_id="run-1", controller="other:77")
    with pytest.raises(Failed) as exc:
        knob_store.take_lock(Module(), host.store, host.params("begin", run_id="run-2"))
    res = exc.value.result
    assert res["lock_held"] is True and res["msg"].startswith("locked by alice (run run-1) since ")
    assert (res["lock"]["holder_host"], res["lock"]["holder_pid"]) == ("other", 77)


def test_the_controller_recognises_the_refusal_by_its_fields_not_its_text(host: Host) -> None:
    """The module's own refusal, through the runner's fold and apply's outcome: the outcome holds the lock's fields.
    A failure whose text merely says "locked by" is no lock refusal, even where begin reported a holder (a check
    run's begin reports the lock it found without refusing)."""
    from types import SimpleNamespace

    from knobfleet.fleet.runner import RunResult, fold_event
    from knobfleet.ops.apply import _outcome
    from knobfleet.ops.steps import read_play

    def outcome(res: dict[str, Any], check: bool = False) -> Any:
        result = RunResult("r", 2, "failed", {}, Path("/nonexistent"), 0.0)
        event = {"host": "h1", "task": "Install", "task_action": "knob_generation", "res": res}
        fold_event(result, {"event": "runner_on_failed", "event_data": event})
        hr = result.host("h1")
        hr.failed = 1  # the play's stats say so
        typed = read_play("h1", hr.results, hr.success)
        return _outcome(SimpleNamespace(host="h1"), hr, typed, 1, check)  # type: ignore[arg-type]

    host.call("begin", run_id="run-1", operator="alice", controller="ctl-host:4242")
    with pytest.raises(Failed) as exc:
        knob_txn.HANDLERS["install"](Module(), host.store, host.params("install", run_id="run-2"))
    refusal = {"step": "install", "failed": True, **exc.value.result}
    out = outcome(refusal)
    assert out.status == "failed" and out.lock == refusal["lock"] and out.lock["holder_pid"] == 4242
    assert out.message == "Install: " + refusal["msg"]
    seen = {"lock": {k: v for k, v in refusal["lock"].items() if k in ("run_id", "operator", "since", "controller")}}
    other = {
        "step": "install",
        "failed": True,
        "failed_step": "stage",
        "msg": "locked by a typo",
        "steps": {"begin": seen},
    }
    assert outcome(other, check=True).lock is None
