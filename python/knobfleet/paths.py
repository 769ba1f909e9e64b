"""Where knobfleet finds its data (roles, playbooks, profiles, inventories) and keeps its state.

Three places, in this order:

* ``KNOBFLEET_HOME``: a folder laid out like this repository (roles/, playbooks/, profiles/, inventories/).
* A user's project, found from the working directory upward by its ``knobfleet.toml`` (``knobfleet init``):
  its profiles, catalog overlays and default inventory; roles and playbooks are the Ansible collection
  shipped in the package (``knobfleet/_data/ansible``), catalogs the package's.
* A checkout of this repository (found upward from the working directory, else the one the package was
  imported from): its top-level folders, roles run straight from ``roles/`` (the lab and the tests).

Installed from a wheel with neither, the built-in examples are used only when asked (``--examples`` /
``KNOBFLEET_EXAMPLES=1``); anything else says how to make a project.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knobfleet.project import Project

_PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = _PACKAGE_DIR / "_data"
COLLECTION = ("knobfleet", "serving")


def _is_project(path: Path) -> bool:
    return (path / "roles" / "knob_serve").is_dir() and (path / "profiles").is_dir()


def examples() -> bool:
    """Whether the built-in example profiles are asked for (``--examples`` sets KNOBFLEET_EXAMPLES=1)."""
    return os.environ.get("KNOBFLEET_EXAMPLES", "") not in ("", "0")


def has_config(folder: Path) -> bool:
    """Whether ``folder`` holds a ``knobfleet.toml``; anything else at that name (a FIFO, a folder, a dangling
    symlink …) is a UsageError naming it: skipped, the search would go on up to another project."""
    from knobfleet import safefile

    path = folder / "knobfleet.toml"
    try:
        return safefile.is_present(path)
    except safefile.FileRefused as exc:
        from knobfleet.errors import UsageError
        from knobfleet.rules import shown

        fix = "replace it with a regular TOML file (`knobfleet init --help`)"
        raise UsageError(safefile.not_a(shown(str(path)), exc, "project file", fix)) from None


@cache
def _discover(cwd: Path, home: str | None) -> tuple[str, Path]:
    """(kind, root): kind is ``home``, ``project`` (a knobfleet.toml), ``checkout`` or ``installed``."""
    if home:
        root = Path(os.path.realpath(home))  # not resolve(): before 3.13 it raises on a symlink loop
        _check_home(home)
        return "home", root
    for candidate in (cwd, *cwd.parents):
        if has_config(candidate):
            return "project", candidate
        if _is_project(candidate):
            return "checkout", candidate
    source_checkout = _PACKAGE_DIR.parent.parent
    if _is_project(source_checkout):
        return "checkout", source_checkout
    return "installed", DATA_DIR


def _check_home(home: str) -> None:
    """``KNOBFLEET_HOME`` must be a folder this user can read: anything else (nothing there, a FIFO, a file, a
    dangling symlink, a folder without read permission) is a UsageError in one line, never an empty project."""
    from knobfleet import safefile
    from knobfleet.errors import UsageError
    from knobfleet.rules import shown

    try:
        found = safefile.list_dir(Path(home))
        if found is None:
            raise safefile.FileRefused("does not exist")
    except safefile.FileRefused as exc:
        why = str(exc) if str(exc).startswith(("is ", "does ")) else f"{exc}: this user cannot read it"
        raise UsageError(
            f"KNOBFLEET_HOME={shown(home)}: {why}; point KNOBFLEET_HOME at a readable folder laid out like the "
            "knobfleet repository (profiles/, inventories/), or unset it"
        ) from None


def _where() -> tuple[str, Path]:
    return _discover(Path.cwd().resolve(), os.environ.get("KNOBFLEET_HOME") or None)


def project() -> Project | None:
    """The user's project (a folder with knobfleet.toml at or above the working directory), or None."""
    kind, root = _where()
    if kind != "project":
        return None
    from knobfleet.project import load

    return load(root)


def project_root() -> Path:
    """The user's project, else the folder holding roles/, playbooks/, profiles/ and inventories/."""
    return _where()[1]


def _source_checkout() -> Path | None:
    """The checkout the package is imported from (an editable install), or None (installed from a wheel)."""
    root = _PACKAGE_DIR.parent.parent
    return root if _is_project(root) else None


def data_root() -> Path:
    """Where knobfleet's own files are: the checkout (or KNOBFLEET_HOME), else the package's ``_data`` (or, for
    an editable install used from a project, the checkout it was installed from)."""
    kind, root = _where()
    if kind in ("home", "checkout"):
        return root
    return DATA_DIR if DATA_DIR.is_dir() else (_source_checkout() or DATA_DIR)


