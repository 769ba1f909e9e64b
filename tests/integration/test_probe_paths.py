"""Two of the probe's paths on a real lab host.

The direct reader of unit properties (module_utils/knob_sdbus.py) against real systemd:
through a sequence of unit states, what it reads over systemd's private socket equals, key for key and in the
same order, what ``systemctl show`` prints, or it says it is unsure (then the probe runs systemctl). Only a
drop-in whose name has a space may make it unsure here; every other state must be read directly.

``drift --watch``: one kept interpreter per host for the whole watch, answers that see a change made between
rounds, and nothing left running on the host once the watch ends."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_observe
from tests.integration.conftest import Fleet, boot_fleet, touch_later_sh, wait_until

SDBUS = Path(knob_observe.__file__).with_name("knob_sdbus.py")
ENGINE = "sglang-dsv4-decode.service"
UNIT = "kf-sdbus.service"
FAILING = "kf-sdbus-fail.service"
D = f"/etc/systemd/system/{UNIT}.d"

COMPARE = """
import json, subprocess, sys
ns = {"__name__": "knob_sdbus"}
exec(compile(SOURCE, "knob_sdbus", "exec"), ns)
props = tuple(sys.argv[1].split(","))
out = []
for unit in sys.argv[2:]:
    try:
        direct = [list(kv) for kv in ns["unit_properties"](unit, props).items()]
    except ns["Unsure"] as exc:
        direct = "unsure: %s" % exc
    shown = subprocess.run(["systemctl", "show", unit, "--property=" + sys.argv[1]], capture_output=True,
                           text=True, check=True).stdout
    out.append({"unit": unit, "direct": direct, "systemctl": [l.split("=", 1) for l in shown.splitlines() if "=" in l]})
