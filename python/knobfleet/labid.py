"""A lab's identity: its id (a name, per checkout) and its slot (a number, machine-wide), and what the slot picks.

Several labs run side by side on one machine: two of one checkout (``lab up --id NAME``), of two checkouts, or the
integration suite's shards. The id names the lab within its checkout: its folder (``<state>/lab`` for the default
id, ``<state>/labs/<id>`` for any other) and what ``--id`` and ``KNOBFLEET_LAB`` select. The slot is what keeps the
labs of every checkout apart on the machine; it picks

- the address block: 127.0.<slot+1>.N (the default lab, slot 0, keeps lab1..N at 127.0.1.N);
- the machine names (``knobfleet-labN``; ``knobfleet-s<slot>-labN`` beyond slot 0) and cgroups;
- the controller-side ports of its router, Prometheus and node_exporter (today's plus 100 per slot).

Host names (``lab1``…, the inventory's names and each host's hostname) are the lab's own: every lab's inventory
names its hosts lab1..N, each at its own address. Slots are claimed machine-wide in ``REGISTRY`` (a tmpfs under
/run, root's: labs do not outlive a reboot) under a lock; a claim whose lab runs no host and whose claiming process
is gone is stale and taken over. The default id takes slot 0 only; any other id the first free slot from 1.

``valid_id``, ``lab_dir``, ``Identity`` and its ports are pure; ``selected`` reads the state folder. The registry of
slots (``claim``, ``release``) is ``lab.slots``'s. This module sits in the lowest layer: ``fleet.inventory`` asks it
which lab a command means.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from knobfleet.errors import UsageError

DEFAULT_ID = "default"
ENV = "KNOBFLEET_LAB"
MAX_SLOTS = 24  # 127.0.1-24.N; the highest port is 30081 + 2300, below the kernel's ephemeral range (32768)
PORT_STRIDE = 100
IDENTITY_FILE = "identity.json"
_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,23}")


def valid_id(name: str) -> str:
    """``name`` if it can name a lab (a folder and part of its messages): UsageError naming the fix otherwise."""
    if not _ID_RE.fullmatch(name):
        raise UsageError(
            f"lab id {name!r}: use 1-24 lowercase letters, digits and '-', starting with a letter (e.g. shard2)"
        )
    return name


def lab_dir(state: Path, lab_id: str) -> Path:
    """The folder of lab ``lab_id`` in the state folder ``state`` (pure)."""
    return state / "lab" if lab_id == DEFAULT_ID else state / "labs" / valid_id(lab_id)


def auto_id(slot: int) -> str:
    """The id a lab gets without --id when the default's slot is taken elsewhere: named after its address block."""
    return f"lab-{slot + 1}"


@dataclass(frozen=True)
class Identity:
    """Who a lab is: ``id`` within its checkout, ``slot`` on the machine."""

    id: str = DEFAULT_ID
    slot: int = 0

    @property
    def block(self) -> int:
        """The third octet of the lab's addresses: 127.0.<block>.N."""
        return self.slot + 1

    def addresses(self, count: int) -> str:
        """How the lab's first ``count`` host addresses read in a message: 127.0.1.1-3."""
        return f"127.0.{self.block}.1" + (f"-{count}" if count > 1 else "")

    def port(self, base: int) -> int:
        """A controller-side port of this lab: the default lab's ``base``, moved by 100 per slot."""
        return base + PORT_STRIDE * self.slot

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "slot": self.slot}


def read(lab_folder: Path) -> Identity | None:
    """The identity a lab folder records (``lab up`` writes it), None when it records none or not one of ours."""
    try:
        doc = json.loads((lab_folder / IDENTITY_FILE).read_text(encoding="utf-8"))
        ident = Identity(valid_id(str(doc["id"])), int(doc["slot"]))
    except (OSError, ValueError, KeyError, TypeError, UsageError):
        return None
    return ident if 0 <= ident.slot < MAX_SLOTS else None


def of(lab_folder: Path) -> Identity:
    """The identity of the lab in ``lab_folder``: as recorded, else the default's (slot 0) for ``<state>/lab`` and
    a not-yet-placed one named after the folder otherwise."""
    found = read(lab_folder)
    if found is not None:
        return found
    name = lab_folder.name if lab_folder.parent.name == "labs" else DEFAULT_ID
    try:
        return Identity(valid_id(name), 0)
    except UsageError:
        return Identity()


def running(lab_folder: Path) -> bool:
    """Whether any host of the lab in ``lab_folder`` has a live systemd-nspawn (by its PID files)."""
    run = lab_folder / "run"
    for pid_file in run.glob("*.pid") if run.is_dir() else ():
        try:
            pid = int(pid_file.read_text().strip())
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"systemd-nspawn"):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def selected(state: Path) -> Path:
    """The folder of the lab a command means: ``KNOBFLEET_LAB``'s; else the default lab's when it runs; else the one
    lab of this checkout that runs; else the default's. UsageError when several run and none is named."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return lab_dir(state, env)
    default = state / "lab"
    if running(default):
        return default
    labs = state / "labs"
    up = sorted(d for d in labs.iterdir() if d.is_dir() and running(d)) if labs.is_dir() else []
    if len(up) == 1:
        return up[0]
    if len(up) > 1:
        names = ", ".join(d.name for d in up)
        raise UsageError(f"labs {names} run in this checkout; name one with --id NAME or {ENV}=NAME")
    return default


def ids(state: Path) -> list[tuple[str, Path]]:
    """Every lab folder of this checkout's state folder with its id: the default's first."""
    out = [(DEFAULT_ID, state / "lab")]
    labs = state / "labs"
    if labs.is_dir():
        out += [(d.name, d) for d in sorted(labs.iterdir()) if d.is_dir() and _ID_RE.fullmatch(d.name)]
    return out


def slot_of_machine(machine: str) -> int | None:
    """The slot a lab machine name belongs to (``knobfleet-lab3`` -> 0, ``knobfleet-s2-lab1`` -> 2), None for any
    other name (pure)."""
    m = re.fullmatch(r"knobfleet-(?:s(\d+)-)?lab\d+", machine)
    if m is None:
        return None
    return int(m.group(1) or 0)
