"""The SSH fast path: argv parity with Ansible's ssh plugin, quoting, outcomes, speculative starts.

Processes are real: a stand-in ``ansible_ssh_executable`` runs the remote command with the local bash,
so everything but the network is exercised (the lab tests cover the network)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet import paths
from knobfleet.fleet import ansible_cfg
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports import base
from knobfleet.fleet.transports import ssh as transport
from knobfleet.fleet.transports.sshcalls import ssh_argv
from knobfleet.fleet.transports.sshrun import FunctionRun

CP = Path("/run/kf-cp")


def hv(host: str = "h1", **conn: str) -> HostVars:
    return HostVars(host=host, address=conn.get("ansible_host", host), connection=conn)


@pytest.mark.parametrize(
    ("conn", "expected_tail"),
    [
        ({}, ["-o", "ConnectTimeout=15", "-o", f"ControlPath={CP}/%C", "h1"]),
        (
            {"ansible_host": "127.0.1.7", "ansible_port": "2222", "ansible_user": "ops"},
            ["-o", "Port=2222", "-o", "User=ops", "-o", "ConnectTimeout=15", "-o", f"ControlPath={CP}/%C", "127.0.1.7"],
        ),
        (
            {"ansible_ssh_private_key_file": "/k/id", "ansible_ssh_common_args": "-o 'ProxyJump=a b' -o X=1"},
            [
                "-o",
                'IdentityFile="/k/id"',
                "-o",
                "ConnectTimeout=15",
                "-o",
                f"ControlPath={CP}/%C",
                "-o",
                "ProxyJump=a b",
                "-o",
                "X=1",
                "h1",
            ],
        ),
        (
            {"ansible_ssh_user": "legacy", "ansible_ssh_port": "22", "ansible_ssh_extra_args": "-4"},
            ["-o", "Port=22", "-o", "User=legacy", "-o", "ConnectTimeout=15", "-o", f"ControlPath={CP}/%C", "-4", "h1"],
        ),
    ],
)
def test_ssh_argv_mirrors_ansible(conn: dict[str, str], expected_tail: list[str]) -> None:
    argv = ssh_argv(hv(**conn), CP)
    assert argv[0] == "ssh"
    assert argv[1:7] == list(ansible_cfg.SSH_ARGS)
    assert argv[9:11] == ["-o", "BatchMode=yes"]  # never a password prompt
    assert argv[-len(expected_tail) :] == expected_tail


def test_ssh_argv_overrides() -> None:
    argv = ssh_argv(
        hv(ansible_ssh_executable="/opt/ssh", ansible_ssh_args="-o ControlMaster=no", ansible_private_key_file="~/k"),
        CP,
    )
    assert argv[:3] == ["/opt/ssh", "-o", "ControlMaster=no"]
    assert f'IdentityFile="{os.path.expanduser("~/k")}"' in argv


@pytest.mark.parametrize(
    ("conn", "reason"),
    [
        ({}, None),
        ({"ansible_connection": "ssh"}, None),
        ({"ansible_connection": "local"}, "h1: ansible_connection=local"),
        ({"ansible_connection": "community.docker.docker"}, "h1: ansible_connection=community.docker.docker"),
        ({"ansible_password": "<set>"}, "h1: password authentication"),
        ({"ansible_become": "True"}, "h1: ansible_become"),
        ({"ansible_become": "false"}, None),
    ],
)
def test_ineligible(conn: dict[str, str], reason: str | None) -> None:
    assert transport.ineligible(hv(**conn)) == reason


@pytest.mark.parametrize(
    ("rc", "out", "err", "expected"),
    [
        (255, b"", b"debug\nssh: connect to host 127.0.1.9 port 22: Connection refused\n", "unreachable: ssh: connect"),
        (255, b"", b"", "unreachable: ssh exited 255"),
        (127, b"", b"bash: /usr/bin/python3: No such file", "error: /usr/bin/python3 not found on the host"),
        (1, b"", b"Traceback\nKeyError: 'x'\n", "error: the module failed on the host (exit 1): KeyError: 'x'"),
        (0, b"<html>", b"", "error: the module printed no JSON document: b'<html>'"),
    ],
)
def test_interpret_failures(rc: int, out: bytes, err: bytes, expected: str) -> None:
    o = base.interpret("h1", rc, out, err, "/usr/bin/python3")
    assert o.doc is None and o.error is not None and str(o.error).startswith(expected)
    assert o.missing_python == (rc == 127)


def test_interpret_document() -> None:
    assert base.interpret("h1", 0, b'{"a": [1]}', b"", "python3").doc == {"a": [1]}


SOURCE = b"""
import os
def echo(args):
    return {"args": args, "pid": os.getpid()}
