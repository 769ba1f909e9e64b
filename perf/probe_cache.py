"""The cached probe (issue 29): drift vs the multiplexed parallel-ssh baseline, and what one probe costs a host.

One run prints, per fleet size: `knobfleet drift` (cached probe), the same drift from an earlier tree (`--before
DIR`, a checkout's python/ folder; optional; its probe process is timed alongside too) and the parallel ssh script
of perf/drift_vs_ssh.py, interleaved, medians and ratios. On the first size it also measures, on lab1 alone, the
host CPU of one probe from the host's own cgroup (cgroup v2 ``cpu.stat`` usage of ``knobfleet-lab/lab1``, or of
``knobfleet-lab/s<slot>-lab1`` in a lab beyond slot 0: sshd, the
shell, python, systemctl and the host's systemd answering it, everything the probe makes the host do), repeated
`--cpu-runs` times one after the other, against the ssh script's commands and a bare `ssh true`; and the first probe
of a host (no entry on the host, the controller knowing none: the bundle is sent, compiled and stored).
`drift --watch` (each host's probe interpreter kept between rounds) is timed per round: the time of 1 + 10 rounds
less the time of 1 round, over 10, in the same interleaved rounds, and on lab1 the host CPU of one more round.
Usage (root; boots its own lab):
  flock /tmp/knobfleet-lab.lock python perf/probe_cache.py --sizes 3,32 --repeats 5 --before /tmp/before/python
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab import KNOBFLEET, REPO, boot, interleave, med, run, table
from drift_vs_ssh import remote, ssh_argv, ssh_script

from knobfleet.lab.cgroups import CGROUP_PARENT
from knobfleet.lab.hostfiles import LabHost

HEADERS = ["hosts", "runs", "drift s", "ssh s", "ratio", "target", "drift before s", "ratio before"]
HEADERS += ["--watch round s", "its ratio"]
WATCH_ROUNDS = 10  # a --watch sample: (the time of 1 + WATCH_ROUNDS rounds - the time of 1 round) / WATCH_ROUNDS
CPU_HEADERS = ["hosts", "runs", "drift: knobfleet CPU ms", "ssh script: clients CPU ms", "drift before: CPU ms"]
TARGETS = {3: 1.2, 32: 1.15}


def cpu_usec(host: LabHost) -> int:
    """CPU microseconds the lab host's cgroup has used (cgroup v2, hierarchical)."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        stat = Path(base) / CGROUP_PARENT / host.unique / "cpu.stat"
        if stat.exists():
            for line in stat.read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1])
    raise SystemExit(f"no cgroup v2 cpu.stat for {host.name} ({host.machine})")


