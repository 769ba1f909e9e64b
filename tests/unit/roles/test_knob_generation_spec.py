"""knob_generation's argument spec as Ansible applies it (``main()`` with Ansible's real AnsibleModule): the
options every step gets when the role leaves them out, the choices, and which options each action requires.

A recording handler stands in for the action, so what is checked is exactly the ``p`` a step would see. The
module is the one tests/unit/roles/test_knob_generation.py loads (``knob_role_knob_generation``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.module_utils import basic

from knobfleet.module_utils import knob_txn
from tests.unit.roles.test_knob_generation import kg

BASE = {"state_dir": "/var/lib/knobfleet/svc", "run_id": "run-1"}
DEFAULTS: dict[str, Any] = {
    "after": "apply",
    "script_path": None,
    "unit_path": None,
    "script_content": None,
    "unit_content": None,
    "operator": "unknown",
    "controller": "",
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
    "secret_key": "",
    "service_user": "root",
    "foreign_dropins": "ignore",
    "health_url": "",
    "info_url": "",
    "allow_writable_script_dir": False,
}
ACTIONS = ["begin", "stage", "commit", "mark", "release", "restore", "verify", "install", "finish"]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def handler(module: Any, store: Any, p: dict[str, Any]) -> dict[str, Any]:
        calls.append({"p": dict(p), "check_mode": module.check_mode, "store": store.dir})
        return {"changed": False}

    for action in ACTIONS:
        monkeypatch.setitem(knob_txn.HANDLERS, action, handler)
    return calls


def run(capsys: pytest.CaptureFixture[str], **args: Any) -> tuple[int, dict[str, Any]]:
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        kg.main()
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out[out.index("{") :])
    return int(info.value.code or 0), result


def test_release_gets_every_default(capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]]) -> None:
    rc, res = run(capsys, action="release", **BASE)
    assert (rc, res["step"], res["changed"]) == (0, "release", False)
    (call,) = seen
    assert call["p"] == {"action": "release", **BASE, **DEFAULTS}
    assert call["store"] == "/var/lib/knobfleet/svc" and call["check_mode"] is False


def test_check_mode_is_supported(capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]]) -> None:
    rc, res = run(capsys, action="release", _ansible_check_mode=True, **BASE)
    assert rc == 0 and not res.get("skipped")
    assert seen[0]["check_mode"] is True


# (action, the options it needs besides state_dir and run_id)
NEEDS: dict[str, dict[str, Any]] = {
    "begin": {"script_path": "/s.sh", "unit_path": "/u.service"},
    "stage": {"script_path": "/s.sh", "unit_path": "/u.service", "script_content": "x", "unit_content": "y"},
    "install": {
        "script_path": "/s.sh",
        "unit_path": "/u.service",
        "script_content": "x",
        "unit_content": "y",
        "profile": {"name": "p"},
    },
    "finish": {"status": "good"},
    "commit": {"script_path": "/s.sh", "unit_path": "/u.service", "profile": {"name": "p"}},
    "mark": {"generation": 1, "status": "good"},
    "verify": {"script_path": "/s.sh", "unit_path": "/u.service"},
    "release": {},
    "restore": {},
}


@pytest.mark.parametrize("action", sorted(NEEDS))
def test_each_action_runs_with_what_it_needs(
    capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]], action: str
) -> None:
    rc, res = run(capsys, action=action, **BASE, **NEEDS[action])
    assert rc == 0, res
    assert seen[0]["p"]["action"] == action and res["step"] == action


@pytest.mark.parametrize(("action", "left_out"), [(a, k) for a, needs in sorted(NEEDS.items()) for k in sorted(needs)])
def test_each_action_refuses_to_run_without_an_option_it_needs(
    capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]], action: str, left_out: str
) -> None:
    args = {k: v for k, v in NEEDS[action].items() if k != left_out}
    rc, res = run(capsys, action=action, **BASE, **args)
    assert rc == 1 and seen == []
    assert f"action is {action} but all of the following are missing: " in res["msg"]
    assert left_out in res["msg"].rsplit(": ", 1)[1].split(", ")


@pytest.mark.parametrize(
    ("option", "good", "bad"),
    [
        ("action", ACTIONS, "apply"),
        ("after", ["apply", "restore"], "rollback"),
        ("status", ["good", "failed", "rolled-back"], "bad"),
        ("leave_status", ["failed", "rolled-back", ""], "good"),
        ("event", ["rollback", "restore"], "apply"),
        ("foreign_dropins", ["fail", "remove", "ignore"], "keep"),
    ],
)
def test_choices(
    capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]], option: str, good: list[str], bad: str
) -> None:
    base = {"action": "release", **BASE, **NEEDS["finish"], **NEEDS["mark"], **NEEDS["stage"], "profile": {"n": 1}}
    for value in good:
        rc, res = run(capsys, **{**base, option: value})
        assert rc == 0, res
        assert seen[-1]["p"][option] == value
    n = len(seen)
    rc, res = run(capsys, **{**base, option: bad})
    assert rc == 1 and len(seen) == n
    assert f"value of {option} must be one of: {', '.join(good)}, got: {bad}" in res["msg"]


@pytest.mark.parametrize(
    ("option", "given", "expected"),
    [
        ("generation", "7", 7),
        ("keep", "3", 3),
        ("break_lock", "yes", True),
        ("secret", "A,B", ["A", "B"]),
        ("state_dir", "$KF_SPEC_ROOT/state", "/srv/spec/state"),
        ("script_path", "$KF_SPEC_ROOT/serve.sh", "/srv/spec/serve.sh"),
        ("unit_path", "$KF_SPEC_ROOT/u.service", "/srv/spec/u.service"),
    ],
)
def test_types(
    capsys: pytest.CaptureFixture[str],
    seen: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    option: str,
    given: str,
    expected: object,
) -> None:
    monkeypatch.setenv("KF_SPEC_ROOT", "/srv/spec")
    rc, res = run(capsys, **{"action": "release", **BASE, option: given})
    assert rc == 0, res
    assert seen[0]["p"][option] == expected


def test_the_script_content_is_never_logged(capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]]) -> None:
    """script_content may hold secrets: no_log keeps its value out of the result's invocation and logs."""
    secret = "export HF_TOKEN=hf_verysecretvalue\n"
    rc, res = run(capsys, **{"action": "stage", **BASE, **NEEDS["stage"], "script_content": secret})
    assert rc == 0
    assert "hf_verysecretvalue" not in json.dumps(res)
    assert res["invocation"]["module_args"]["script_content"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_an_os_error_in_a_step_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(module: Any, store: Any, p: dict[str, Any]) -> dict[str, Any]:
        raise PermissionError(13, "Permission denied", "/var/lib/knobfleet/svc/lock")

    monkeypatch.setitem(knob_txn.HANDLERS, "release", broken)
    rc, res = run(capsys, action="release", **BASE)
    assert rc == 1
    assert res["msg"] == (
        "release failed: /var/lib/knobfleet/svc/lock: Permission denied; this step's changes were undone"
    )
    assert (res["step"], res["errno"]) == ("release", 13)


def test_an_os_error_without_a_file_names_the_state_dir(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(module: Any, store: Any, p: dict[str, Any]) -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(knob_txn.HANDLERS, "release", broken)
    rc, res = run(capsys, action="release", **BASE)
    assert rc == 1 and res["msg"] == (
        "release failed: /var/lib/knobfleet/svc: No space left on device; this step's changes were undone"
    )
