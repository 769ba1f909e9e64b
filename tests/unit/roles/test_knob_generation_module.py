"""The on-host generation module as Ansible runs it, in-process: main() with Ansible's real AnsibleModule (its
arguments handed over as Ansible does), so the argument spec, check mode and diff, the step named in every
result and failure, verify, and the serve script's access when it holds a secret are exercised, and counted by
coverage. Temp dirs are the host, as in test_knob_generation.py."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pwd
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible.module_utils import basic

from knobfleet.module_utils import knob_commit

REPO = Path(__file__).resolve().parents[3]


def load() -> ModuleType:
    for util in ("knob_fs", "knob_live", "knob_observe", "knob_txn"):
        sys.modules.setdefault(
            f"ansible.module_utils.{util}", importlib.import_module(f"knobfleet.module_utils.{util}")
        )
    path = REPO / "roles" / "knob_serve" / "library" / "knob_generation.py"
    spec = importlib.util.spec_from_file_location("knob_role_knob_generation_main", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kg = load()
VALIDATE = knob_commit.validate_staged  # the fixture below replaces it
SCRIPT = "#!/bin/bash\nset -euo pipefail\nexport CTAS=512\nexec /usr/bin/engine --tp 2\n"
UNIT = "[Service]\nExecStart=/root/serve.sh\n"
PROFILE = {"name": "p", "version": 1, "hash": "sha256:" + "1" * 64}


class Host:
    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.state = root / "var/lib/knobfleet/svc"
        self.script = root / "root/serve.sh"
        self.unit = root / "etc/systemd/system/svc.service"
        self.script.parent.mkdir(parents=True)
        self.unit.parent.mkdir(parents=True)
        self.capsys = capsys

    def run(self, action: str, **args: Any) -> tuple[int, dict[str, Any]]:
        """main() with these module arguments; (exit code, the JSON result Ansible reads)."""
        module_args = {
            "action": action,
            "state_dir": str(self.state),
            "script_path": str(self.script),
            "unit_path": str(self.unit),
            "run_id": "run-1",
            "operator": "alice",
            **args,
        }
        module_args = {k: v for k, v in module_args.items() if v is not None}
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": module_args}).encode()
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            kg.main()
        out = self.capsys.readouterr().out
        result: dict[str, Any] = json.loads(out[out.index("{") :])
        return int(info.value.code or 0), result

    def install(self, script: str = SCRIPT, **args: Any) -> tuple[int, dict[str, Any]]:
        """begin, stage and commit, one module call each, as the role runs them; the first failure's result."""
        for action, extra in (
            ("begin", {}),
            ("stage", {"script_content": script, "unit_content": UNIT}),
            ("commit", {"profile": PROFILE}),
        ):
            rc, res = self.run(action, **extra, **args)
            if rc or action == "commit":
                return rc, res
        raise AssertionError("unreachable")

    def meta(self, n: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "generations" / f"{n:04d}" / "meta.json").read_text())
        return data


@pytest.fixture(autouse=True)
def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_commit, "validate_staged", lambda module, kind, path, script_path: None)


@pytest.fixture
def host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Host:
    return Host(tmp_path, capsys)


