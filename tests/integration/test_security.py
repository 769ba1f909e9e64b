"""Hostile hosts and secrets on the real lab: an unprivileged owner of the script's directory cannot make the
role overwrite another file, and a secret in the host env reaches the engine but no output, report or
artifact on the controller, and is readable on the host by root only."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import Fleet, addr, restart_sh

SVC = "sglang-dsv4-decode"
TOKEN = "hf_LabSecret_4f1c2e9d7a"


def _inventory(fleet: Fleet, tmp_path: Path, host: str, extra: dict[str, object]) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(fleet.inventory, inv)
    group = yaml.safe_load((inv / "group_vars" / "all" / "main.yml").read_text())
    merged = {k: v for k, v in extra.items()}
    if "knob_serve_host_env" in extra:
        merged["knob_serve_host_env"] = {**group["knob_serve_host_env"], **extra["knob_serve_host_env"]}  # type: ignore[dict-item]
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(merged))
    return inv


def kf(fleet: Fleet, inv: Path, *args: str) -> tuple[int, str]:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "knobfleet", *args, "-i", str(inv)], capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def controller_files(state: Path) -> list[Path]:
    """Every file under the state dir except the lab hosts' disks (lab/hosts/*: overlays of this machine's root,
    where other processes' /tmp comes and goes), which the walk never enters."""
    out = []
    for root, dirs, files in os.walk(state):
        if (Path(root) / "identity.json").is_file() or Path(root) == state / "lab":
            dirs[:] = [d for d in dirs if d != "hosts"]
        out += [Path(root) / f for f in files]
    return out


def test_a_secret_reaches_the_engine_and_nothing_else(fleet: Fleet, tmp_path: Path, lab_state: Path) -> None:
    inv = _inventory(fleet, tmp_path, "lab1", {"knob_serve_host_env": {"HF_TOKEN": TOKEN}})
    code, out = kf(fleet, inv, "apply", "ctas512", "--limit", "lab1", "--yes", "--json")
    assert code == 0, out
    outputs = [out]
    for args in (
        ("drift", "--limit", "lab1", "--json"),
        ("verify", "--limit", "lab1"),
        ("plan", "ctas768", "--limit", "lab1", "--json"),
        ("render", "ctas512", "--host", "lab1"),
        ("history", "--limit", "lab1", "--ledger", "20"),
    ):
        code, text = kf(fleet, inv, *args)
        outputs.append(text)
    assert kf(fleet, inv, "drift", "--limit", "lab1")[0] == 0  # compared by hash: in sync
    assert all(TOKEN not in text for text in outputs)
    assert "<secret hmac:" in outputs[4]
    # nothing the controller keeps holds it: run artifacts, caches, saved probes
    kf(fleet, inv, "drift", "--limit", "lab1", "--save-probes", str(tmp_path / "probes"))
    kept = controller_files(lab_state)
    for path in [*kept, *(tmp_path / "probes").rglob("*")]:
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert TOKEN.encode() not in path.read_bytes(), path
    # on the host: the engine has it, only root can read the script, no log or ledger line has it
    pid = fleet.ssh("lab1", f"systemctl show -p MainPID --value {SVC}").stdout.strip()
    assert f"HF_TOKEN={TOKEN}" in fleet.ssh("lab1", f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    assert fleet.ssh("lab1", "stat -c '%a %U' /root/serve_dsv4_decode.sh").stdout.split() == ["700", "root"]
    assert fleet.ssh("lab1", f"grep -rl {TOKEN} /var/lib/knobfleet/{SVC}/ledger.jsonl", check=False).returncode == 1
    fleet.knobfleet("apply", "ctas512", "--limit", "lab1", "--yes", check=True)


def test_the_owner_of_the_script_directory_cannot_redirect_roots_writes(fleet: Fleet, tmp_path: Path) -> None:
    host = "lab2"
    fleet.ssh(host, "id engine >/dev/null 2>&1 || useradd -m engine; install -d -o engine -g engine /srv/engine")
    inv = _inventory(
        fleet,
        tmp_path,
        host,
        # the engine user owns the directory: refused unless overridden (see the test after this one)
        {"knob_serve_script_path": "/srv/engine/serve.sh", "knob_serve_allow_writable_script_dir": True},
    )
    victim = "/etc/knobfleet-victim"
    fleet.ssh(host, f"echo root-only > {victim}")
    # The attacker pre-creates the temp names an older knobfleet used, and links the script path at the victim.
    fleet.ssh(
        host,
        f"su engine -s /bin/sh -c 'ln -s {victim} /srv/engine/.serve.sh.knobfleet-tmp; "
        f"ln -s {victim} /srv/engine/serve.sh'",
    )
    code, out = kf(fleet, inv, "apply", "ctas512", "--limit", host, "--yes")
    assert fleet.ssh(host, f"cat {victim}").stdout == "root-only\n"  # never written through a link
    assert code == 1 and "is a symlink" in out, out
    # Without the link the apply works and installs a root-owned regular file.
    fleet.ssh(host, "rm -f /srv/engine/serve.sh")
    code, out = kf(fleet, inv, "apply", "ctas512", "--limit", host, "--yes")
    assert code == 0, out
    assert fleet.ssh(host, "stat -c '%F %U %a' /srv/engine/serve.sh").stdout.strip() == "regular file root 755"
    assert fleet.ssh(host, f"cat {victim}").stdout == "root-only\n"
    fleet.ssh(host, f"rm -f {victim}")
    fleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True)