def boom(args):
    raise RuntimeError("probe exploded")
"""
MODULE = base.bundle(SOURCE, paths.module_utils_dir())  # what the fast path writes to ssh's stdin


@pytest.fixture
def fake_ssh(tmp_path: Path) -> Path:
    """An ``ssh`` that ignores its options and runs the remote command with the local bash."""
    exe = tmp_path / "fake-ssh"
    exe.write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def local_hosts(fake_ssh: Path, n: int = 3) -> list[HostVars]:
    py = os.path.realpath(sys.executable)
    return [hv(f"h{i}", ansible_ssh_executable=str(fake_ssh), ansible_python_interpreter=py) for i in range(1, n + 1)]


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.dictionaries(TEXT, st.one_of(TEXT, st.integers(), st.booleans(), st.none()), max_size=5))
def test_arguments_survive_the_remote_shell(fake_ssh: Path, tmp_path: Path, args: dict[str, Any]) -> None:
    (h,) = local_hosts(fake_ssh, 1)
    out = transport.run_function([h], FunctionRun(tmp_path / "cp", MODULE, "m", "echo", {"h1": args}))
    assert out["h1"].error is None and out["h1"].doc["args"] == args


def test_module_errors_and_missing_interpreter(fake_ssh: Path, tmp_path: Path) -> None:
    h1, h2 = local_hosts(fake_ssh, 2)
    h2 = hv("h2", ansible_ssh_executable=str(fake_ssh), ansible_python_interpreter="/nonexistent/python3")
    out = transport.run_function([h1, h2], FunctionRun(tmp_path / "cp", MODULE, "m", "boom", {"h1": {}, "h2": {}}))
    assert str(out["h1"].error) == "error: the module failed on the host (exit 1): RuntimeError: probe exploded"
    assert out["h2"].missing_python


def test_timeout_stops_the_process(tmp_path: Path, fake_ssh: Path) -> None:
    (h,) = local_hosts(fake_ssh, 1)
    slow = base.bundle(b"import time\ndef wait(a):\n    time.sleep(30)\n", paths.module_utils_dir())
    out = transport.run_function([h], FunctionRun(tmp_path / "cp", slow, "m", "wait", {"h1": {}}, timeout_s=0.5))
    assert str(out["h1"].error) == "error: no answer within 0.5 s; the ssh process was stopped"


def test_speculative_start_is_used_only_when_the_argv_matches(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    hosts = local_hosts(fake_ssh)
    args = {h.host: {"n": i} for i, h in enumerate(hosts)}
    cp = paths.control_dir()
    assert transport.start_planned("k", MODULE) == {}  # nothing saved yet
    first = transport.run_function(hosts, FunctionRun(cp, MODULE, "m", "echo", args, plan_key="k"))
    started = transport.start_planned("k", MODULE)
    assert sorted(started) == ["h1", "h2", "h3"]
    early_pids = {h: p.pid for h, (_argv, p) in started.items()}
    # h2's vars changed since the plan was saved: its early process is stopped and a new one started.
    args["h2"] = {"n": "changed"}
    second = transport.run_function(hosts, FunctionRun(cp, MODULE, "m", "echo", args, plan_key="k", started=started))
    assert [second[h].doc["args"] for h in ("h1", "h2", "h3")] == [{"n": 0}, {"n": "changed"}, {"n": 2}]
    assert started["h1"][1].returncode == 0 and started["h2"][1].returncode == -9  # killed, by its own PID
    # bash execs python, so the document's pid is the early process's own pid where it was used
    assert second["h1"].doc["pid"] == early_pids["h1"] and second["h2"].doc["pid"] != early_pids["h2"]
    assert first["h1"].doc["pid"] != second["h1"].doc["pid"]
    # a different module source never reuses the plan
    assert transport.start_planned("k", base.bundle(SOURCE + b"\n", paths.module_utils_dir())) == {}
    saved = json.loads(next((tmp_path / "state" / "cache" / "fastpath").glob("*.json")).read_text())
    assert [p["host"] for p in saved] == ["h1", "h2", "h3"]
    rest = transport.start_planned("k", MODULE)
    transport.run_function(hosts[:1], FunctionRun(cp, MODULE, "m", "echo", args, started=rest))
    assert all(p.returncode is not None for _a, p in rest.values())  # unused ones stopped, none left running


def test_a_head_start_session_the_master_refuses_is_asked_again_by_an_ssh_client(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``ssh`` makes its own connection when its master will not open a session (sshd's MaxSessions), a
    head start's ``sshmux.Passenger`` refused so is not the host's answer: an ssh client is started for it."""
    from knobfleet import sshmux
    from tests.unit.test_sshmux import Master, refuse

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    hosts = local_hosts(fake_ssh, 1)
    args = {"h1": {"n": 1}}
    cp = paths.control_dir()
    transport.run_function(hosts, FunctionRun(cp, MODULE, "m", "echo", args, plan_key="k"))
    ((argv, planned),) = transport.start_planned("k", MODULE).values()
    planned.communicate(timeout=30)
    master = Master(tmp_path / "master", refuse, opens=False)
    refused = sshmux.Passenger(str(tmp_path / "master"), argv[-1], [], MODULE, argv)
    out = transport.run_function(hosts, FunctionRun(cp, MODULE, "m", "echo", args, started={"h1": (argv, refused)}))
    assert refused.refused and out["h1"].error is None and out["h1"].doc["args"] == {"n": 1}
    master.thread.join(5)
    assert [command for command, _env in master.seen] == [argv[-1]]


