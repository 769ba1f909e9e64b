"""Other checkouts' labs on this machine.

Each lab claims a slot (``labid``, ``slots``), and the slot picks its machine names, cgroups and addresses, so labs of
two checkouts do not meet. Still, before ``up`` boots a host or ``down`` cleans one, the lab asks which lab's
systemd-nspawn runs that machine now, read from each nspawn's ``--directory`` (``hostfiles.lab_running``), and
leaves another checkout's alone: a lab of 0.2.3 claimed no slot, and a slot's claim may have been lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from knobfleet.errors import LabError
from knobfleet.lab import hostfiles
from knobfleet.lab.hostfiles import LabHost


def running_labs() -> dict[str, list[Path]]:
    """Each lab machine a systemd-nspawn runs now, of any checkout, with the folders of the labs running it."""
    found: dict[str, list[Path]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    running = hostfiles.lab_running(fh.read().split(b"\0"))
            except OSError:
                continue  # gone, or not ours to read
            if running is not None:
                found.setdefault(running[0], []).append(running[1])
    return found


def others(labs: dict[str, list[Path]], mine: Path) -> dict[str, Path]:
    """Of ``running_labs()``' answer: the machines a lab other than ``mine`` runs, with that lab's folder. Pure."""
    return {m: next(p for p in found if p != mine) for m, found in labs.items() if set(found) - {mine}}


def foreign(mine: Path) -> dict[str, Path]:
    """The machines another checkout's lab runs now (``mine``: this lab's folder), with that lab's folder."""
    return others(running_labs(), mine)


def check_free(hosts: Sequence[LabHost], mine: Path) -> None:
    """``LabError`` naming the lab and the command that stops it when another checkout's lab runs any of ``hosts``."""
    taken = foreign(mine)
    for host in hosts:
        if host.machine in taken:
            raise LabError(f"lab up: {hostfiles.port_taken(host.address, taken[host.machine])}")
