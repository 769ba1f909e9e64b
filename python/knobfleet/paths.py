"""Where knobfleet finds its data (roles, playbooks, profiles, inventories) and keeps its state.

Run from a checkout, the checkout's top-level folders are used; installed from a wheel outside a
checkout, the copies shipped in ``knobfleet/_data`` are used. ``KNOBFLEET_HOME`` overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _is_project(path: Path) -> bool:
    return (path / "roles" / "knob_serve").is_dir() and (path / "profiles").is_dir()


def project_root() -> Path:
    """The folder holding roles/, playbooks/, profiles/ and inventories/."""
    env = os.environ.get("KNOBFLEET_HOME")
    if env:
        return Path(env).resolve()
    cwd = Path.cwd().resolve()
    for candidate in (cwd, *cwd.parents):
        if _is_project(candidate):
            return candidate
    source_checkout = _PACKAGE_DIR.parent.parent
    if _is_project(source_checkout):
        return source_checkout
    return _PACKAGE_DIR / "_data"


def profiles_dir() -> Path:
    return project_root() / "profiles"


def catalogs_dir() -> Path:
    return profiles_dir() / "catalogs"


def roles_dir() -> Path:
    return project_root() / "roles"


def playbooks_dir() -> Path:
    return project_root() / "playbooks"


def default_inventory() -> Path:
    return project_root() / "inventories" / "lab"


def state_dir() -> Path:
    """Controller-side state (ansible-runner artifacts, lab keys): git-ignored ``.state/`` in a checkout."""
    env = os.environ.get("KNOBFLEET_STATE_DIR")
    if env:
        return Path(env).resolve()
    root = project_root()
    if root.name != "_data" and os.access(root, os.W_OK):
        return root / ".state"
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "knobfleet"


def display(path: Path) -> str:
    """A path as an operator wants to read it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
