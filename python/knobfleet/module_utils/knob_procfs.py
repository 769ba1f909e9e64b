"""The processes of a unit's cgroup as /proc shows them: each one's environ, cmdline, comm, state, parent and start
time (the live-state rule compares them with the profile). Standard library only (``os``), bounded reads; part of
the probe (knob_observe). Callers import these names from here: the controller as
``knobfleet.module_utils.knob_procfs``, the roles' modules as ``ansible.module_utils.knob_procfs``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` would cost every probe ~5 ms
    from typing import Any

MAX_PROC = 1024 * 1024


def boot_time() -> int:
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def cgroup_pids(cgroup: str) -> list[int]:
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        path = base + cgroup + "/cgroup.procs"
        if cgroup and os.path.exists(path):
            with open(path) as fh:
                return sorted(int(x) for x in fh.read().split())
    return []


def parse_environ(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "replace")
    return env


def process(pid: int, btime: int, hz: int) -> dict[str, Any] | None:
    """One process: environ, cmdline, comm, state (``/proc/PID/stat`` field 3: R, S, D, T stopped, Z zombie,
    ...), parent and start time (None when it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            stat_line = fh.read()
    except OSError:
        return None
    try:  # a zombie has no environ (ESRCH) and an empty cmdline, but its state is what matters then
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env_raw = fh.read(MAX_PROC)
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            cmd_raw = fh.read(MAX_PROC)
    except OSError:
        if not os.path.isdir("/proc/%d" % pid):
            return None
        env_raw, cmd_raw = b"", b""
    rest = stat_line[stat_line.rindex(")") + 2 :].split()
    comm = stat_line[stat_line.index("(") + 1 : stat_line.rindex(")")]
    start_ticks = int(rest[19])
    return {
        "pid": pid,
        "ppid": int(rest[1]),
        "comm": comm,
        "state": rest[0],
        "env": parse_environ(env_raw),
        "cmdline": [c.decode("utf-8", "replace") for c in cmd_raw.split(b"\0")[:-1]],
        "start_ticks": start_ticks,
        "start_epoch": btime + start_ticks / float(hz),
    }


def unit_processes(cgroup: str) -> list[dict[str, Any]]:
    btime, hz = boot_time(), os.sysconf("SC_CLK_TCK")
    return [x for x in (process(pid, btime, hz) for pid in cgroup_pids(cgroup)) if x]
