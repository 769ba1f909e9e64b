"""The probe module (roles/knob_probe/library/knob_probe.py) as Ansible runs it: ``main()`` with Ansible's real
AnsibleModule, its arguments handed over as Ansible does. What reaches the observation (``observe``, faked here
to record its options) is exactly the argument spec's result: required options, defaults, types."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible.module_utils import basic

REPO = Path(__file__).resolve().parents[3]
REQUIRED = {
    "service": "svc",
    "script_path": "/opt/serving/serve.sh",
    "unit_path": "/etc/systemd/system/svc.service",
    "state_dir": "/var/lib/knobfleet/svc",
}


def load() -> ModuleType:
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


kp = load()


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def observe(p: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(p))
        return {"schema_version": 1, "service": p["service"]}

    monkeypatch.setattr(kp, "observe", observe)
    return seen


def run(capsys: pytest.CaptureFixture[str], **args: Any) -> tuple[int, dict[str, Any]]:
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        kp.main()
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out[out.index("{") :])
    return int(info.value.code or 0), result


def test_the_defaults_reach_the_observation(capsys: pytest.CaptureFixture[str], observed: list[dict[str, Any]]) -> None:
    rc, res = run(capsys, **REQUIRED)
    assert rc == 0
    assert (res["changed"], res["step"], res["probe"]) == (False, "probe", {"schema_version": 1, "service": "svc"})
    assert observed == [
        {
            **REQUIRED,
            "health_url": "",
            "info_url": "",
            "http_timeout_s": 2.0,
            "secret": [],
            "secret_key": "",
            "liveness_url": "",
            "liveness_timeout_s": 10.0,
            "version_file": "",
            "launcher": [],
            "packages": [],
        },
    ]
    assert isinstance(observed[0]["http_timeout_s"], float)
    assert isinstance(observed[0]["liveness_timeout_s"], float)


def test_given_options_are_converted_as_the_spec_says(
    capsys: pytest.CaptureFixture[str], observed: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_TEST_ROOT", "/srv/x")
    rc, res = run(
        capsys,
        service="svc",
        script_path="$KF_TEST_ROOT/serve.sh",
        unit_path="$KF_TEST_ROOT/u.service",
        state_dir="$KF_TEST_ROOT/state",
        health_url="http://127.0.0.1:30000/health",
        info_url="http://127.0.0.1:30000/get_server_info",
        http_timeout_s="3.5",
        secret="HF_TOKEN,API_KEY",
    )
    assert rc == 0, res
    (p,) = observed
    # type=path expands variables (a plain str would not); float and list are converted from Ansible's text
    assert (p["script_path"], p["unit_path"], p["state_dir"]) == (
        "/srv/x/serve.sh",
        "/srv/x/u.service",
        "/srv/x/state",
    )
    assert (p["health_url"], p["info_url"]) == (
        "http://127.0.0.1:30000/health",
        "http://127.0.0.1:30000/get_server_info",
    )
    assert p["http_timeout_s"] == 3.5 and p["secret"] == ["HF_TOKEN", "API_KEY"]


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_every_required_option_is_required(
    capsys: pytest.CaptureFixture[str], observed: list[dict[str, Any]], missing: str
) -> None:
    args = {k: v for k, v in REQUIRED.items() if k != missing}
    rc, res = run(capsys, **args)
    assert rc == 1 and res["failed"] is True
    assert res["msg"] == f"missing required arguments: {missing}"
    assert observed == []


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("http_timeout_s", "soon", "http_timeout_s"),
        ("secret", {"a": 1}, "secret"),
        ("bogus", "1", "Unsupported parameters"),
    ],
)
def test_bad_options_fail_before_anything_is_observed(
    capsys: pytest.CaptureFixture[str], observed: list[dict[str, Any]], option: str, value: object, message: str
) -> None:
    rc, res = run(capsys, **REQUIRED, **{option: value})
    assert rc == 1 and message in res["msg"]
    assert observed == []


def test_check_mode_observes_too(capsys: pytest.CaptureFixture[str], observed: list[dict[str, Any]]) -> None:
    """The probe changes nothing, so it supports check mode: ``--check`` runs still probe (not 'skipped')."""
    rc, res = run(capsys, **REQUIRED, _ansible_check_mode=True)
    assert rc == 0 and not res.get("skipped") and res["probe"]["service"] == "svc"
    assert len(observed) == 1


def test_probe_is_the_observation_of_its_options(observed: list[dict[str, Any]]) -> None:
    assert kp.probe({"service": "other"}) == {"schema_version": 1, "service": "other"}
    assert observed == [{"service": "other"}]