def test_begin_stage_commit_as_ansible_calls_them(host: Host) -> None:
    rc, res = host.run("begin")
    assert (rc, res["step"], res["changed"], res["generation"]) == (0, "begin", True, 0)
    rc, res = host.run("stage", script_content=SCRIPT, unit_content=UNIT)
    assert (rc, res["step"], res["staged"]) == (0, "stage", ["script", "unit"])
    # the script's text may hold secrets: Ansible never logs it or hands it back
    assert res["invocation"]["module_args"]["script_content"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    rc, res = host.run("commit", profile=PROFILE)
    assert (rc, res["step"], res["changed"], res["generation"], res["previous"]) == (0, "commit", True, 1, 0)
    assert host.script.read_text() == SCRIPT and host.unit.read_text() == UNIT
    assert host.meta(1)["status"] == "installing" and host.meta(1)["profile"] == "p"
    json.loads((host.state / "lock").read_text())  # held until released
    rc, res = host.run("mark", generation=1, status="good")
    assert (rc, res["step"]) == (0, "mark") and host.meta(1)["status"] == "good"
    rc, res = host.run("release")
    assert (rc, res) == (0, {**res, "step": "release", "changed": False, "released": True})
    assert not (host.state / "lock").exists()


def test_stage_in_check_mode_diffs_and_writes_nothing(host: Host) -> None:
    host.script.write_text("#!/bin/bash\nexec /usr/bin/engine --tp 1\n")
    rc, res = host.run("stage", script_content=SCRIPT, unit_content=UNIT, _ansible_check_mode=True, _ansible_diff=True)
    assert rc == 0 and res["changed"] is True
    (script_diff, unit_diff) = res["diff"]
    assert script_diff["before"] == "#!/bin/bash\nexec /usr/bin/engine --tp 1\n"
    assert script_diff["after"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"  # Ansible masks the no_log text
    assert unit_diff == {"before_header": str(host.unit), "after_header": str(host.unit), "before": "", "after": UNIT}
    assert not host.state.exists() and host.script.read_text().endswith("--tp 1\n")


def test_a_failure_names_the_step(host: Host) -> None:
    assert host.install(run_id="run-0")[0] == 0  # its lock is still held
    rc, res = host.run("begin", run_id="run-1")
    assert rc == 1 and res["failed"] is True and res["step"] == "begin" and res["lock_held"] is True
    assert res["msg"].startswith("locked by alice (run run-0) since ")
    # the refusal's fields, through Ansible's own result (what the controller reads instead of the text)
    assert res["lock"]["run_id"] == "run-0" and res["lock"]["path"] == str(host.state / "lock")
    assert {"holder_host", "holder_pid", "since", "controller", "operator"} <= set(res["lock"])
    (host.state / "staging" / "serve.sh").unlink()
    rc, res = host.run("commit", run_id="run-0", profile=PROFILE)
    assert rc == 1 and res["step"] == "commit" and res["msg"].startswith("staged files missing in ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"action": "begin", "script_path": None}, "action is begin but all of the following are missing: script_path"),
        ({"action": "mark"}, "action is mark but all of the following are missing: generation, status"),
        (
            {"action": "dance"},
            "value of action must be one of: begin, stage, commit, mark, release, restore, verify, "
            "install, finish, got: dance",
        ),
    ],
)
def test_arguments_are_checked_before_anything_runs(host: Host, args: dict[str, Any], message: str) -> None:
    rest = {k: v for k, v in args.items() if k != "action"}  # the parameters are shared by every run
    rc, res = host.run(args["action"], **rest)
    assert rc == 1 and res["msg"].startswith(message)
    assert not host.state.exists()


def test_an_os_error_is_one_line_naming_the_step_and_the_path(host: Host, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rc, res = host.run("begin", state_dir=str(blocker / "state"))
    assert rc == 1 and res["step"] == "begin" and res["errno"] == 20
    assert res["msg"] == (
        f"begin failed: {blocker}: is a symlink or not a directory; knobfleet does not follow symlinks in the "
        f"paths it manages; this step's changes were undone"
    )


def test_release_by_another_run_leaves_the_lock(host: Host) -> None:
    host.install(run_id="run-0")
    rc, res = host.run("release", run_id="run-9")
    assert rc == 0 and res["changed"] is False and "released" not in res and (host.state / "lock").exists()
    _, res = host.run("release", run_id="run-0", _ansible_check_mode=True)
    assert res["changed"] is False and "released" not in res and (host.state / "lock").exists()


# --- verify -----------------------------------------------------------------------------------------------------


def test_verify_fails_a_generation_whose_engine_is_not_running(host: Host) -> None:
    host.install()
    host.run("mark", generation=1, status="good")
    rc, res = host.run("verify", health_url="http://127.0.0.1:9/health")
    assert rc == 1 and res["step"] == "verify"
    assert res["msg"].startswith("generation 0001 does not verify: ")
    kinds = {f["kind"] for f in res["findings"]}
    assert "service_inactive" in kinds and "file_changed" not in kinds and "file_missing" not in kinds


def test_verify_after_a_restore_tolerates_what_predates_it(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.install()
    host.run("mark", generation=1, status="good")
    active = {"ActiveState": "active", "SubState": "running", "MainPID": "0", "NeedDaemonReload": "no"}

    observe = knob_commit.observe

    def observed(opts: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = observe(opts)
        doc.update(unit_props={**active, "DropInPaths": "/etc/systemd/system/svc.service.d/x.conf"}, health=200)
        return doc

    monkeypatch.setattr(knob_commit, "observe", observed)
    rc, res = host.run("verify", after="restore")
    assert rc == 0 and res["verified"] is True and res["generation"] == 1
    assert [f["kind"] for f in res["findings"]] == ["dropin_present"]  # reported, not blocking
    rc, res = host.run("verify")
    assert rc == 1 and res["msg"] == (
        "generation 0001 does not verify: drop-in /etc/systemd/system/svc.service.d/x.conf changes the unit"
    )


def test_verify_of_an_unreadable_generation(host: Host) -> None:
    host.install()
    (host.state / "generations" / "0001" / "meta.json").write_text("{broken")
    rc, res = host.run("verify")
    assert rc == 1 and res["msg"].startswith("cannot verify: generation 0001: meta.json missing or unreadable (")


# --- a serve script that holds a secret ----------------------------------------------------------------------------

SECRET_SCRIPT = "#!/bin/bash\nexport HF_TOKEN=hunter2\nexec /usr/bin/engine\n"


@pytest.mark.parametrize(("user", "mode", "group"), [("root", 0o700, 0), ("nobody", 0o750, None), (None, 0o755, 0)])
def test_a_script_with_a_secret_is_readable_by_root_and_the_service_user_only(
    host: Host, user: str | None, mode: int, group: int | None
) -> None:
    rc, res = host.install(SECRET_SCRIPT if user else SCRIPT, service_user=user or "root")
    assert rc == 0
    st = host.script.stat()
    assert st.st_mode & 0o7777 == mode
    assert st.st_gid == (pwd.getpwnam("nobody").pw_gid if group is None else group)
    assert host.meta(1)["files"]["script"]["mode"] == mode
    assert "hunter2" not in json.dumps(res)


def test_a_secret_for_a_service_user_that_does_not_exist_is_refused(host: Host) -> None:
    rc, res = host.install(SECRET_SCRIPT, service_user="no-such-user-kf")
    assert rc == 1 and res["step"] == "commit"
    assert res["msg"] == (
        "the serve script holds a secret and must be readable by the service user 'no-such-user-kf', which does "
        "not exist on this host; create it or fix knob_serve_user"
    )
    assert not host.script.exists()


# --- validation of staged files with the host's own tools ----------------------------------------------------------


class Module:
    def fail_json(self, **result: Any) -> None:
        raise AssertionError(result["msg"])


@pytest.mark.parametrize(
    ("unit", "problem"),
    [
        ("[Service]\nExecStart=/bin/true\n", None),
        ("[Service]\nExecStart={script}\n", None),  # the script is about to be installed: not a problem
        ("[Service]\nType=simple\n", "systemd-analyze verify rejected the staged unit: "),
        ("[Service]\nExecStart=/no/such/engine\n", "systemd-analyze verify rejected the staged unit: "),
    ],
)
def test_a_staged_unit_is_verified_by_systemd(tmp_path: Path, unit: str, problem: str | None) -> None:
    validate = VALIDATE  # the real one, not the fixture's
    script = tmp_path / "missing-serve.sh"
    staged = tmp_path / "svc.service"
    staged.write_text(unit.format(script=script))
    if problem is None:
        validate(Module(), "unit", str(staged), str(script))
    else:
        with pytest.raises(AssertionError, match="^" + problem):
            validate(Module(), "unit", str(staged), str(script))


def test_the_lock_file_is_private(host: Host) -> None:
    host.install()
    assert os.stat(host.state / "lock").st_mode & 0o777 == 0o600
