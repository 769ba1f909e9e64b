"""``lab speed``: a running lab host's own speed factor, the file inside it that its engine re-reads every second
(``sim.model.HOST_SPEED_FILE``): a lab host's hardware, never a real host's. ``nspawn.Lab.host_speed`` and
``set_host_speed`` are these.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from knobfleet.errors import LabError
from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.labroot import write

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView


def running_host(lab: LabView, name: str, what: str) -> LabHost:
    """The running host ``name`` of ``lab``; a LabError for any other name (``what``: the command asking)."""
    hosts = {h.name: h for h in lab.known()}
    if not (name.startswith("lab") and name[3:].isdigit()) or name not in hosts or lab.pid(hosts[name]) is None:
        running = ", ".join(h.name for h in lab.known() if lab.pid(h) is not None) or "none"
        raise LabError(
            f"lab {what}: {name!r} is not a running host of this lab (running: {running}); it sets a lab "
            "host's hardware, never a real host's"
        )
    return hosts[name]


def host_speed(lab: LabView, name: str) -> float:
    """The speed factor a running lab host's engine reads (1.0 when none is set)."""
    from knobfleet.lab.sim import model

    path = lab.host_dir(LabHost(int(name[3:]))) / "root" / model.HOST_SPEED_FILE.lstrip("/")
    try:
        return model.parse_speed(path.read_text(encoding="ascii")[:64])
    except (OSError, ValueError):
        return 1.0


def set_host_speed(lab: LabView, name: str, factor: float) -> float:
    """Write the host-level speed file inside ``name`` (the engine re-reads it every second); 1.0 removes it."""
    from knobfleet.lab.sim import model

    host = running_host(lab, name, "speed")
    lo, hi = model.HOST_SPEED_RANGE
    if not (math.isfinite(factor) and lo <= factor <= hi):
        raise LabError(f"lab speed: {factor!r}: a speed factor is a number in {lo:g}..{hi:g} (1 = as the others)")
    path = lab.host_dir(host) / "root" / model.HOST_SPEED_FILE.lstrip("/")
    if factor == 1.0:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path, f"{factor:g}\n")
    return factor
