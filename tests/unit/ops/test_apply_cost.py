"""ops/apply_cost: the restarting hosts, and the rollout's own time per batch kept from the last real apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.ops import apply_cost
from knobfleet.ops.outcome import HostOutcome


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    return inv


def restarted(host: str, batch: int, stop: float | None, start: float | None) -> HostOutcome:
    o = HostOutcome(host, "applied", batch, restarted=True)
    o.startup = {"stop_s": stop, "start_s": start}
    return o


def test_the_overhead_per_batch_is_kept_beyond_the_slowest_restart(inventory: Path) -> None:
    assert apply_cost.overhead(inventory) is None
    outcomes = [restarted("a", 1, 1.0, 30.0), restarted("b", 1, 0.0, 20.0), restarted("c", 2, None, 25.0)]
    apply_cost.remember(inventory, [*outcomes, HostOutcome("d", "unchanged", 0)], wall_s=80.0)
    assert apply_cost.overhead(inventory) == (80.0 - 31.0 - 25.0) / 2


def test_an_unmeasured_restart_keeps_the_earlier_figure(inventory: Path) -> None:
    apply_cost.remember(inventory, [restarted("a", 1, 0.0, 10.0)], wall_s=15.0)
    apply_cost.remember(inventory, [restarted("a", 1, 0.0, 10.0), restarted("b", 2, None, None)], wall_s=99.0)
    assert apply_cost.overhead(inventory) == 5.0


def test_a_damaged_file_is_no_figure(inventory: Path) -> None:
    apply_cost.remember(inventory, [restarted("a", 1, 0.0, 10.0)], wall_s=15.0)
    apply_cost._file(inventory).write_text('{"overhead_s": "x"}')
    assert apply_cost.overhead(inventory) is None
    apply_cost._file(inventory).write_text("[]")
    assert apply_cost.overhead(inventory) is None


def test_restarting_hosts_in_a_plan_and_in_an_apply() -> None:
    class HV:
        def __init__(self, host: str) -> None:
            self.host = host

    hosts = [HV("a"), HV("b"), HV("c"), HV("d")]
    decided = {
        "a": HostOutcome("a", "pending", 0, actions=["install", "restart"]),
        "b": HostOutcome("b", "in-sync", 0),
        "c": HostOutcome("c", "refused", 0),
    }
    assert apply_cost.restarting(decided, hosts, check=True) == ["a"]  # type: ignore[arg-type]
    assert apply_cost.restarting(decided, hosts, check=False) == ["a", "d"]  # type: ignore[arg-type]
