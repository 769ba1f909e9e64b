"""Ansible's --limit names exactly the hosts knobfleet chose (issue 58): a name with a space, ``,``, ``:``, ``!``,
``&``, ``*`` or ``[n]`` is that host and only it, read by Ansible's own InventoryManager from the file
``runner.exact_limit`` writes (comma-joined names were split and read as patterns)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader

from knobfleet.fleet.runner import exact_limit, limit_lines

# names Ansible's YAML inventory keeps as they are ("db:4" is host db, port 4; "web,3", "x*", "h[0]" are not kept)
NAMES = ["lab1", "lab 2", "!neg5", "and&6", "lab10", "a.b", "lab", "la.b"]


def _yaml_inventory(tmp_path: Path) -> Path:
    import yaml

    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {n: {"ansible_connection": "local"} for n in NAMES}}}))
    return inv


def _subset(inv: Path, limit: str) -> list[str]:
    im = InventoryManager(loader=DataLoader(), sources=[str(inv)])
    im.subset(limit)
    return sorted(h.name for h in im.get_hosts("all"))


@pytest.mark.parametrize("chosen", [[n] for n in NAMES] + [["lab 2", "!neg5"], ["lab1", "lab"], ["a.b"]])
def test_the_limit_file_selects_exactly_the_chosen_hosts(tmp_path: Path, chosen: list[str]) -> None:
    inv = _yaml_inventory(tmp_path)
    assert sorted(h.name for h in InventoryManager(loader=DataLoader(), sources=[str(inv)]).get_hosts("all")) == sorted(
        NAMES
    )
    limit = exact_limit(tuple(chosen), tmp_path)
    assert limit is not None and limit.startswith("@")
    assert _subset(inv, limit) == sorted(chosen)


def test_the_limit_argument_is_one_word_whatever_the_names(tmp_path: Path) -> None:
    """ansible-runner puts --limit on a command line it splits at spaces: "lab1,lab 2" became two arguments."""
    limit = exact_limit(("lab1", "lab 2", "!neg5"), tmp_path)
    assert limit == f"@{tmp_path / 'limit.txt'}" and not set(" ,:!") & set(limit)
    assert (tmp_path / "limit.txt").read_text() == "~^lab1$\n~^lab\\ 2$\n~^!neg5$\n"


def test_no_hosts_is_no_limit(tmp_path: Path) -> None:
    assert exact_limit((), tmp_path) is None and limit_lines(()) == ""