STATE = f"/var/lib/knobfleet/{SVC}"
SCRIPT = "/root/serve_dsv4_decode.sh"


def test_an_adopted_0700_script_comes_back_0700_after_rollback_to_0(fleet: Fleet) -> None:
    host = "lab3"  # not applied to by the tests above: its hand-written script is adopted here
    # A hand-written root-only (0700) script running before knobfleet arrives; its flags in --flag=value form
    # (reading space-separated flags of hand-written scripts is the argv class's).
    fleet.ssh(
        host,
        f"sed -i -e 's/--model-path /--model-path=/' -e 's/--host /--host=/' -e 's/--port /--port=/' "
        f"-e 's/--tp /--tp=/' {SCRIPT} && "
        f"chmod 0700 {SCRIPT} && {restart_sh(SVC, addr(host))}",
    )
    fleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True)
    assert fleet.ssh(host, f"stat -c '%a' {SCRIPT}").stdout.strip() == "755"
    meta = fleet.ssh(host, f"cat {STATE}/generations/0000/meta.json").stdout
    assert '"mode": 448' in meta  # 0700, recorded at adoption
    proc = fleet.knobfleet("rollback", "--to", "0", "--limit", host, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fleet.ssh(host, f"stat -c '%a %U %G' {SCRIPT}").stdout.split() == ["700", "root", "root"]
    drift = fleet.knobfleet("drift", "--limit", host)
    assert drift.returncode == 0, drift.stdout  # in sync, and truly: the adopted file, its mode, live again
    fleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True)


def test_a_fifo_at_the_ledger_neither_hangs_drift_nor_apply(fleet: Fleet) -> None:
    host = "lab3"
    fleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True)
    fleet.ssh(host, f"mv {STATE}/ledger.jsonl /root/ledger.keep && mkfifo -m 600 {STATE}/ledger.jsonl")
    try:
        drift = fleet.knobfleet("drift", "--limit", host, "--json", timeout=120)
        assert drift.returncode == 0, drift.stdout + drift.stderr
        apply = fleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", timeout=120)
        assert apply.returncode == 1 and "ledger.jsonl is a FIFO" in apply.stdout + apply.stderr
        assert fleet.ssh(host, f"test -e {STATE}/lock", check=False).returncode == 1  # never left held
    finally:
        fleet.ssh(host, f"rm -f {STATE}/ledger.jsonl && mv /root/ledger.keep {STATE}/ledger.jsonl")
    fleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", check=True)


def test_a_hard_link_at_the_script_path_is_refused_shipped_nowhere_and_the_lock_released(
    fleet: Fleet, tmp_path: Path
) -> None:
    host, svc = "lab2", "kf-hardlink"
    secret = "root-only-line-5b1e0c"
    fleet.ssh(host, f"umask 077; echo {secret} > /root/kf-secret && ln -f /root/kf-secret /root/kf-hl.sh")
    inv = _inventory(fleet, tmp_path, host, {"knob_serve_service": svc, "knob_serve_script_path": "/root/kf-hl.sh"})
    try:
        for args in (("plan", "ctas512", "--limit", host), ("apply", "ctas512", "--limit", host, "--yes")):
            code, out = kf(fleet, inv, *args)
            assert secret not in out
        assert code == 1 and "cannot adopt /root/kf-hl.sh" in out and "has 2 hard links" in out, out
        assert fleet.ssh(host, f"test -e /var/lib/knobfleet/{svc}/lock", check=False).returncode == 1
        assert fleet.ssh(host, f"ls /var/lib/knobfleet/{svc}/generations", check=False).stdout.strip() == ""
    finally:
        fleet.ssh(host, f"rm -rf /root/kf-secret /root/kf-hl.sh /var/lib/knobfleet/{svc}")


