"""Shared by the on-host module tests: knob_generation looks for units the host's packages ship
(``PACKAGE_UNIT_DIRS``: /lib/systemd/system, /usr/lib/systemd/system); here it looks in an empty temp dir, so no
test reads this machine's own unit directories, whatever units they hold."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(autouse=True)
def no_package_units_of_this_machine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    empty = tmp_path_factory.mktemp("no-package-units")
    for value in list(vars(request.module).values()):
        if isinstance(value, ModuleType) and hasattr(value, "PACKAGE_UNIT_DIRS"):
            monkeypatch.setattr(value, "PACKAGE_UNIT_DIRS", (str(empty),))
