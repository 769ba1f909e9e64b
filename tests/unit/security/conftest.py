"""Fixtures the security tests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def vault_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's temp dir as a project whose vault password file (``pw``) is set, and its own state folder."""
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    pw = tmp_path / "vault.pw"
    pw.write_text("pw\n")
    os.chmod(pw, 0o600)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(pw))
    return tmp_path