def test_a_script_dir_another_user_can_write_is_refused_for_root(fleet: Fleet, tmp_path: Path) -> None:
    host = "lab2"
    fleet.ssh(host, "install -d -m 0777 /srv/kf-open")
    inv = _inventory(fleet, tmp_path, host, {"knob_serve_script_path": "/srv/kf-open/serve.sh"})
    try:
        code, out = kf(fleet, inv, "apply", "ctas512", "--limit", host, "--yes")
        assert code == 1 and "/srv/kf-open" in out and "knob_serve_allow_writable_script_dir" in out, out
        assert fleet.ssh(host, f"test -e {STATE}/lock", check=False).returncode == 1
    finally:
        fleet.ssh(host, "rm -rf /srv/kf-open")


# A launch-flag secret with a line separator in it, from host vars (issue 24): the apply succeeds (the live rule
# compares markers with markers, the engine's masked report is not compared), and no output, controller file or
# host record holds the key or any line of it.
API_KEY = "sk-LabApiKey-9c1e\u2028second-line-5b2a\x0bthird-part-77d3"
HF_MULTI = "hf_first-3e8a\fhf_second-0c4d"


def _pieces(*secrets: str) -> list[str]:
    return [piece for s in secrets for piece in [s, *s.splitlines()] if piece.strip()]


def test_a_secret_launch_flag_from_host_vars_applies_and_shows_nowhere(
    fleet: Fleet, tmp_path: Path, lab_state: Path
) -> None:
    extra = {"knob_serve_host_args": {"api-key": API_KEY}, "knob_serve_host_env": {"HF_TOKEN": HF_MULTI}}
    inv = _inventory(fleet, tmp_path, "lab2", extra)
    code, out = kf(fleet, inv, "apply", "ctas512", "--limit", "lab2", "--yes", "--json")
    assert code == 0, out  # no false argv_mismatch between the engine's report and the command line
    outputs = [out]
    for args in (
        ("drift", "--limit", "lab2", "--json"),
        ("verify", "--limit", "lab2"),
        ("plan", "ctas768", "--limit", "lab2", "--json"),
        ("plan", "ctas768", "--limit", "lab2"),
        ("render", "ctas512", "--host", "lab2"),
        ("render", "ctas512", "--host", "lab2", "--what", "argv"),
        ("render", "ctas512", "--host", "lab2", "--json"),
        ("history", "--limit", "lab2", "--ledger", "20", "--json"),
        ("-vvvv", "apply", "ctas768", "--limit", "lab2", "--yes"),  # Ansible's -vvv output, a real change
    ):
        code, text = kf(fleet, inv, *args)
        assert code == 0 or args[0] == "plan", (args, text)
        outputs.append(text)
    assert kf(fleet, inv, "drift", "--limit", "lab2")[0] == 0  # compared by markers: in sync
    key = (lab_state / "secret.key").read_text().strip()
    for text in outputs:
        assert key not in text  # the marker key reaches hosts only as a no_log option
        for piece in _pieces(API_KEY, HF_MULTI):
            assert piece not in text, (piece, text[:2000])
    assert "--api-key=<secret hmac:" in outputs[6]
    # the engine got the key whole
    pid = fleet.ssh("lab2", f"systemctl show -p MainPID --value {SVC}").stdout.strip()
    cmdline = fleet.ssh("lab2", f"cat /proc/{pid}/cmdline | base64 -w0").stdout.strip()
    import base64

    assert f"--api-key={API_KEY}".encode() in base64.b64decode(cmdline).split(b"\0")
    # controller: run files (ansible-runner artifacts, vars files), caches
    for path in controller_files(lab_state):
        if path.is_file() and path.stat().st_size < 50_000_000:
            data = path.read_bytes()
            for piece in _pieces(API_KEY, HF_MULTI):
                assert piece.encode() not in data, (path, piece)
    # host: meta.json and the ledger never hold it; the stored scripts that do are root-only
    state = f"/var/lib/knobfleet/{SVC}"
    for piece in [line for s in (API_KEY, HF_MULTI) for line in s.splitlines()]:  # each line: ASCII, greppable
        found = fleet.ssh("lab2", f"grep -rlF -- {shlex.quote(piece)} {state} || true").stdout.split()
        # only the copies of the script itself: the staged one and each generation's (inside the 0700 dir)
        assert found and all(p.endswith(("/staging/serve.sh", "/serve_dsv4_decode.sh")) for p in found), found
    modes = fleet.ssh("lab2", f"stat -c '%a %U' {state} /root/serve_dsv4_decode.sh").stdout.split("\n")
    assert modes[0].split() == ["700", "root"] and modes[1].split() == ["700", "root"]
    fleet.knobfleet("apply", "ctas512", "--limit", "lab2", "--yes", check=True)