print(json.dumps(out))
"""

# (step, shell run on the host first, units compared after it, units allowed to be unsure, environment)
STEPS: list[tuple[str, str, list[str], set[str], str]] = [
    ("the engine, running", "true", [ENGINE, "nosuch.service"], set(), ""),
    (
        "a unit started",
        f"printf '[Service]\\nExecStart=/bin/sleep 600\\n' > /etc/systemd/system/{UNIT} && systemctl daemon-reload"
        f" && systemctl start {UNIT}",
        [UNIT],
        set(),
        "",
    ),
    ("its start time in another zone", "true", [UNIT, ENGINE], set(), "TZ=KFT-5:30"),
    (
        "a drop-in and an edit, not reloaded",
        f"mkdir -p {D} && printf '[Service]\\nEnvironment=A=1\\n' > {D}/10-a.conf"
        f" && echo '# edited' >> /etc/systemd/system/{UNIT}",
        [UNIT],
        set(),
        "",
    ),
    ("reloaded", "systemctl daemon-reload", [UNIT], set(), ""),
    ("stopped", f"systemctl stop {UNIT}", [UNIT], set(), ""),
    (
        "failing until its start limit",
        "printf '[Service]\\nExecStart=/bin/false\\nRestart=always\\nRestartSec=50ms\\n'"
        f" > /etc/systemd/system/{FAILING}"
        f" && systemctl daemon-reload && systemctl start {FAILING};"
        f" for i in $(seq 100); do systemctl is-failed -q {FAILING} && break; sleep 0.1; done;"
        f" systemctl is-failed -q {FAILING}",
        [FAILING],
        set(),
        "",
    ),
    (
        "a drop-in whose name has a space",
        f"printf '[Service]\\nEnvironment=B=2\\n' > '{D}/20 b.conf' && systemctl daemon-reload",
        [UNIT],
        {UNIT},
        "",
    ),
]


@pytest.fixture(scope="module")
def one(lab_state: Path) -> Iterator[Fleet]:
    f = boot_fleet(lab_state, 1)
    yield f
    f.lab.down()


def test_direct_reads_equal_systemctl_show_through_unit_states(one: Fleet) -> None:
    source = SDBUS.read_text(encoding="utf-8")
    program = f"SOURCE = {source!r}\n{COMPARE}"
    encoded = base64.b64encode(program.encode()).decode()
    props = ",".join(knob_observe.PROPS)
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for step, shell, units, may_be_unsure, env in STEPS:
        one.ssh("lab1", shell)
        got = one.ssh(
            "lab1", f'{env} python3 -I -S -c "$(echo {encoded} | base64 -d)" {props} {" ".join(units)}'
        ).stdout
        for case in json.loads(got):
            unit, direct, shown = case["unit"], case["direct"], case["systemctl"]
            assert [k for k, _ in shown] == list(knob_observe.PROPS), f"{step}: systemctl printed {shown}"
            if isinstance(direct, str):
                assert unit in may_be_unsure, f"{step}: {unit}: the direct reader was {direct}"
            else:
                assert direct == shown, f"{step}: {unit}: direct {direct} != systemctl {shown}"
            seen[(step, unit)] = dict(shown)
    # the states really were the ones named (the comparison above is not between two empty answers)
    assert seen[("the engine, running", ENGINE)]["ActiveState"] == "active"
    assert seen[("the engine, running", "nosuch.service")]["FragmentPath"] == ""
    assert seen[("its start time in another zone", UNIT)]["ExecMainStartTimestamp"].endswith(" KFT")
    assert seen[("a drop-in and an edit, not reloaded", UNIT)]["NeedDaemonReload"] == "yes"
    assert seen[("reloaded", UNIT)]["DropInPaths"] == f"{D}/10-a.conf"
    assert seen[("stopped", UNIT)]["ActiveState"] == "inactive"
    failed = seen[("failing until its start limit", FAILING)]
    assert (failed["ActiveState"], failed["ExecMainStatus"]) == ("failed", "1") and failed["NRestarts"] != "0"
    assert " " in seen[("a drop-in whose name has a space", UNIT)]["DropInPaths"]
    one.ssh("lab1", f"systemctl stop {UNIT} {FAILING}; systemctl reset-failed {FAILING}", check=False)


# --- drift --watch: one kept interpreter per host, fresh answers every round ---------------------------------------

SCRIPT = "/root/serve_dsv4_decode.sh"
# the host's kept interpreters (probecache.command: python3 -I -S -c TEXT ROOT DIGEST knob_probe probe ARGS serve S)
SESSION = "pgrep -fc '^/usr/bin/python3 -I -S -c .* knob_probe probe .* serve [0-9.]+$' || true"


def test_a_watch_keeps_one_interpreter_per_host_and_sees_a_change_between_rounds(one: Fleet) -> None:
    one.knobfleet("apply", "ctas512", "--yes", check=True)
    argv = [sys.executable, "-m", "knobfleet", "drift", "-i", str(one.inventory), "--watch", "3", "--rounds", "4"]
    proc = subprocess.Popen([*argv, "--json-lines"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    summaries, kept = [], []
    try:
        for line in proc.stdout:
            doc = json.loads(line)
            if "summary" not in doc:
                continue
            summaries.append(doc["summary"])
            if len(summaries) == 1:  # between rounds 1 and 2: the script is edited on the host, not restarted
                one.ssh("lab1", f"sed -i 's/TARGET_CTAS=512/TARGET_CTAS=768/' {SCRIPT} && {touch_later_sh(SCRIPT)}")
            kept.append(one.ssh("lab1", SESSION).stdout.strip())
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [s["round"] for s in summaries] == [1, 2, 3, 4]
    # rounds 3 s apart (at 1 s, two ssh logins on a loaded machine could miss round 3): the edit lands before or
    # while round 2 runs, so it is seen by round 3 at the latest, and stays seen
    drifted = [s["drift"] for s in summaries]
    assert summaries[0]["in_sync"] == 1 and drifted[2:] == [1, 1] and drifted == sorted(drifted), summaries
    assert rc == 2  # the last round's exit code: drift
    # one interpreter on the host while the watch goes on (after the last round it may already be ending)
    assert kept[:3] == ["1", "1", "1"] and kept[3] in ("0", "1"), f"host interpreters kept per round: {kept}"
    wait_until(lambda: one.ssh("lab1", SESSION).stdout.strip() == "0", 10, "the kept interpreter to end with the watch")
    one.knobfleet("apply", "ctas512", "--yes", check=True)  # repaired: the host is as the profile says again
    assert one.knobfleet("drift").returncode == 0


def test_a_one_shot_read_asks_through_the_control_master_as_ssh_would(one: Fleet) -> None:
    """The head start's sessions through the host's real ControlMaster (knobfleet.sshmux): the record names the
    socket ``ssh -G`` gave; a session there answers as the ssh client does (stdout, stderr, exit status, the LANG
    SendEnv passes); a killed one ends at once; and a drift that went this way reports what one that started ssh
    clients reports."""
    import marshal
    import os
    import stat
    import time

    from knobfleet import headstart, sshmux

    one.knobfleet("apply", "ctas512", "--yes", check=True)
    args = ["drift", "--json", *(["-i", str(one.inventory)] if one.inventory is not None else [])]
    one.knobfleet("drift", "--json")  # writes the record, with what ssh -G said
    through = one.knobfleet("drift", "--json")  # its head start goes through the master
    plain = subprocess.run([sys.executable, "-m", "knobfleet", *args], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "KNOBFLEET_HEADSTART": "0"})  # fmt: skip
    assert through.returncode == plain.returncode == 0, through.stderr + plain.stderr
    assert json.loads(through.stdout)["hosts"] == json.loads(plain.stdout)["hosts"]

    key = headstart.recall_key(args, os.getcwd(), os.environ)
    raw = headstart._read_record(os.path.join(headstart.folder(), f"recall-{key}"))
    assert raw is not None, "drift wrote no head start record"
    rec = marshal.loads(raw)
    (pair,) = rec["pairs"]
    path, send, setenv = rec["mux"]["lab1"]
    assert stat.S_ISSOCK(os.stat(path).st_mode), f"{path}: not the master's socket"

    cmd = 'cat; echo err >&2; printf %s "$LANG" >&2; exit 3'
    env = {**os.environ, "LANG": "C.UTF-8"}
    mux = sshmux.Passenger(path, cmd, sshmux.environment(send, setenv, env), b"hi", [*pair[1][:-1], cmd])
    got = (*mux.communicate(timeout=30), mux.returncode)
    client = subprocess.run([*pair[1][:-1], cmd], input=b"hi", capture_output=True, timeout=30, env=env)
    assert got == (client.stdout, client.stderr, client.returncode) == (b"hi", b"err\nC.UTF-8", 3)

    # output that comes after the exit status (sshd forwards it when the command exits, and reads on to EOF): ssh
    # prints it, so a passenger must read on until the master hangs up
    late = "(sleep 0.5; head -c 100000 /dev/zero) & exit 0"
    bulk = sshmux.Passenger(path, late, [], b"", ["ssh", late])
    out, _err = bulk.communicate(timeout=30)
    client = subprocess.run([*pair[1][:-1], late], capture_output=True, timeout=30)
    assert (len(out), bulk.returncode) == (len(client.stdout), client.returncode) == (100000, 0)

    sleeper = sshmux.Passenger(path, "sleep 20", [], b"", ["ssh", "sleep 20"])
    started = time.monotonic()
    sleeper.kill()
    assert sleeper.communicate(timeout=10) == (b"", b"") and sleeper.returncode == sshmux.KILLED
    assert time.monotonic() - started < 5
