"""Engine groups read from a real inventory (Ansible's own reader): each rank gets its group, a --limit that
keeps one rank still knows rank 0's address, and a bad declaration is one line naming the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.fleet.inventory import load_hosts
from knobfleet.groups import GroupError


def inventory(tmp_path: Path, groups: str) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  hosts:\n" + "".join(f"    gpu{i}:\n      ansible_host: 127.0.2.{i}\n" for i in range(1, 4))
    )
    (inv / "group_vars" / "all" / "groups.yml").write_text(groups)
    return inv / "hosts.yml"


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_INVENTORY_CACHE", "0")


def test_each_rank_gets_its_group_and_a_limit_still_knows_rank_0(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "knob_engine_groups:\n  dsv4:\n    members: {gpu1: 0, gpu2: 1}\n")
    hosts = {hv.host: hv for hv in load_hosts(inv)}
    assert hosts["gpu3"].group is None
    assert hosts["gpu1"].group is not None and hosts["gpu1"].group.hosts == ["gpu1", "gpu2"]
    (only,) = load_hosts(inv, "gpu2")
    assert only.group is not None and only.group.head.address == "127.0.2.1"


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            "knob_engine_groups:\n  g:\n    members: {gpu1: 0, gpu2: 0}\n",
            "knob_engine_groups.g: gpu1 and gpu2 both claim rank 0",
        ),
        ("knob_engine_groups:\n  g:\n    members: {gpu1: 1, gpu2: 2}\n", "knob_engine_groups.g: rank 0 is missing"),
        (
            "knob_engine_groups:\n  g:\n    members: {gpu1: 0, gpu9: 1}\n",
            "knob_engine_groups.g.members.gpu9: not a host",
        ),
        (
            "knob_engine_groups:\n  a:\n    members: {gpu1: 0, gpu2: 1}\n  b:\n    members: {gpu2: 0, gpu3: 1}\n",
            "gpu2: in two engine groups (a, b); a host runs one engine",
        ),
        (
            "knob_engine_groups:\n  g:\n    members: {gpu1: 0, gpu2: 1}\n    dist_init_addr: 127.0.2.3\n",
            "knob_engine_groups.g.dist_init_addr: '127.0.2.3' is not the address of one of the group's hosts",
        ),
    ],
)
def test_a_bad_declaration_is_one_line(tmp_path: Path, groups: str, message: str) -> None:
    with pytest.raises(GroupError) as info:
        load_hosts(inventory(tmp_path, groups))
    text = str(info.value)
    assert text.startswith("inv/hosts.yml: ") or text.startswith(f"{tmp_path}"), text
    assert message in text and "\n" not in text