def uses_collection() -> bool:
    """Whether Ansible runs use the knobfleet.serving collection (installed, or in a user's project) rather
    than a checkout's roles/ directly."""
    return _where()[0] in ("project", "installed")


def ansible_dir() -> Path:
    """The playbooks the CLI runs, with the knobfleet.serving collection beside them (``collections/``): Ansible
    looks for collections next to the playbook first, so the CLI always runs its own copy. Shipped in the
    wheel; generated on demand (and regenerated when the sources change) for an editable install."""
    shipped = DATA_DIR / "ansible"
    src = _source_checkout()
    if shipped.is_dir() or src is None:
        return shipped
    return _staged(src)


@cache
def _staged(src: Path) -> Path:
    import hashlib

    from knobfleet import collection

    h = hashlib.sha256()
    for base in ("roles", "playbooks", "collection", "python/knobfleet/module_utils", "python/knobfleet/collection.py"):
        for f in sorted(p for p in [src / base, *(src / base).rglob("*")] if p.is_file()):
            h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes())
    dest = src / "build" / "ansible-dev" / "ansible"
    stamp = dest.parent / "stamp"
    if not (stamp.is_file() and stamp.read_text() == h.hexdigest() and dest.is_dir()):
        tmp = dest.parent / f".ansible.{os.getpid()}"
        collection.stage_ansible_dir(src, tmp)
        if dest.exists():
            import shutil

            shutil.rmtree(dest)
        tmp.rename(dest)
        stamp.write_text(h.hexdigest())
    return dest


def collection_dir() -> Path:
    return ansible_dir() / "collections" / "ansible_collections" / COLLECTION[0] / COLLECTION[1]


def profiles_dir() -> Path:
    if examples():
        return data_root() / "profiles"
    proj = project()
    if proj is not None:
        return proj.profiles
    kind, root = _where()
    if kind == "installed":
        from knobfleet.errors import UsageError

        raise UsageError(
            f"{Path.cwd()}: no knobfleet project here or above (no knobfleet.toml); create one with "
            "`knobfleet init DIR`, or pass --examples for the built-in example profiles"
        )
    return root / "profiles"


def catalogs_dir() -> Path:
    """The engine catalogs knobfleet ships (generated/<engine>.yaml + <engine>.overlay.yaml)."""
    return data_root() / "profiles" / "catalogs"


def catalog_overlay_dirs() -> list[Path]:
    """A project's own catalog overlays, applied on top of the shipped catalogs (empty outside a project)."""
    proj = project()
    if proj is None:
        return []
    from knobfleet import safefile
    from knobfleet.errors import ProfileError

    try:  # a FIFO, a file or an unreadable folder there is named, never read as "no overlays"
        found = safefile.list_dir(proj.catalogs)
    except safefile.FileRefused as exc:
        fix = "point `catalogs` in knobfleet.toml at a folder of <engine>.overlay.yaml files (or remove what is there)"
        raise ProfileError([safefile.not_a(display_node(proj.catalogs), exc, "catalog overlay folder", fix)]) from None
    return [] if found is None else [proj.catalogs]


def roles_dir() -> Path:
    return collection_dir() / "roles" if uses_collection() else data_root() / "roles"


def playbooks_dir() -> Path:
    return ansible_dir() if uses_collection() else data_root() / "playbooks"


def module_source(role: str, module: str) -> Path:
    """An on-host module's source: the role's library/ in a checkout, the collection's plugins/modules else."""
    if uses_collection():
        return collection_dir() / "plugins" / "modules" / f"{module}.py"
    return data_root() / "roles" / role / "library" / f"{module}.py"


def default_inventory() -> Path:
    """This checkout's lab inventory (``inventories/lab``). What a command uses without -i is
    ``fleet.inventory.default()``: the project's, ANSIBLE_INVENTORY, or the running lab's."""
    return data_root() / "inventories" / "lab"


def state_dir() -> Path:
    """Controller-side state (ansible-runner artifacts, lab keys): git-ignored ``.state/`` in a checkout."""
    env = os.environ.get("KNOBFLEET_STATE_DIR")
    if env:
        return Path(os.path.realpath(env))  # a symlink loop is left as it is (resolve() raised before 3.13)
    root = project_root()
    if root != DATA_DIR and os.access(root, os.W_OK):
        return root / ".state"
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "knobfleet"


def display(path: Path) -> str:
    """A path as an operator wants to read it: relative to the working directory when inside it. Never raises: a
    symlink loop, a vanished working directory or a path that cannot be resolved is shown as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: Python < 3.13 on a symlink loop
        return str(path)


def display_node(path: Path) -> str:
    """``display`` of the name itself: its folder shown as ``display`` shows it, its last part as named, so a symlink
    (a dangling one, a loop) is named as the link, not as where it points."""
    return str(Path(display(path.parent)) / path.name)


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
