"""When apply starts ansible-playbook ahead of its pre-check, and the controller-side hint behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.fleet.inventory import load_hosts
from knobfleet.ops import apply_ahead
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.precheck import Options

INVENTORY = Path(__file__).parents[1] / "data" / "inventory_v1"
HASH = "sha256:" + "a" * 64


@pytest.fixture
def hosts():  # type: ignore[no-untyped-def]
    return load_hosts(INVENTORY)


@pytest.mark.parametrize(
    ("opts", "last", "ahead"),
    [
        (Options(), {}, True),  # nothing known: a change is likely, start the playbook while probing
        (Options(), {"lab1": HASH, "lab2": HASH, "lab3": HASH}, False),  # all last left on it: probe first
        (Options(), {"lab1": HASH, "lab2": HASH, "lab3": "sha256:" + "b" * 64}, True),  # one host elsewhere
        (Options(), {"lab1": HASH, "lab2": HASH}, True),  # one host never seen
        (Options(check=True), {}, False),  # a plan decides from the probe alone
        (Options(serial="1"), {}, False),  # batches are formed from the pre-check's decision
        (Options(canary=True), {}, False),
        (Options(via="ansible"), {}, False),  # no probe to gate on
    ],
)
def test_when_the_playbook_starts_ahead(hosts, opts: Options, last: dict[str, str], ahead: bool) -> None:  # type: ignore[no-untyped-def]
    assert [hv.host for hv in hosts] == ["lab1", "lab2", "lab3"]
    assert apply_ahead.speculative(hosts, opts, HASH, last) is ahead
    assert apply_ahead.speculative([], opts, HASH, last) is False


def test_the_hint_remembers_hosts_left_on_the_profile_and_forgets_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path))
    inv = tmp_path / "inv"
    assert apply_ahead.last_applied(inv) == {}
    outcomes = [
        HostOutcome("lab1", "applied", 1),
        HostOutcome("lab2", "unchanged", 0),
        HostOutcome("lab3", "failed", 1),
    ]
    apply_ahead.remember_applied(inv, {"lab3": HASH, "lab4": "x"}, HASH, outcomes)
    assert apply_ahead.last_applied(inv) == {"lab1": HASH, "lab2": HASH, "lab4": "x"}  # lab3 failed: forgotten
    apply_ahead.remember_applied(inv, apply_ahead.last_applied(inv), "h2", [HostOutcome("lab1", "rolled-back", 1)])
    assert apply_ahead.last_applied(inv) == {"lab2": HASH, "lab4": "x"}
    assert apply_ahead.last_applied(tmp_path / "other-inventory") == {}  # per inventory
    apply_ahead.last_applied_file(inv).write_text("not json")
    assert apply_ahead.last_applied(inv) == {}  # a broken hint is no hint
