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


# A unix socket path holds at most 107 bytes; ssh adds ".XXXXXXXXXXXXXXXX" while creating one and %C is
# 40 hex digits, so the control folder itself must stay under ~48 bytes.
_MAX_CONTROL_DIR = 48


def control_dir() -> Path:
    """Where ssh's ControlMaster sockets live, shared by Ansible and the SSH fast path: ``<state>/cp``, or a
    short private folder under /tmp named after the state folder when that path would be too long."""
    preferred = state_dir() / "cp"
    if len(str(preferred)) <= _MAX_CONTROL_DIR:
        path = preferred
    else:
        import hashlib

        path = Path("/tmp") / f"knobfleet-cp-{os.getuid()}-{hashlib.sha1(str(preferred).encode()).hexdigest()[:8]}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if st.st_uid != os.getuid() or (st.st_mode & 0o077) or path.is_symlink():
        from knobfleet.errors import RunError

        raise RunError(
            f"{path}: SSH control folder is not private (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}); "
            f"remove it and re-run (knobfleet recreates it with mode 700)"
        )
    return path


def module_utils_dir() -> Path:
    """The on-host modules' shared code (``ansible.module_utils.knob_*``), part of the package."""
    return Path(__file__).resolve().parent / "module_utils"