# Issue 56: what the new generation will execute is checked before the running engine is stopped. The guard reads
# the rendered serve script, so knob_serve_launcher and a pinned version's knob_serve_launchers entry (both end up
# as its exec line) meet the same check; tests/unit/roles/test_knob_guards_launcher.py covers every shape.
OPEN_LAUNCHERS = [
    ("a 0777 copy of python3", "install -d -m 0755 /srv/kfl && install -m 0777 /usr/bin/python3 /srv/kfl/py"),
    ("a symlink into a folder nobody owns", "install -d -o nobody /srv/kfl-n && install -m 0755 /usr/bin/python3 "
     "/srv/kfl-n/py && install -d -m 0755 /srv/kfl && ln -s /srv/kfl-n/py /srv/kfl/py"),
    ("a folder nobody owns on its path", "install -d -m 0755 -o nobody /srv/kfl && install -m 0755 /usr/bin/python3 "
     "/srv/kfl/py"),
]  # fmt: skip


def _engine(fleet: Fleet, host: str) -> str:
    return fleet.ssh(host, f"systemctl show -p MainPID --value {SVC}").stdout.strip()


@pytest.mark.parametrize(("case", "setup"), OPEN_LAUNCHERS, ids=[c[0] for c in OPEN_LAUNCHERS])
def test_a_launcher_another_user_can_change_is_refused_before_anything_stops(
    fleet: Fleet, tmp_path: Path, case: str, setup: str
) -> None:
    host = "lab3"
    fleet.ssh(host, setup)
    try:
        before = _engine(fleet, host)
        inv = _inventory(
            fleet, tmp_path, host, {"knob_serve_launcher": ["/srv/kfl/py", "-m", "sglang_sim.launch_server"]}
        )
        code, out = kf(fleet, inv, "apply", "ctas512", "--limit", host, "--yes")
        assert code == 1 and "launches /srv/kfl/py as root" in out and "any such user can run code as root" in out, out
        assert _engine(fleet, host) == before, case  # never stopped
        assert fleet.ssh(host, f"test -e {STATE}/lock", check=False).returncode == 1
    finally:
        fleet.ssh(host, "rm -rf /srv/kfl /srv/kfl-n")


def test_rollback_to_a_generation_whose_launcher_is_gone_is_refused_while_the_engine_serves(
    fleet: Fleet, tmp_path: Path
) -> None:
    host = "lab3"
    fleet.ssh(host, "install -d -m 0755 /opt/kf-gone && install -m 0755 /usr/bin/python3 /opt/kf-gone/python3")
    inv = _inventory(
        fleet, tmp_path, host, {"knob_serve_launcher": ["/opt/kf-gone/python3", "-m", "sglang_sim.launch_server"]}
    )
    code, out = kf(fleet, inv, "apply", "ctas512", "--limit", host, "--yes")
    assert code == 0, out
    pinned = int(fleet.ssh(host, f"readlink {STATE}/current").stdout.strip().rsplit("/", 1)[-1])
    fleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", check=True)  # the default launcher again
    fleet.ssh(host, "rm -rf /opt/kf-gone")  # the install of the earlier generation removed
    before = _engine(fleet, host)
    proc = fleet.knobfleet("rollback", "--to", str(pinned), "--limit", host, "--yes")
    out = proc.stdout + proc.stderr
    assert (
        proc.returncode != 0 and f"generation {pinned:04d} launches /opt/kf-gone/python3, which does not exist" in out
    )
    assert _engine(fleet, host) == before  # still the running engine, never stopped
    assert (
        fleet.ssh(host, f"curl -fs -o /dev/null http://{addr(host)}:30000/health_generate", check=False).returncode == 0
    )
    drift = json.loads(fleet.knobfleet("drift", "--json", "--limit", host).stdout)
    assert drift["hosts"][0]["profile"] == "ctas768" and drift["hosts"][0]["findings"] == [], drift