def test_a_missing_ssh_executable_is_reported_per_host(tmp_path: Path, fake_ssh: Path) -> None:
    good = local_hosts(fake_ssh, 1)[0]
    bad = hv("h2", ansible_ssh_executable=str(tmp_path / "no-such-ssh"))
    out = transport.run_function([good, bad], FunctionRun(tmp_path / "cp", MODULE, "m", "echo", {"h1": {}, "h2": {}}))
    assert out["h1"].doc["args"] == {}
    assert str(out["h2"].error) == f"error: cannot run {tmp_path}/no-such-ssh: No such file or directory"


def test_the_bundle_carries_the_module_utils_a_module_imports(fake_ssh: Path, tmp_path: Path) -> None:
    (h,) = local_hosts(fake_ssh, 1)
    source = (
        b"from ansible.module_utils.knob_live import script_env_argv\ndef f(a):\n    return script_env_argv(a['s'])\n"
    )
    payload = base.bundle(source, paths.module_utils_dir())
    # knob_live imports knob_redact (which imports knob_lean and the lexer, knob_shell), knob_rules (the rule's
    # table), knob_running (which imports knob_argv, the argv reader) and knob_runtime (the run line's reader, which
    # reads a container's processes with knob_procfs): shipped with it, each after what it imports
    want = ["knob_lean", "knob_shell", "knob_redact", "knob_rules", "knob_argv", "knob_running", "knob_procfs",
            "knob_runtime", "knob_live"]  # fmt: skip
    assert [n for n, _src in json.loads(payload)["utils"]] == want
    out = transport.run_function(
        [h], FunctionRun(tmp_path / "cp", payload, "m", "f", {"h1": {"s": "export A=1\nexec x\n"}})
    )
    assert out["h1"].doc == [{"A": "1"}, ["x"]]


GATED = b"""
import os, time
def gated(a):
    # count the hosts running at once; a "wait" host waits for the "open" host's flag (bounded: 20 s)
    run = a["dir"] + "/running"
    os.makedirs(run, exist_ok=True)
    me = os.path.join(run, a["name"])
    with open(me, "w") as fh:
        fh.write(str(os.getpid()))
    with open(a["dir"] + "/seen", "a") as fh:
        fh.write(f"{len(os.listdir(run))}\\n")
    for _ in range(2000 if a.get("peers") else 0):
        if len(os.listdir(run)) >= a["peers"]:
            break
        time.sleep(0.01)
    if a.get("wait"):
        for _ in range(2000):
            if os.path.exists(a["dir"] + "/flag"):
                break
            time.sleep(0.01)
    if a.get("open"):
        open(a["dir"] + "/flag", "w").close()
    os.unlink(me)
    return a["name"]
"""


