"""knobfleet drift vs a plain parallel-ssh script reading the same files and /proc entries.

Both run against the same lab hosts with warm SSH connections (each path keeps its own
ControlMaster), interleaved, REPEATS times each per fleet size; prints medians and the ratio.
`knobfleet drift` picks the SSH fast path (the probe module over Ansible's connections, started by the entry
before the imports: knobfleet.headstart, each through its host's ControlMaster: knobfleet.sshmux); the same command
with KNOBFLEET_SSH_MUX=0 (the head start starts ssh clients), with KNOBFLEET_HEADSTART=0 (the probes started after
the imports) and with `--via ansible` (playbooks/probe.yml through ansible-runner) are timed alongside.
Usage: python perf/drift_vs_ssh.py [--sizes 3,8,16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import time
from typing import Any

from _lab import KNOBFLEET, boot, interleave, med, run, table

SCRIPT = "/root/serve_dsv4_decode.sh"
UNIT = "/etc/systemd/system/sglang-dsv4-decode.service"
STATE = "/var/lib/knobfleet/sglang-dsv4-decode"
# What an operator's script would read: both files and their hashes, unit state, the current
# generation's meta, and environ + cmdline + stat of every process of the unit (``remote`` adds the health URL).
READS = (
    f"sha256sum {SCRIPT} {UNIT}; cat {SCRIPT} {UNIT} {STATE}/current/meta.json; "
    "systemctl show sglang-dsv4-decode -p ActiveState,SubState,MainPID,NRestarts,NeedDaemonReload,DropInPaths,"
    "ControlGroup; cg=$(systemctl show -p ControlGroup --value sglang-dsv4-decode); "
    "for p in $(cat /sys/fs/cgroup/systemd$cg/cgroup.procs); do cat /proc/$p/environ /proc/$p/cmdline /proc/$p/stat; "
    "done; "
)


def remote(block: int) -> str:
    """The script's command: READS and the host's engine health check, in a lab whose addresses are 127.0.<block>.N
    (a host's hostname is lab<N> in every lab: the block comes from here, the host's number from there)."""
    return (
        f"{READS}curl -s -o /dev/null -w '%{{http_code}}' "
        f"http://127.0.{block}.$(hostname | tr -dc 0-9):30000/health_generate || true"
    )


def ssh_argv(lab: Any, i: int, control_dir: str, command: str) -> list[str]:
    """ssh to lab host i over a warm ControlMaster of this script's own (the baseline's connection)."""
    return [
        "ssh",
        "-i",
        str(lab.key),
        "-o",
        f"UserKnownHostsFile={lab.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={control_dir}/%h",
        "-o",
        "ControlPersist=300",
        f"root@{lab.host(i).address}",
        command,
    ]


def ssh_script(lab, n: int, control_dir: str) -> float:
    command = remote(lab.identity.block)
    argvs = [ssh_argv(lab, i, control_dir, command) for i in range(1, n + 1)]  # before the clock: reads a file

    def one(argv: list[str]) -> bytes:
        return subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(one, argvs))
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,8")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = []
    import sys
    import tempfile

    from _lab import REPO

    # as an installed wheel has them: with PYTHONDONTWRITEBYTECODE=1 (this environment) a changed module would be
    # compiled again by every command, and the timings would measure the compiler
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "python" / "knobfleet")], check=True)

    for n in [int(x) for x in args.sizes.split(",")]:
        lab, inv = boot(n)
        run([*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"])
        cdir = tempfile.mkdtemp(prefix="kf-ssh-")
        drift_cmd = [*KNOBFLEET, "drift", "--json", "-i", str(inv)]
        playbook_cmd = [*drift_cmd, "--via", "ansible"]
        run(drift_cmd)  # warm both paths' connections, and record the command line's head start
        run(drift_cmd)
        ssh_script(lab, n, cdir)
        times = interleave(
            {
                "knobfleet drift": lambda cmd=drift_cmd: run(cmd),
                "parallel ssh": lambda n=n, lab=lab, cdir=cdir: ssh_script(lab, n, cdir),
                "ssh clients": lambda cmd=drift_cmd: run(cmd, env={"KNOBFLEET_SSH_MUX": "0"}),
                "no head start": lambda cmd=drift_cmd: run(cmd, env={"KNOBFLEET_HEADSTART": "0"}),
                "drift --via ansible": lambda cmd=playbook_cmd: run(cmd),
            },
            args.repeats,
        )
        kd, ps, sc, nh, pb = (
            med(times[k])
            for k in ("knobfleet drift", "parallel ssh", "ssh clients", "no head start", "drift --via ansible")
        )
        rows.append([n, args.repeats, f"{kd:.3f}", f"{ps:.3f}", f"{kd / ps:.2f}x", f"{sc:.3f}", f"{sc / ps:.2f}x",
                     f"{nh:.3f}", f"{nh / ps:.2f}x", f"{pb:.3f}", f"{pb / ps:.2f}x"])  # fmt: skip
        print(table(HEADERS, rows[-1:]), flush=True)
    print()
    print("knobfleet drift vs parallel ssh (warm connections, interleaved)")
    print(table(HEADERS, rows))


HEADERS = ["hosts", "runs", "drift s", "ssh s", "ratio", "ssh clients s", "ratio", "no head start s", "ratio",
           "--via ansible s", "ratio"]  # fmt: skip


if __name__ == "__main__":
    main()
