"""Each lab host's own cgroups: where they are, joining them at boot, stopping what is left in them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from knobfleet.lab.hostfiles import LabHost

CGROUP_PARENT = "knobfleet-lab"


def cgroup_dirs(host: LabHost) -> list[Path]:
    """This host's own cgroup in every writable hierarchy that systemd uses (v1 name=systemd, v2).

    Each nspawn must sit in a cgroup of its own: started from a shared cgroup, every nspawn puts its
    container in the same ``payload`` cgroup, and one container's systemd then stops the others."""
    out: list[Path] = []
    for base in (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.procs").exists() and not (base == Path("/sys/fs/cgroup") and out):
            out.append(base / CGROUP_PARENT / host.unique)
    return out


def join_cgroups(dirs: list[Path]) -> None:
    """Runs in the child before exec: move itself into the host's cgroups."""
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("0")


def cgroup_pids(dirs: list[Path]) -> list[int]:
    pids: set[int] = set()
    for d in dirs:
        if d.is_dir():
            for procs in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(x) for x in procs.read_text().split())
    return sorted(pids)


def remove_cgroups(dirs: list[Path]) -> None:
    for d in dirs:
        if d.is_dir():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()
            with contextlib.suppress(OSError):
                d.parent.rmdir()  # knobfleet-lab/, once the last host is gone


def kill_leftovers(dirs: list[Path]) -> None:
    """Stop what is left in a host's cgroups (a container whose nspawn died): SIGRTMIN+3 to its
    init for an orderly halt, then SIGKILL. Only processes in knobfleet's own lab cgroups are touched."""
    pids = cgroup_pids(dirs)
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                os.kill(pid, signal.SIGRTMIN + 3)
    deadline = time.monotonic() + 10
    while cgroup_pids(dirs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in cgroup_pids(dirs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
