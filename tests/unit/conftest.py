"""Shared by every unit test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_probe_of_real_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ran on the hosts (experiment.running) is read at the end of bench, ab and canary: a unit test's fake door
    (a ``Hosts``-shaped object) is read as before; an inventory path would start real probes of hosts no unit test
    has, so it reads nothing (the report then says the generation was not recorded)."""
    from knobfleet.experiment import running

    real = running.on_hosts

    def on_hosts(hosts, inventory):  # type: ignore[no-untyped-def]
        return {} if isinstance(inventory, str | Path) else real(hosts, inventory)

    monkeypatch.setattr(running, "on_hosts", on_hosts)