def env_for(pythonpath: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": pythonpath}


def timed(cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or os.environ.copy())
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (each command with its own children: ssh clients)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def with_cpu(fn: object, into: list[float]) -> object:
    """``fn`` (returns wall seconds), also appending the controller-side CPU of the call to ``into``."""
    assert callable(fn)

    def run_one() -> float:
        before = children_cpu()
        wall = fn()
        into.append(children_cpu() - before)
        return float(wall)

    return run_one


def host_cpu(host: LabHost, runs: int, one: object) -> tuple[float, float]:
    """(ms of the host's CPU per call, wall s per call) of ``one()`` run ``runs`` times, minus the host's idle use
    over as long a pause."""
    assert callable(one)
    one()  # warm
    before, started = cpu_usec(host), time.perf_counter()
    for _ in range(runs):
        one()
    took = time.perf_counter() - started
    used = cpu_usec(host) - before
    idle0 = cpu_usec(host)
    time.sleep(min(took, 5.0))
    idle = (cpu_usec(host) - idle0) * took / min(took, 5.0)
    return (used - idle) / runs / 1000.0, took / runs


WRAPPER = "/root/kf-timed-python3"


def _children_ms(times_output: str) -> list[float]:
    """The children's user + sys of each `times` output (its second line of every pair), in ms."""
    import re

    out = []
    lines = [ln for ln in times_output.splitlines() if ln.strip()]
    for ln in lines[1::2]:
        (um, us), (sm, ss) = re.findall(r"(\d+)m([\d.]+)s", ln)
        out.append((int(um) * 60 + float(us) + int(sm) * 60 + float(ss)) * 1000.0)
    return out


def process_cpu(lab: Any, cdir: str, inv: Path, one: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """ms of CPU of the probe's own process (python and its children: systemctl) per cached probe, and of the ssh
    script's commands, measured on lab1 by bash's `times`."""
    import shlex

    wrapper = '#!/bin/bash\n/usr/bin/python3 "$@"\nrc=$?\ntimes >> /tmp/kf-probe.times\nexit $rc\n'
    setup = f"printf %s {shlex.quote(wrapper)} > {WRAPPER}; chmod 755 {WRAPPER}; rm -f /tmp/kf-probe.times"
    subprocess.run(ssh_argv(lab, 1, cdir, setup), check=True)
    hv = inv / "host_vars" / "lab1.yml"
    hv.parent.mkdir(exist_ok=True)
    hv.write_text(f"ansible_python_interpreter: {WRAPPER}\n")
    try:
        for _ in range(runs + 1):
            timed(one, env, (0, 2))
        got = subprocess.run(ssh_argv(lab, 1, cdir, "cat /tmp/kf-probe.times"), capture_output=True, text=True)
        probe = _children_ms(got.stdout)[1:]  # the first run stores the entry for this interpreter
    finally:
        hv.unlink()
    script = remote(lab.identity.block).replace("$(hostname | tr -dc 0-9)", "1")
    loop = f"for i in $(seq {runs}); do ( {script} ) >/dev/null 2>&1; done; times"
    got = subprocess.run(ssh_argv(lab, 1, cdir, f"bash -c {shlex.quote(loop)}"), capture_output=True, text=True)
    script_ms = _children_ms(got.stdout)[0] / runs
    return {"probe process alone (python + systemctl)": med(probe), "script's commands alone": script_ms}


def state_dir() -> Path:
    from knobfleet import paths

    return paths.state_dir()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu-runs", type=int, default=10)
    ap.add_argument("--before", default="", help="a python/ folder of earlier code to time alongside (optional)")
    ap.add_argument("--out", default="", help="write the raw numbers here as JSON")
    args = ap.parse_args()
    # Byte-compile both trees first (as `make` does for this one): where PYTHONDONTWRITEBYTECODE is set, a tree
    # without .pyc files recompiles every module on every command, ~50 ms that are not drift's.
    for tree in [str(REPO / "python"), *([args.before] if args.before else [])]:
        subprocess.run([sys.executable, "-m", "compileall", "-q", tree], check=True, capture_output=True)
    now = env_for(str(REPO / "python"))
    before = env_for(args.before) if args.before else None
    rows, cpu_rows = [], []
    raw: dict[str, Any] = {"sizes": {}, "cpu": {}, "controller_cpu_s": {}}
    ctl_rows: list[list[object]] = []
    for idx, n in enumerate(int(x) for x in args.sizes.split(",")):
        lab, inv = boot(n)
        run([*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"])
        cdir = tempfile.mkdtemp(prefix="kf-ssh-")
        drift = [*KNOBFLEET, "drift", "--json", "-i", str(inv)]
        if idx == 0:
            lab1 = lab.host(1)  # read now: Lab.identity reads a file
            one = [*drift, "--limit", "lab1"]
            # the first probe of a host: no entry there, none known here
            firsts = []
            for _ in range(3):
                subprocess.run(ssh_argv(lab, 1, cdir, "rm -rf /var/lib/knobfleet/.probe"), check=True)
                shutil.rmtree(state_dir() / "cache" / "probecode", ignore_errors=True)
                t0, c0 = time.perf_counter(), cpu_usec(lab1)
                timed(one, now, (0, 2))
                firsts.append(((cpu_usec(lab1) - c0) / 1000.0, time.perf_counter() - t0))
            timed(one, now, (0, 2))  # the entry is stored: what follows are hits
            true_argv = ssh_argv(lab, 1, cdir, "true")
            script_argv = ssh_argv(lab, 1, cdir, remote(lab.identity.block).replace("$(hostname | tr -dc 0-9)", "1"))
            paths_cpu = {
                "drift, cached probe": lambda c=one: timed(c, now, (0, 2)),
                "ssh true": lambda a=true_argv: timed(a),
                "ssh script": lambda a=script_argv: timed(a),
            }
            if before is not None:
                paths_cpu["drift, --before tree"] = lambda c=one, e=before: timed(c, e, (0, 2))
            for name, fn in paths_cpu.items():
                ms, wall = host_cpu(lab1, args.cpu_runs, fn)
                raw["cpu"][name] = {"host_cpu_ms": ms, "wall_s": wall}
                cpu_rows.append([name, args.cpu_runs, f"{ms:.1f}", f"{wall:.3f}"])
            base = raw["cpu"]["ssh true"]["host_cpu_ms"]
            cpu_rows.append(
                ["first probe (miss)", 3, f"{med([c for c, _ in firsts]):.1f}", f"{med([w for _, w in firsts]):.3f}"]
            )
            raw["cpu"]["first probe (miss)"] = {
                "host_cpu_ms": med([c for c, _ in firsts]),
                "wall_s": med([w for _, w in firsts]),
            }
            raw["cpu"]["ssh true baseline"] = base
            # drift --watch: what one more round costs lab1 (its probe interpreter kept: one request per round)
            watch1 = [*KNOBFLEET, "drift", "--json-lines", "-i", str(inv), "--limit", "lab1", "--watch", "0"]
            watch1.append("--rounds")
            rounds_cpu, rounds_wall = [], []
            for _ in range(3):
                c0, t0 = cpu_usec(lab1), time.perf_counter()
                timed([*watch1, str(1 + WATCH_ROUNDS)], now, (0, 2))
                c1, t1 = cpu_usec(lab1), time.perf_counter()
                timed([*watch1, "1"], now, (0, 2))
                c2, t2 = cpu_usec(lab1), time.perf_counter()
                rounds_cpu.append(((c1 - c0) - (c2 - c1)) / WATCH_ROUNDS / 1000.0)
                rounds_wall.append(((t1 - t0) - (t2 - t1)) / WATCH_ROUNDS)
            raw["cpu"]["drift --watch, one more round"] = {"host_cpu_ms": med(rounds_cpu), "wall_s": med(rounds_wall)}
            cpu_rows.append(["drift --watch, one more round", 3, f"{med(rounds_cpu):.1f}", f"{med(rounds_wall):.3f}"])
            # The processes alone, as bash's `times` reports its children: the probe's python (through a wrapper
            # named as lab1's interpreter) against the script's commands; no sshd, no engine answering requests.
            alone = process_cpu(lab, cdir, inv, one, now, args.cpu_runs)
            if before is not None:  # the same two processes, the probe from the --before tree
                was = process_cpu(lab, cdir, inv, one, before, args.cpu_runs)
                alone["probe process alone, --before tree"] = was["probe process alone (python + systemctl)"]
            for name, ms in alone.items():
                raw["cpu"][name] = {"process_cpu_ms": ms}
                cpu_rows.append([name, args.cpu_runs, f"{ms:.1f}", "-"])
            print(
                table(["lab1, one after another", "runs", "host CPU ms / call", "wall s / call"], cpu_rows), flush=True
            )
            ls = ssh_argv(
                lab, 1, cdir, "ls -ln /var/lib/knobfleet/.probe; stat -c '%a %U %n' /var/lib/knobfleet/.probe"
            )
            listing = subprocess.run(ls, capture_output=True, text=True).stdout
            raw["lab1_cache_dir"] = listing
            print(listing, flush=True)
        timed(drift, now, (0, 2))  # warm connections and the hosts' entries
        ssh_script(lab, n, cdir)
        ctl: dict[str, list[float]] = {"drift": [], "ssh": [], "drift before": []}
        watch = [*KNOBFLEET, "drift", "--json-lines", "-i", str(inv), "--watch", "0", "--rounds"]

        def watch_round(w: list[str] = watch) -> float:
            many = timed([*w, str(1 + WATCH_ROUNDS)], now, (0, 2))
            return (many - timed([*w, "1"], now, (0, 2))) / WATCH_ROUNDS

        modes = {
            "watch round": watch_round,
            "drift": with_cpu(lambda c=drift: timed(c, now, (0, 2)), ctl["drift"]),
            "ssh": with_cpu(lambda n=n, lab=lab, cdir=cdir: ssh_script(lab, n, cdir), ctl["ssh"]),
        }
        if before is not None:
            timed(drift, before, (0, 2))
            modes["drift before"] = with_cpu(lambda c=drift, e=before: timed(c, e, (0, 2)), ctl["drift before"])
        times = interleave(modes, args.repeats)  # type: ignore[arg-type]
        raw["controller_cpu_s"][str(n)] = ctl
        ctl_rows.append(
            [
                n,
                args.repeats,
                f"{med(ctl['drift']) * 1000:.0f}",
                f"{med(ctl['ssh']) * 1000:.0f}",
                f"{med(ctl['drift before']) * 1000:.0f}" if ctl["drift before"] else "-",
            ]
        )
        raw["sizes"][str(n)] = times
        kd, ps = med(times["drift"]), med(times["ssh"])
        kb = med(times["drift before"]) if before is not None else float("nan")
        kw = med(times["watch round"])
        target = TARGETS.get(n)
        rows.append(
            [
                n,
                args.repeats,
                f"{kd:.3f}",
                f"{ps:.3f}",
                f"{kd / ps:.2f}x",
                f"≤ {target}x" if target else "—",
                f"{kb:.3f}",
                f"{kb / ps:.2f}x",
                f"{kw:.3f}",
                f"{kw / ps:.2f}x",
            ]
        )
        print(table(HEADERS, rows[-1:]), flush=True)
    print()
    print("knobfleet drift (cached probe) vs parallel ssh (warm connections, interleaved)")
    print(table(HEADERS, rows))
    print()
    print("the controller's side: CPU of the knobfleet process (with its ssh clients) vs the script's ssh clients")
    print(table(CPU_HEADERS, ctl_rows))
    print()
    print("one probe's cost to the host (lab1, cgroup CPU minus idle; 'ssh true' is the session alone)")
    print(table(["what", "runs", "host CPU ms / call", "wall s / call"], cpu_rows))
    if args.out:
        Path(args.out).write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
