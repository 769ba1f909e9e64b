"""The fleet as the commands reach it: which inventory, which hosts, and the ``Hosts`` door every use case gets.
The CLI goes through here, never into ``fleet/``. Light at import (the CLI builds its parser from ``via_choices``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from knobfleet.fleet import hosts as door_module
from knobfleet.fleet.hosts import Hosts

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.fleet.readhost import ReadPlan

__all__ = ["check_sources", "default_inventory", "door", "fork_count", "hosts", "read_plan", "via_choices"]


def default_inventory() -> Path:
    """The inventory when none is named (fleet.inventory.default)."""
    from knobfleet.fleet.inventory import default

    return default()


def via_choices() -> tuple[str, ...]:
    """``--via``'s choices: ``auto``, then each transport (fleet.hosts.via_choices)."""
    return door_module.via_choices()


def fork_count(asked: int | None) -> int:
    """``--forks`` when given (checked), else the default number of hosts at once (fleet.hosts.fork_count)."""
    return door_module.fork_count(asked)


def door(inventory: Path, via: str = "auto", forks: int | None = None, keep: bool = False) -> Hosts:
    """The one ``Hosts`` of a command: built once, handed to its use case. ``keep``: each host's probe interpreter
    is kept between probes (``drift --watch``)."""
    return Hosts(inventory, via, forks, keep)


def hosts(inventory: Path | None, limit: str | None) -> list[HostVars]:
    """The validated host vars of the selected hosts."""
    from knobfleet import paths
    from knobfleet.fleet.inventory import load_hosts

    return load_hosts(inventory or paths.default_inventory(), limit)


def read_plan(inventory: Path, limit: str | None) -> ReadPlan:
    """The read path's cached plain view of the selected hosts (drift, verify)."""
    from knobfleet.fleet import readhost

    return readhost.plan_for(inventory, limit)


def check_sources(path: Path) -> str | None:
    """Why the inventory at ``path`` cannot be read safely (a FIFO, a device, an oversized file in it), or None.
    Imported when asked: the cached read path loads neither pydantic nor yaml."""
    from knobfleet.fleet.inventory import check_sources as check

    return check(path)
