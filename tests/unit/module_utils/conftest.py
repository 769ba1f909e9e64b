"""Shared by the module_utils tests: the transaction's serve scripts launch fictional engines (/usr/bin/engine), so the
launcher checks (knob_guards.check_launcher) are off here; tests/unit/roles/test_knob_guards_launcher.py keeps them."""

from __future__ import annotations

import pytest

from knobfleet.module_utils import knob_guards


@pytest.fixture(autouse=True)
def fictional_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_guards, "LAUNCHER_CHECKS", False)
