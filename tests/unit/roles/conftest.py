"""Shared by the on-host module tests: knob_generation's transaction (module_utils/knob_guards, through
knob_pkgmeta) looks for units the host's packages ship (``PACKAGE_UNIT_DIRS``: /lib/systemd/system,
/usr/lib/systemd/system); here it looks in an empty temp dir, so no test reads this machine's own unit directories,
whatever units they hold. Their serve scripts launch fictional engines (/usr/bin/engine): the launcher checks are off
here, and on in test_knob_guards_launcher.py, which makes its launchers in a temp dir."""

from __future__ import annotations

import pytest

from knobfleet.module_utils import knob_guards, knob_pkgmeta


@pytest.fixture(autouse=True)
def no_package_units_of_this_machine(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    empty = tmp_path_factory.mktemp("no-package-units")
    monkeypatch.setattr(knob_pkgmeta, "PACKAGE_UNIT_DIRS", (str(empty),))


@pytest.fixture(autouse=True)
def fictional_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_guards, "LAUNCHER_CHECKS", False)
