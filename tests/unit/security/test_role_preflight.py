"""The shipped role validates what the controller validates: its preflight, run by real ansible-playbook (check
mode, connection local, one play over a table of hosts, each with one hostile input), refuses every input the
controller refuses, with the rule file both read (roles/knob_serve/vars/rules.json)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet import rules
from knobfleet.errors import InventoryError
from knobfleet.fleet.hostvars import from_inventory_vars

REPO = Path(__file__).resolve().parents[3]
PROFILE = {"name": "p", "version": 1, "hash": "sha256:0", "env": {"SGLANG_X": "1"}, "args": {"tp-size": "1"}}
ENGINE = {
    "launcher": ["/usr/bin/python3", "-m", "sglang.launch_server"],
    "fixed_args": ["--model-path={model}", "--host={host}", "--port={port}"],
    "reserved_flags": ["model-path", "host", "port"],
}

# host -> (its knob_serve_* vars, what the refusal names; None: accepted)
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "ok": ({}, None),
    "ok_loader_allowed": (
        {"knob_serve_profile": {**PROFILE, "env": {"LD_LIBRARY_PATH": "/opt/x"}, "allow_unknown": ["LD_LIBRARY_PATH"]}},
        None,
    ),
    "ok_host_loader": ({"knob_serve_host_env": {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}}, None),
    "user_newline": ({"knob_serve_user": "root\n"}, "knob_serve_user on user_newline"),
    "user_unit_line": ({"knob_serve_user": "root\nExecStartPre=/bin/sh"}, "knob_serve_user on user_unit_line"),
    "service_newline": ({"knob_serve_service": "eng\nExecStart=/x"}, "knob_serve_service on service_newline"),
    "script_dotdot": ({"knob_serve_script_path": "/root/../etc/passwd"}, "knob_serve_script_path on script_dotdot"),
    "script_newline": ({"knob_serve_script_path": "/root/serve.sh\n"}, "knob_serve_script_path on script_newline"),
    "listen_newline": ({"knob_serve_listen_host": "127.0.0.1\nx"}, "knob_serve_listen_host on listen_newline"),
    "port_bool": ({"knob_serve_port": True}, "knob_serve_port on port_bool"),
    "readiness_space": ({"knob_serve_readiness_path": "/health x"}, "knob_serve_readiness_path on readiness_space"),
    "host_env_inject": ({"knob_serve_host_env": {"X=1;touch /tmp/knobfleet-pwned": "1"}}, "X=1;touch"),
    "host_env_newline": ({"knob_serve_host_env": {"A\nB": "1"}}, "A\\nB"),
    "host_flag_dashes": ({"knob_serve_host_args": {"--x": "1"}}, "--x"),
    "host_flag_reserved": ({"knob_serve_host_args": {"port": "1"}}, "host flags the launch line sets"),
    "profile_env_newline": ({"knob_serve_profile": {**PROFILE, "env": {"SGLANG_X\n": "1"}}}, "SGLANG_X\\n"),
    "profile_loader": ({"knob_serve_profile": {**PROFILE, "env": {"LD_PRELOAD": "/tmp/x.so"}}}, "LD_PRELOAD"),
    "profile_bash_env": ({"knob_serve_profile": {**PROFILE, "env": {"BASH_ENV": "/tmp/x"}}}, "BASH_ENV"),
    "profile_python": ({"knob_serve_profile": {**PROFILE, "env": {"PYTHONSTARTUP": "/tmp/x"}}}, "PYTHONSTARTUP"),
    # issue 40: a unit the host needs (rules.json reserved_units), by name, by prefix, as an instance, with .service
    "service_ssh": ({"knob_serve_service": "ssh"}, 'knob_serve_service on service_ssh: "ssh" is a unit the host'),
    "service_sshd_suffix": ({"knob_serve_service": "sshd.service"}, "/etc/systemd/system/sshd.service over it"),
    "service_systemd": ({"knob_serve_service": "systemd-journald"}, "knob_serve_service on service_systemd"),
    "service_systemd_any": ({"knob_serve_service": "systemd-anything"}, "knob_serve_service on service_systemd_any"),
    "service_getty": ({"knob_serve_service": "getty@tty1"}, "knob_serve_service on service_getty"),
    "service_dbus_prefix": ({"knob_serve_service": "dbus-broker"}, "knob_serve_service on service_dbus_prefix"),
    "ok_service_like": ({"knob_serve_service": "sshd-engine-decode"}, None),  # only a prefix listed is one
    "host_env_uid": (
        {"knob_serve_host_env": {"EUID": "0"}},
        'bash will not let the serve script set (read-only; it would exit at start): ["EUID"]',
    ),
    "profile_env_uid": ({"knob_serve_profile": {**PROFILE, "env": {"UID": "0"}}}, '["UID"]'),
}


@pytest.fixture(scope="module")
def preflight_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One ansible-playbook run (check mode) of the role's preflight over every case; per host: failed, msg."""
    work = tmp_path_factory.mktemp("preflight")
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "knob_serve_profile": PROFILE,
            "knob_serve_engine": ENGINE,
            **overrides,
        }
        for name, (overrides, _) in CASES.items()
    }
    (work / "hosts.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    (work / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: knob_serve\n        tasks_from: preflight\n"
    )
    import ansible_runner

    (work / "pd").mkdir()
    bindir = str(Path(sys.executable).parent)  # ansible-runner starts the venv's ansible-playbook
    runner = ansible_runner.run(
        private_data_dir=str(work / "pd"),
        playbook=str(work / "play.yml"),
        inventory=str(work / "hosts.json"),
        cmdline=f"--check --forks {len(CASES)}",
        quiet=True,
        envvars={
            "PATH": f"{bindir}:{os.environ.get('PATH', '')}",
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_CONFIG": str(work / "none.cfg"),
            "ANSIBLE_HOME": str(work / "home"),
        },
        timeout=300,
    )
    out: dict[str, dict[str, Any]] = {name: {"failed": False, "msg": "", "ran": False} for name in CASES}
    for event in runner.events:
        data = event.get("event_data", {})
        host = data.get("host")
        if host not in out:
            continue
        out[host]["ran"] = True
        if event["event"] in ("runner_on_failed", "runner_item_on_failed", "runner_on_unreachable"):
            out[host]["failed"] = True
            out[host]["msg"] += str(data.get("res", {}).get("msg", "")) + "\n"
    return out


