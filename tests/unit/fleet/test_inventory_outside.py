"""Installed from a wheel and run outside any project, a command that reaches hosts refuses unless an inventory
is given or --examples is set: it never falls back to the wheel's built-in lab inventory (127.0.1.1-3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet import paths
from knobfleet.errors import EXIT_USAGE, UsageError
from knobfleet.fleet import inventory


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("KNOBFLEET_INVENTORY", "ANSIBLE_INVENTORY", "KNOBFLEET_EXAMPLES", "KNOBFLEET_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "_where", lambda: ("installed", paths.DATA_DIR))
    monkeypatch.chdir(tmp_path)


@pytest.mark.usefixtures("installed")
def test_outside_a_project_the_default_inventory_is_refused() -> None:
    with pytest.raises(UsageError) as info:
        inventory.default()
    assert info.value.exit_code == EXIT_USAGE
    assert str(info.value).endswith(
        "no knobfleet project here or above (no knobfleet.toml) and no inventory given; pass -i INVENTORY, "
        "create a project with `knobfleet init DIR`, or pass --examples for the built-in lab"
    )


@pytest.mark.usefixtures("installed")
def test_examples_or_an_inventory_variable_names_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_EXAMPLES", "1")
    assert inventory.default() == paths.default_inventory()
    monkeypatch.delenv("KNOBFLEET_EXAMPLES")
    monkeypatch.setenv("ANSIBLE_INVENTORY", "/srv/fleet/hosts.yml")
    assert inventory.default() == Path("/srv/fleet/hosts.yml")
