"""The wheel's ansible-core requirement admits only the minor version the lab tests run on (the lock's)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return next(r for r in map(Requirement, deps) if r.name == name)


def test_ansible_core_requirement_is_the_locked_minor_only() -> None:
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    pinned = Version(re.search(r"^ansible-core==(\S+)", lock, re.M).group(1))  # type: ignore[union-attr]
    spec = _requirement("ansible-core").specifier
    assert pinned in spec
    next_minor = Version(f"{pinned.major}.{pinned.minor + 1}.0")
    assert next_minor not in spec, "a newer ansible-core minor is admitted but the lab tests never ran on it"
