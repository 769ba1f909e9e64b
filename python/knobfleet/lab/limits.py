"""Kernel limits a lab of many hosts needs: inotify instances and watches, raised only when they must be, sized
to the host count, recorded, and put back by ``lab down``.

Why: every lab host runs its own systemd and dbus as root, and the kernel counts inotify instances per user,
not per container. Measured on this lab (systemd 252): systemd uses 5 instances and dbus 1, 20 watches in all,
per host. ``fs.inotify.max_user_instances`` defaults to 128, so the 22nd-29th host's systemd fails with
"Failed to create control group inotify object: Too many open files" and exits.

``needed`` and ``plan`` are pure; ``usage``, ``raise_for`` and ``restore`` read and write ``/proc/sys``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Per lab host, with headroom over what one host uses (6 instances, 20 watches measured).
INSTANCES_PER_HOST = 8
WATCHES_PER_HOST = 256
# Left free for everything else root runs while the lab is up (the controller, Ansible, editors).
INSTANCES_SPARE = 64
WATCHES_SPARE = 8192
INSTANCES = "fs.inotify.max_user_instances"
WATCHES = "fs.inotify.max_user_watches"
PROC_SYS = Path("/proc/sys")
RECORD = "sysctl.json"


@dataclass(frozen=True)
class Change:
    name: str
    current: int
    wanted: int
    why: str

    def message(self) -> str:
        return f"lab: raising {self.name} from {self.current} to {self.wanted} ({self.why}); `lab down` puts it back"


def needed(new_hosts: int, in_use_instances: int, in_use_watches: int) -> dict[str, int]:
    """What the limits must be at least for ``new_hosts`` more hosts on top of what root uses now."""
    return {
        INSTANCES: in_use_instances + new_hosts * INSTANCES_PER_HOST + INSTANCES_SPARE,
        WATCHES: in_use_watches + new_hosts * WATCHES_PER_HOST + WATCHES_SPARE,
    }


def plan(new_hosts: int, current: Mapping[str, int], in_use_instances: int, in_use_watches: int) -> list[Change]:
    """Pure: the limits to raise (never lowered here), each with the reason in words."""
    if new_hosts <= 0:
        return []
    want = needed(new_hosts, in_use_instances, in_use_watches)
    per = {INSTANCES: (INSTANCES_PER_HOST, in_use_instances), WATCHES: (WATCHES_PER_HOST, in_use_watches)}
    out = []
    for name, value in want.items():
        if current[name] < value:
            each, used = per[name]
            why = (
                f"each lab host's systemd and dbus use up to {each} and the kernel counts them per user: "
                f"{new_hosts} new host(s) on top of {used} in use need {value}"
            )
            out.append(Change(name, current[name], value, why))
    return out


def _path(name: str) -> Path:
    return PROC_SYS / name.replace(".", "/")


def read(name: str) -> int:
    return int(_path(name).read_text().strip())


def write(name: str, value: int) -> None:
    _path(name).write_text(f"{value}\n")


def usage(uid: int = 0) -> tuple[int, int]:
    """(inotify instances, inotify watches) held by processes of ``uid`` now."""
    instances = watches = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) != "anon_inode:inotify":
                    continue
                text = (proc / "fdinfo" / fd.name).read_text()
            except OSError:
                continue
            instances += 1
            watches += sum(1 for line in text.splitlines() if line.startswith("inotify wd:"))
    return instances, watches


def raise_for(new_hosts: int, record_dir: Path) -> list[Change]:
    """Raise the limits ``new_hosts`` more lab hosts need; record each first value in ``record_dir/sysctl.json``
    (kept from the first raise until ``restore``). Returns what was changed."""
    if new_hosts <= 0:
        return []
    current = {INSTANCES: read(INSTANCES), WATCHES: read(WATCHES)}
    changes = plan(new_hosts, current, *usage())
    if not changes:
        return []
    record = record_dir / RECORD
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = {}
    for c in changes:
        entry = kept.get(c.name) or {"was": c.current}
        entry["set"] = c.wanted
        kept[c.name] = entry
    record_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for c in changes:
        write(c.name, c.wanted)
    return changes


def restore(record_dir: Path) -> list[str]:
    """Put back what ``raise_for`` recorded, where nobody changed the value since; returns what was put back."""
    record = record_dir / RECORD
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    done = []
    for name, entry in sorted(kept.items()):
        try:
            if read(name) == int(entry["set"]):
                write(name, int(entry["was"]))
                done.append(f"{name}={entry['was']}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    record.unlink(missing_ok=True)
    return done
