"""Fleet cost curves: boot 3/16/32/64 lab hosts (one lab, grown in place) and record, per mode and size, the wall
time, the controller's CPU per host, peak RSS, processes and file descriptors; then fit each curve's fixed cost
and per-host slope (least squares), and what one idle lab host costs.

Every command runs as a child of this script while a sampler walks its process tree every 10 ms (processes, open
fds, RSS summed over the tree); its CPU is the child's rusage (it and every process it waited for) plus the CPU
the ssh ControlMasters spent meanwhile (they are daemons nobody waits for; each mode has its own). Runs of the
modes are interleaved per size, so machine noise hits every mode alike.

Modes (``--modes``; add one with a function below and its line in ``MODES``):
  drift          knobfleet drift --json-lines (the SSH fast path, warm connections, cached host view)
  ssh            bash starting one multiplexed ssh per host reading what the probe reads (warm connections)
  apply-nochange knobfleet apply ctas512 on hosts already running it (one probe each; no playbook runs)
  apply-serial   knobfleet apply --serial 25%, flipping ctas512/ctas768 (every host changes and restarts)
  drift-before   with --before DIR: `drift --json` of another knobfleet (DIR holds its python/ folder, e.g.
                 `git archive COMMIT python | tar -x -C DIR`), on the same lab, interleaved

Usage (root; takes the lab lock, boots its own lab under a temp state dir and always tears it down):
  flock /tmp/knobfleet-lab.lock .venv/bin/python perf/scale.py --sizes 3,16,32,64 --repeats 3 \
      --out perf/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))

from knobfleet.lab.nspawn import Lab  # noqa: E402

PY = sys.executable
KNOBFLEET = [PY, "-m", "knobfleet"]
HZ = os.sysconf("SC_CLK_TCK")
SVC = "sglang-dsv4-decode"
# What an operator's script reads: both files and their hashes, unit state, the current generation's meta,
# environ + cmdline + stat of every process of the unit, the health URL (``remote``; as perf/drift_vs_ssh.py).
READS = (
    f"sha256sum /root/serve_dsv4_decode.sh /etc/systemd/system/{SVC}.service; "
    f"cat /root/serve_dsv4_decode.sh /etc/systemd/system/{SVC}.service /var/lib/knobfleet/{SVC}/current/meta.json; "
    f"systemctl show {SVC} -p ActiveState,SubState,MainPID,NRestarts,NeedDaemonReload,DropInPaths,ControlGroup; "
    f"cg=$(systemctl show -p ControlGroup --value {SVC}); "
    "for p in $(cat /sys/fs/cgroup/systemd$cg/cgroup.procs); do cat /proc/$p/environ /proc/$p/cmdline /proc/$p/stat; "
    "done; "
)


def remote(block: int) -> str:
    """Mode ssh's command (its $REMOTE): READS and the host's engine health check, in a lab whose addresses are
    127.0.<block>.N (a host's hostname is lab<N> in every lab: the block comes from here, the number from there)."""
    return (
        f"{READS}curl -s -o /dev/null -w '%{{http_code}}' "
        f"http://127.0.{block}.$(hostname | tr -dc 0-9):30000/health_generate || true"
    )


# --- measuring one command ---------------------------------------------------------------------------------


@dataclass
class Sample:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float  # the largest single process (rusage maxrss of the command and what it waited for)
    peak_tree_rss_mb: float  # the command's whole process tree at its largest (sampled)
    peak_procs: int
    peak_fds: int
    masters: int  # ssh ControlMaster processes alive after the run
    master_fds: int
    first_line_s: float  # when the command's first line of output came (-1: it printed none)


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc/PID/task/TID/children (cheap: no walk over all of /proc)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
    return out


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            f = fh.read().rsplit(b")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, ValueError, IndexError):
        return 0


def masters(control_dir: Path) -> list[int]:
    """ssh ControlMaster processes serving sockets under ``control_dir``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    cmd = fh.read()
            except OSError:
                continue
            if cmd.startswith(b"ssh: ") and str(control_dir).encode() in cmd and b"[mux]" in cmd:
                out.append(int(d))
    return out


def measure(argv: list[str], env: dict[str, str], control_dir: Path, ok: tuple[int, ...] = (0,)) -> Sample:
    before = {pid: _cpu_ticks(pid) for pid in masters(control_dir)}
    peak = {"procs": 0, "fds": 0, "rss": 0}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            pids = _tree(proc.pid)
            peak["procs"] = max(peak["procs"], len(pids))
            peak["fds"] = max(peak["fds"], sum(_fds(p) for p in pids))
            peak["rss"] = max(peak["rss"], sum(_rss_kb(p) for p in pids))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out: list[bytes] = []
    errs: list[bytes] = []
    first: list[float] = []

    def read_out() -> None:
        chunks = []
        for line in proc.stdout or ():
            if not first:
                first.append(time.perf_counter() - started)
            chunks.append(line)
        out.append(b"".join(chunks))

    readers = [
        threading.Thread(target=read_out, daemon=True),
        threading.Thread(target=lambda: errs.append(proc.stderr.read() if proc.stderr else b""), daemon=True),
    ]
    for t in readers:
        t.start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    for t in readers:
        t.join()
    err = errs[0] if errs else b""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[:6])}… exited {proc.returncode}:\n{out[0][-2000:]!r}\n{err[-2000:]!r}")
    after = masters(control_dir)
    master_cpu = sum(_cpu_ticks(p) - before.get(p, 0) for p in after) / HZ
    return Sample(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime + master_cpu,
        peak_rss_mb=usage.ru_maxrss / 1024,
        peak_tree_rss_mb=peak["rss"] / 1024,
        peak_procs=peak["procs"],
        peak_fds=peak["fds"],
        masters=len(after),
        master_fds=sum(_fds(p) for p in after),
        first_line_s=first[0] if first else -1.0,
    )


# --- modes -------------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    lab: Lab
    inventory: Path
    hosts: int
    env: dict[str, str]
    state: Path
    ssh_cp: Path
    runs: dict[str, int] = field(default_factory=dict)
    current: str = "ctas512"  # the profile every host runs now (apply-serial flips it)


@dataclass(frozen=True)
class Mode:
    argv: Callable[[Ctx, int], list[str]]  # (context, run index) -> command
    control_dir: Callable[[Ctx], Path]
    ok: tuple[int, ...] = (0,)


def _kf_cp(ctx: Ctx) -> Path:
    from knobfleet import paths

    return paths.control_dir()  # main() points KNOBFLEET_STATE_DIR at ctx.state for this process too


def _drift(ctx: Ctx, r: int) -> list[str]:
    return [*KNOBFLEET, "drift", "--json-lines", "-i", str(ctx.inventory)]


def _ssh(ctx: Ctx, r: int) -> list[str]:
    opts = (
        f"-i {ctx.lab.key} -o UserKnownHostsFile={ctx.lab.known_hosts} -o StrictHostKeyChecking=yes "
        f"-o BatchMode=yes -o ControlMaster=auto -o ControlPath={ctx.ssh_cp}/%h -o ControlPersist=300"
    )
    addrs = " ".join(ctx.lab.host(i).address for i in range(1, ctx.hosts + 1))
    script = f'for h in {addrs}; do ssh {opts} root@$h "$REMOTE" >/dev/null & done; wait'
    return ["bash", "-c", script]


def _apply_nochange(ctx: Ctx, r: int) -> list[str]:
    # the profile the hosts run now, whatever an interleaved apply-serial left them on
    return [*KNOBFLEET, "apply", ctx.current, "-i", str(ctx.inventory), "--yes", "--json"]


def _apply_serial(ctx: Ctx, r: int) -> list[str]:
    ctx.current = "ctas768" if ctx.current == "ctas512" else "ctas512"  # every run changes every host (restarts)
    return [*KNOBFLEET, "apply", ctx.current, "-i", str(ctx.inventory), "--serial", "25%", "--yes", "--json"]


BEFORE: list[Path] = []  # --before DIR


def _drift_before(ctx: Ctx, r: int) -> list[str]:
    return ["env", f"PYTHONPATH={BEFORE[0] / 'python'}", *KNOBFLEET, "drift", "--json", "-i", str(ctx.inventory)]


MODES: dict[str, Mode] = {
    "drift-before": Mode(_drift_before, _kf_cp, (0, 2, 4, 6)),
    "drift": Mode(_drift, _kf_cp),
    "ssh": Mode(_ssh, lambda ctx: ctx.ssh_cp),
    "apply-nochange": Mode(_apply_nochange, _kf_cp),
    "apply-serial": Mode(_apply_serial, _kf_cp),
}
# Modes after which every host runs ctas512 again (apply-serial leaves half the runs on ctas768).
RESETS = {"apply-serial"}


# --- the lab ------------------------------------------------------------------------------------------------


def host_cost(lab: Lab, n: int, seconds: float) -> dict[str, Any]:
    """What the n idle lab hosts cost: CPU over ``seconds``, PSS, processes (all processes in their cgroups)."""
    from knobfleet.lab.cgroups import cgroup_dirs, cgroup_pids

    hosts = [lab.host(i) for i in range(1, n + 1)]
    pids = {h.name: cgroup_pids(cgroup_dirs(h)) + ([lab.pid(h)] if lab.pid(h) else []) for h in hosts}
    t0 = {p: _cpu_ticks(p) for ps in pids.values() for p in ps}
    time.sleep(seconds)
    cpu = sum(_cpu_ticks(p) - t0[p] for p in t0 if _cpu_ticks(p)) / HZ

    def pss_kb(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                return sum(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except (OSError, ValueError):
            return 0

    pss = sum(pss_kb(p) for ps in pids.values() for p in ps)
    tmpfs = sum(shutil.disk_usage(lab.host_dir(h)).used for h in hosts)
    procs = sum(len(ps) for ps in pids.values())
    return {
        "hosts": n,
        "seconds": seconds,
        "cpu_pct_per_host": round(100 * cpu / seconds / n, 3),
        "pss_mb_per_host": round(pss / 1024 / n, 1),
        "tmpfs_mb_per_host": round(tmpfs / 2**20 / n, 2),
        "procs_per_host": round(procs / n, 1),
    }


def grow(lab: Lab, n: int, env: dict[str, str]) -> tuple[Path, float]:
    """Boot lab1..labn (running hosts kept), wait for the engines, apply ctas512 to the new ones; returns the
    inventory and how long the apply took. Sets ``env``'s REMOTE (mode ssh's script) for the lab's address block,
    known once it is up."""
    from tests.integration.conftest import wait_engines

    lab.up(n)
    for note in lab.notes:
        print(note, flush=True)
    lab.notes.clear()
    env["REMOTE"] = remote(lab.identity.block)
    wait_engines([lab.host(i).address for i in range(1, n + 1)], timeout=180)
    inv = lab.dir / "inventory"
    started = time.perf_counter()
    subprocess.run([*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"], env=env, check=True, capture_output=True)
    return inv, time.perf_counter() - started


# --- fitting and printing -----------------------------------------------------------------------------------


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = fixed + slope * x: (fixed, slope)."""
    if len(xs) < 2:
        return ys[0] if ys else 0.0, 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def medians(samples: list[Sample]) -> dict[str, float]:
    keys = Sample.__dataclass_fields__
    return {k: statistics.median(float(getattr(s, k)) for s in samples) for k in keys}


def markdown(results: dict[str, Any]) -> str:
    out = [
        "| mode | hosts | runs | wall | first output | controller CPU | CPU per host | peak RSS (largest process) | "
        "peak RSS (tree) | peak processes | peak fds | ssh masters after | their fds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, sizes in results["modes"].items():
        for n, m in sizes.items():
            out.append(
                f"| {mode} | {n} | {m['runs']} | {m['wall_s']:.3f} s | "
                + (f"{m['first_line_s']:.3f} s | " if m.get("first_line_s", -1) >= 0 else "- | ")
                + f"{m['cpu_s']:.3f} s | "
                f"{1000 * m['cpu_s'] / int(n):.1f} ms | {m['peak_rss_mb']:.0f} MB | {m['peak_tree_rss_mb']:.0f} MB | "
                f"{m['peak_procs']:.0f} | {m['peak_fds']:.0f} | {m['masters']:.0f} | {m['master_fds']:.0f} |"
            )
    out += [
        "",
        "| mode | fixed wall | wall per host | fixed CPU | CPU per host |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode, f in results["fits"].items():
        out.append(
            f"| {mode} | {f['wall_fixed_s']:.3f} s | {1000 * f['wall_per_host_s']:.1f} ms | "
            f"{f['cpu_fixed_s']:.3f} s | {1000 * f['cpu_per_host_s']:.1f} ms |"
        )
    if "drift" in results["modes"] and "ssh" in results["modes"]:
        out += ["", "| hosts | drift / ssh (wall) |", "| ---: | ---: |"]
        for n in [n for n in results["modes"]["drift"] if n in results["modes"]["ssh"]]:
            d, s = results["modes"]["drift"][n]["wall_s"], results["modes"]["ssh"][n]["wall_s"]
            out.append(f"| {n} | {d / s:.2f}x |")
    return "\n".join(out)


def measure_size(
    lab: Lab, n: int, modes: list[str], repeats: int, env: dict[str, str], state: Path, ssh_cp: Path, results: Any
) -> None:
    t = time.perf_counter()
    inv, apply_s = grow(lab, n, env)
    results["boot_apply_s"][n] = {"grow_s": round(time.perf_counter() - t, 1), "apply_s": round(apply_s, 1)}
    print(f"{n} hosts up and applied: {results['boot_apply_s'][n]}", flush=True)
    ctx = Ctx(lab, inv, n, env, state, ssh_cp)
    for m in modes:  # warm every path's connections (and the drift host-view cache)
        measure(MODES[m].argv(ctx, 0), env, MODES[m].control_dir(ctx), MODES[m].ok)
    got: dict[str, list[Sample]] = {m: [] for m in modes}
    for r in range(repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            mode = MODES[m]
            got[m].append(measure(mode.argv(ctx, r + 1), env, mode.control_dir(ctx), mode.ok))
    if any(m in RESETS for m in modes):
        subprocess.run([*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"], env=env, capture_output=True)
    for m in modes:
        results["modes"][m][n] = {"runs": repeats, **medians(got[m])}
        row = results["modes"][m][n]
        first = f" first output {row['first_line_s']:.3f} s" if row["first_line_s"] >= 0 else ""
        print(f"{m:15s} {n:3d} hosts: wall {row['wall_s']:.3f} s cpu {row['cpu_s']:.3f} s{first}", flush=True)


def main() -> None:
    import signal

    # SIGTERM (timeout, kill) unwinds through the finally below, which tears the lab down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3,16,32,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="drift,ssh", help=f"comma-separated, from {', '.join(MODES)}")
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds to measure idle hosts at the largest size")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    ap.add_argument("--before", default=None, metavar="DIR", help="another knobfleet's tree for mode drift-before")
    args = ap.parse_args()
    if args.before:
        BEFORE.append(Path(args.before).resolve())
        subprocess.run([PY, "-m", "compileall", "-q", str(BEFORE[0] / "python")], check=True, capture_output=True)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    work = Path(tempfile.mkdtemp(prefix="kf-scale-"))
    state = work / "state"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(KNOBFLEET_STATE_DIR=str(state))  # and REMOTE, for the lab's address block: grow() sets it
    os.environ["KNOBFLEET_STATE_DIR"] = str(state)  # this process's Lab and paths use it too
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "python" / "knobfleet")], check=True, capture_output=True)
    lab = Lab(work / "lab")  # not <state>/lab: the repository's inventories/lab is left alone
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "command": " ".join(sys.argv),
        "modes": {m: {} for m in modes},
        "boot_apply_s": {},
    }
    ssh_cp = work / "ssh-cp"
    ssh_cp.mkdir()
    try:
        for n in sizes:
            try:
                measure_size(lab, n, modes, args.repeats, env, state, ssh_cp, results)
            except (Exception, SystemExit) as exc:  # keep what the smaller sizes measured
                results["failed"] = f"{n} hosts: {exc}"
                print(f"FAILED at {n} hosts: {exc}", flush=True)
                break
        done = [int(n) for n in results["boot_apply_s"]]
        if done and "failed" not in results:
            results["idle"] = host_cost(lab, done[-1], args.idle_s)
            print(f"idle: {results['idle']}", flush=True)
    finally:
        lab.down()
        for note in lab.notes:
            print(note, flush=True)
        shutil.rmtree(work, ignore_errors=True)
    results["fits"] = {}
    for m in modes:
        if not results["modes"][m]:
            continue
        ns = [float(n) for n in results["modes"][m]]
        rows = list(results["modes"][m].values())
        wf, ws = fit(ns, [r["wall_s"] for r in rows])
        cf, cs = fit(ns, [r["cpu_s"] for r in rows])
        results["fits"][m] = {"wall_fixed_s": wf, "wall_per_host_s": ws, "cpu_fixed_s": cf, "cpu_per_host_s": cs}
    results["self_rusage_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print()
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