@pytest.mark.parametrize("host", sorted(CASES))
def test_the_role_refuses_what_the_controller_refuses(preflight_results: dict[str, dict[str, Any]], host: str) -> None:
    _, names = CASES[host]
    result = preflight_results[host]
    assert result["ran"], f"{host}: the play never ran on it"
    if names is None:
        assert not result["failed"], result["msg"]
    else:
        assert result["failed"], f"{host}: preflight accepted it"
        assert names in result["msg"], result["msg"]


@pytest.mark.parametrize(
    "host", [h for h, (o, n) in CASES.items() if n and "knob_serve_profile" not in o and h != "host_flag_reserved"]
)
def test_the_controller_refuses_the_same_host_vars(host: str) -> None:
    overrides, _ = CASES[host]
    with pytest.raises(InventoryError):
        from_inventory_vars(host, overrides, "inv")


def test_the_preflight_reads_the_rule_file_the_controller_reads() -> None:
    preflight = (REPO / "roles" / "knob_serve" / "tasks" / "preflight.yml").read_text()
    assert "file: rules.json" in preflight and "match_type='fullmatch'" in preflight
    assert " is match(" not in preflight and "$')" not in preflight  # `$` lets a trailing newline through
    assert rules.rules_file() == REPO / "roles" / "knob_serve" / "vars" / "rules.json"
    for name in rules.data()["patterns"]:
        used_by_role = f"rule: {name}" in preflight or f"patterns.{name}." in preflight or name == "engine_name"
        assert used_by_role, f"rule {name} is not checked by the role's preflight"
    for section in rules.data():  # the name lists too: loader_env, shell_reserved, reserved_units, any added later
        if section not in ("about", "patterns"):
            assert f"knob_serve_rules.{section}." in preflight, f"{section} is not checked by the role's preflight"