def test_outcomes_stream_as_hosts_answer_and_a_slow_host_delays_only_itself(fake_ssh: Path, tmp_path: Path) -> None:
    """h1 waits until h4 has opened its gate: with 2 forks, h2, h3 and h4 go through the other slot while h1 waits.
    h4 and h1 then end together (h4 opens the gate as it answers), so their order is the processes' race."""
    hosts = local_hosts(fake_ssh, 4)
    d = str(tmp_path)
    args = {h.host: {"dir": d, "name": h.host} for h in hosts}
    args["h1"]["wait"] = True
    args["h4"]["open"] = True
    payload = base.bundle(GATED, paths.module_utils_dir())
    order = [
        o.host
        for o in transport.iter_function(hosts, FunctionRun(tmp_path / "cp", payload, "m", "gated", args, forks=2))
    ]
    assert order[:2] == ["h2", "h3"] and sorted(order[2:]) == ["h1", "h4"], order
    assert max(int(x) for x in (tmp_path / "seen").read_text().split()) <= 2  # never more than 2 at once


def test_run_function_keeps_the_hosts_order_and_one_fork_runs_one_at_a_time(fake_ssh: Path, tmp_path: Path) -> None:
    hosts = local_hosts(fake_ssh, 3)
    args = {h.host: {"dir": str(tmp_path), "name": h.host} for h in hosts}
    payload = base.bundle(GATED, paths.module_utils_dir())
    out = transport.run_function(hosts, FunctionRun(tmp_path / "cp", payload, "m", "gated", args, forks=1))
    assert list(out) == ["h1", "h2", "h3"] and [o.doc for o in out.values()] == ["h1", "h2", "h3"]
    assert (tmp_path / "seen").read_text().split() == ["1", "1", "1"]


def test_closing_the_stream_early_stops_what_runs(fake_ssh: Path, tmp_path: Path) -> None:
    hosts = local_hosts(fake_ssh, 3)
    args = {h.host: {"dir": str(tmp_path), "name": h.host, "wait": h.host != "h3"} for h in hosts}
    args["h3"]["peers"] = 3  # answers once h1 and h2 are running
    payload = base.bundle(GATED, paths.module_utils_dir())
    it = transport.iter_function(hosts, FunctionRun(tmp_path / "cp", payload, "m", "gated", args, forks=3))
    assert next(it).host == "h3"
    pids = [int(f.read_text()) for f in (tmp_path / "running").iterdir()]  # h1 and h2, waiting for a flag
    assert len(pids) == 2
    it.close()  # nobody writes the flag: they are killed (and reaped), not waited for
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_speculative_start_keeps_only_the_first_forks(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    hosts = local_hosts(fake_ssh, 3)
    args = {h.host: {} for h in hosts}
    transport.run_function(hosts, FunctionRun(paths.control_dir(), MODULE, "m", "echo", args, plan_key="k", forks=2))
    started = transport.start_planned("k", MODULE)
    assert sorted(started) == ["h1", "h2"]
    one = transport.start_planned("k", MODULE, limit=1)
    assert sorted(one) == ["h1"]
    for _argv, proc in one.values():  # reaped: no child outlives the test (a mutation run waits for its own)
        proc.communicate(timeout=30)
    transport.run_function(hosts, FunctionRun(paths.control_dir(), MODULE, "m", "echo", args, started=started))


@pytest.mark.parametrize(
    ("env", "cfg", "expected"),
    [
        ({}, None, 32),
        ({"KNOBFLEET_FORKS": "7"}, "forks = 50", 7),
        ({}, "forks = 50", 50),
        ({"ANSIBLE_FORKS": "9"}, None, 9),
    ],
)
def test_default_forks(
    env: dict[str, str], cfg: str | None, expected: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("KNOBFLEET_FORKS", "ANSIBLE_FORKS", "ANSIBLE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if cfg is not None:
        (tmp_path / "ansible.cfg").write_text(f"[defaults]\n{cfg}\n")
        monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "ansible.cfg"))
    else:
        monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "none.cfg"))
    assert base.default_forks() == expected


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_bad_forks_are_usage_errors(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet.errors import UsageError

    monkeypatch.setenv("KNOBFLEET_FORKS", bad)
    with pytest.raises(UsageError, match="KNOBFLEET_FORKS"):
        base.default_forks()
