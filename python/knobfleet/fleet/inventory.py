"""Read hosts and their ``knob_serve_*`` vars through ansible-core's own inventory code.

Using ansible's InventoryManager/VariableManager means group_vars/host_vars precedence is exactly
Ansible's. ansible is imported lazily: it is slow to import and most CLI paths never need it.

The result is cached under ``<state>/cache/inventory`` keyed by the sha256 of every inventory file's
path and content (plus the --limit and this model's source): reading a static inventory through
InventoryManager costs ~0.1 s, a cache hit ~2 ms. Never cached: dynamic inventories (executable files,
``plugin:`` sources) and vars whose templates call lookup/query/now, whose values can change without
any file changing. ``KNOBFLEET_INVENTORY_CACHE=0`` turns the cache off.

This module is what a cached read imports (the fingerprint, the cache, the checks of every file Ansible would read,
the vault password setup, the default inventory); the read through Ansible is ``ansible_inventory.py`` and the rules
on vault values ``vaultvars.py``, both loaded on a cache miss only (their callers import their names from there).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import __version__, paths, safefile
from knobfleet.errors import InventoryError
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)

if TYPE_CHECKING:  # fingerprint() stays light: the CLI calls it before pydantic is imported
    from knobfleet.fleet.hostvars import HostVars


_HOSTVARS_SOURCE = Path(__file__).with_name("hostvars.py")


CACHE_SCHEMA = 1
KEEP_CACHED = 32
_PLUGIN_SOURCE = re.compile(rb"(?m)^plugin\s*:")


def fingerprint(inventory: Path, limit: str | None) -> str | None:
    """sha256 of everything the inventory's vars are read from, or None when it cannot be cached."""
    if os.environ.get("KNOBFLEET_INVENTORY_CACHE", "1") == "0":
        return None
    root = inventory.resolve()
    try:  # what Ansible reads: symlinked folders followed (rglob would skip them), a loop never cached
        if root.is_dir():
            files = sorted(p for p, mode in _walk(root) if stat.S_ISREG(mode))
        else:
            extra = [p for d in ("group_vars", "host_vars") if (root.parent / d).is_dir()
                     for p, mode in _walk(root.parent / d) if stat.S_ISREG(mode)]  # fmt: skip
            files = [root, *sorted(extra)]
    except _Loop:
        return None
    h = sha256()
    h.update(json.dumps([CACHE_SCHEMA, __version__, str(root), limit]).encode())
    h.update(_HOSTVARS_SOURCE.read_bytes())
    for f in files:
        if os.access(f, os.X_OK):
            return None  # an inventory script: its output is not in any file
        try:  # non-blocking and bounded: a FIFO or device is never read (read_hosts refuses it with one line)
            data = safefile.read_bytes(f, MAX_FILE, "inventory file")
        except safefile.FileRefused:
            return None
        if _PLUGIN_SOURCE.search(data):
            return None  # an inventory plugin (cloud, constructed…): same
        h.update(f"\0{f.relative_to(root.parent)}\0{len(data)}\0".encode() + data)
    return str(h.hexdigest())


MAX_FILE = 16 * 1024 * 1024  # one inventory or vars file
MAX_FILES = 10_000  # files under an inventory folder (and its group_vars/host_vars)
MAX_DIRS = 2_000  # folders under it
# Files Ansible parses as YAML/JSON/INI text (vars files: no extension or these; inventory folders: all but these).
_VARS_EXTS = ("", ".yml", ".yaml", ".json")
_IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")


def check_sources(inventory: Path) -> str | None:
    """Why the inventory cannot be read safely, or None: every file Ansible would read (the inventory, or each
    file under an inventory folder, and the group_vars/host_vars beside it) must be a readable regular file of
    at most 16 MiB, and the ones it parses as text valid UTF-8. A FIFO or a device is refused without opening it
    blocking. A missing inventory is left to ``read_hosts`` (its message has the hint)."""
    from knobfleet.rules import shown

    try:
        st = inventory.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    files: list[tuple[Path, bool]] = []  # (path, parsed as text)
    if stat.S_ISDIR(st.st_mode):
        roots = [inventory]
    elif stat.S_ISREG(st.st_mode):
        files.append((inventory, not os.access(inventory, os.X_OK)))
        roots = [d for d in (inventory.parent / "group_vars", inventory.parent / "host_vars") if d.is_dir()]
    else:
        return f"{safefile.kind(st.st_mode)}; an inventory must be a regular file or a folder"
    for root in roots:
        try:
            walked = _walk(root)
        except _Loop as exc:
            return str(exc)
        for path, entry_mode in walked:
            if len(files) >= MAX_FILES:
                return f"more than {MAX_FILES} files; point -i at the inventory itself"
            if not stat.S_ISREG(entry_mode):
                kind = safefile.kind(entry_mode)
                return f"{shown(paths.display(path))}: {kind}; inventory files must be regular files"
            name = path.name
            vars_dir = (
                root.name in ("group_vars", "host_vars") or "group_vars" in path.parts or "host_vars" in path.parts
            )
            parsed = (path.suffix in _VARS_EXTS) if vars_dir else not name.endswith(_IGNORED_EXTS)
            files.append((path, parsed and not os.access(path, os.X_OK)))
    for path, parsed in files:
        try:
            if parsed:
                safefile.read_text(path, MAX_FILE, "inventory file")
            else:
                safefile.check_input(path, MAX_FILE, "inventory file")
        except safefile.FileRefused as exc:
            return str(exc) if path == inventory else f"{shown(paths.display(path))}: {exc}"
    return None


class _Loop(Exception):
    """A folder under the inventory that is reached again through a symlink (a cycle Ansible would follow)."""


def _walk(root: Path) -> list[tuple[Path, int]]:
    """(path, mode) of every entry under ``root`` but folders, symlinks followed (as Ansible does); bounded in
    depth (16), files (``MAX_FILES``) and folders (``MAX_DIRS``), each folder entered once: a symlink back to a
    folder on its own path is a loop (``_Loop``, refused with one line), never a walk that does not end."""
    from knobfleet.rules import shown

    out: list[tuple[Path, int]] = []
    dirs = 0

    def walk(d: Path, depth: int, above: frozenset[tuple[int, int]]) -> None:
        nonlocal dirs
        if depth > 16 or len(out) > MAX_FILES:
            return
        dirs += 1
        if dirs > MAX_DIRS:
            raise _Loop(f"{shown(paths.display(root))}: more than {MAX_DIRS} folders; point -i at the inventory itself")
        try:
            st = os.stat(d)
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            out.append((d, 0))
            return
        here = above | {(st.st_dev, st.st_ino)}
        for entry in entries:
            if entry.name.startswith("."):
                continue  # Ansible skips hidden files
            try:
                est = os.stat(entry.path)
            except OSError:
                out.append((Path(entry.path), 0))
                continue
            if stat.S_ISDIR(est.st_mode):
                if (est.st_dev, est.st_ino) in here:
                    raise _Loop(
                        f"{shown(os.path.join(paths.display(d), entry.name))}: a symlink back to a folder above it "
                        f"({shown(paths.display(Path(os.path.realpath(entry.path))))}), a loop; "
                        "remove it"
                    )
                walk(Path(entry.path), depth + 1, here)
            else:
                out.append((Path(entry.path), est.st_mode))
            if len(out) > MAX_FILES:
                return

    walk(root, 0, frozenset())
    return out


def _cache_dir() -> Path:
    return paths.state_dir() / "cache" / "inventory"


def _read_cache(key: str) -> list[HostVars] | None:
    from knobfleet.fleet.hostvars import HostVars

    try:
        data = json.loads(safefile.read_cache(_cache_dir() / f"{key}.json") or "null")
        return [HostVars.model_validate(d) for d in data]
    except (OSError, ValueError, TypeError, RecursionError):  # RecursionError: nested past the JSON parser
        return None  # missing, unreadable, not a regular file or stale: read the inventory again


def _write_cache(key: str, hosts: list[HostVars]) -> None:
    d = _cache_dir()
    if not safefile.write_cache(d / f"{key}.json", json.dumps([hv.model_dump(mode="json") for hv in hosts])):
        return  # a cache that cannot be written only costs time
    try:
        for old in sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEEP_CACHED]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a cache that cannot be written only costs time


def load_hosts(inventory: Path, limit: str | None = None) -> list[HostVars]:
    """Hosts of ``inventory`` (optionally restricted by an Ansible ``--limit`` pattern), in order."""
    return read_hosts(inventory, limit)[0]


def read_hosts(inventory: Path, limit: str | None = None) -> tuple[list[HostVars], bool]:
    """``load_hosts``, and whether what was read may be cached by its fingerprint (no inventory script or
    plugin, no lookup/now in vars; secret values aside, which only this cache keeps out)."""
    where = paths.display(inventory)
    if not inventory.exists():
        hint = (
            "; `knobfleet init` writes one, or set inventory in knobfleet.toml"
            if paths.project() is not None
            else " (default: the project's, ANSIBLE_INVENTORY, or the running lab's)"
        )
        raise InventoryError(f"{where}: inventory not found; pass -i PATH{hint}")
    why = check_sources(inventory)
    if why:
        raise InventoryError(f"{where}: {why}")
    key = fingerprint(inventory, limit)
    cached = _read_cache(key) if key else None
    if cached is not None:
        return cached, True
    hosts, deterministic = _load(inventory, limit, where)
    if key and deterministic and not any(hv.has_secrets() for hv in hosts):  # secret values are never cached
        _write_cache(key, hosts)
    return hosts, bool(key and deterministic)


def _load(inventory: Path, limit: str | None, where: str) -> tuple[list[HostVars], bool]:
    """The hosts read through ansible-core (``ansible_inventory.load``, imported only on a cache miss), vault values
    decrypted with the secrets ``vault_secrets`` gives Ansible's loader."""
    from knobfleet.fleet import ansible_inventory

    return ansible_inventory.load(inventory, limit, where, vault_secrets)


def vault_secrets(loader: Any) -> None:
    """Give ansible's loader the vault secrets the user's Ansible setup names: ANSIBLE_VAULT_PASSWORD_FILE /
    ANSIBLE_VAULT_IDENTITY_LIST (or their ansible.cfg keys), so vault-encrypted inventory vars decrypt here
    exactly as they do for ansible-playbook."""
    from ansible import constants as C
    from ansible.cli import CLI

    env_ids = os.environ.get("ANSIBLE_VAULT_IDENTITY_LIST")
    ids = [i for i in env_ids.split(",") if i] if env_ids else list(C.DEFAULT_VAULT_IDENTITY_LIST or [])
    password_file = os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or C.DEFAULT_VAULT_PASSWORD_FILE
    files = [password_file] if password_file else []
    # Ansible's setup_vault_secrets also reads its configured default (as this process first loaded its config):
    # every file it will open is checked, not only the one named now
    _check_vault_sources([*files, C.DEFAULT_VAULT_PASSWORD_FILE or "", *(i.split("@", 1)[-1] for i in ids)])
    try:  # ansible-core >= 2.19 decrypts through an ambient context, initialized once per process
        from ansible.parsing.vault import VaultSecretsContext as context
    except ImportError:
        context = None
    if context is not None:
        context._current = None  # set anew on every inventory read (tests and long-lived callers read several)
    secrets = []
    scripted = [(vid, src) for vid, src in [("default", f) for f in files] + [_split_id(i) for i in ids]
                if src and _executable(src)]  # fmt: skip
    if scripted:  # run here, bounded: Ansible would wait for a script that never answers, and read all it writes
        from ansible.parsing.vault import VaultSecret

        secrets += [(vid, VaultSecret(_run_vault_script(src, vid))) for vid, src in scripted]
        ran = {src for _vid, src in scripted}
        files = [f for f in files if f not in ran]
        ids = [i for i in ids if _split_id(i)[1] not in ran]
    if ids or files:
        from knobfleet.fleet.ansible_inventory import quiet_display

        with quiet_display():  # its warnings repeat, over lines, the error the caller turns into one line
            secrets += CLI.setup_vault_secrets(loader, ids, vault_password_files=files, auto_prompt=False)
    if secrets:
        loader.set_vault_secrets(secrets)
    if context is not None and context._current is None:
        context._current = context(secrets=list(secrets))


VAULT_SCRIPT_TIMEOUT_S = 6.0  # a vault script that never answers ends the command within 10 s (issue 40)
VAULT_SCRIPT_MAX = 64 * 1024


def _split_id(entry: str) -> tuple[str, str]:
    label, _, source = entry.rpartition("@")
    return (label or "default"), source


def _executable(source: str) -> bool:
    path = os.path.expanduser(source)
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _run_vault_script(source: str, vault_id: str) -> bytes:
    """The password an executable vault password file prints, as Ansible reads it (its first line; a ``*-client``
    script is asked for ``--vault-id``), within ``VAULT_SCRIPT_TIMEOUT_S`` and ``VAULT_SCRIPT_MAX`` bytes: a script
    that never answers or never stops writing is stopped and refused with one line (never the output)."""
    import subprocess

    from knobfleet.rules import shown

    path = os.path.abspath(os.path.expanduser(source))  # `vault.sh` is this folder's, never one found on PATH
    argv = [path]
    if os.path.basename(path).rsplit(".", 1)[0].endswith("-client"):
        argv += ["--vault-id", vault_id]
    where = f"vault password script {shown(source)}"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError as exc:
        raise InventoryError(f"{where}: cannot run it ({exc.strerror or exc})") from None
    assert proc.stdout is not None
    import selectors
    import time

    out = bytearray()
    deadline = time.monotonic() + VAULT_SCRIPT_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or len(out) > VAULT_SCRIPT_MAX:
                proc.kill()
                proc.wait()
                why = (f"no answer within {VAULT_SCRIPT_TIMEOUT_S:g}s" if left <= 0
                       else f"wrote more than {VAULT_SCRIPT_MAX // 1024} KiB")  # fmt: skip
                raise InventoryError(f"{where}: {why}; it was stopped. Fix the script or ANSIBLE_VAULT_PASSWORD_FILE")
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    try:
        code = proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise InventoryError(f"{where}: closed its output but did not exit; it was stopped") from None
    proc.stdout.close()
    if code != 0:
        raise InventoryError(f"{where}: exited {code}; run it by hand to see why")
    password = bytes(out).strip(b"\r\n")
    if not password:
        raise InventoryError(f"{where}: printed an empty password")
    return password


def _check_vault_sources(sources: list[str]) -> None:
    """A vault password file (or script) must be a regular file of bounded size: /dev/zero or a FIFO would hang or
    fill memory inside Ansible's reader."""
    from knobfleet import safefile
    from knobfleet.rules import shown

    for source in sources:
        if not source or source in ("prompt", "prompt_ask_vault_pass"):
            continue
        try:
            safefile.check_input(Path(os.path.expanduser(source)), 64 * 1024, "vault password file")
        except safefile.FileRefused as exc:
            raise InventoryError(f"{shown(source)}: {exc}; fix --vault-password-file / --vault-id") from None


def default() -> Path:
    """The inventory a command uses without -i: KNOBFLEET_INVENTORY, else ANSIBLE_INVENTORY (one source), else
    the project's (knobfleet.toml ``inventory``), else — in a checkout — the running lab's: ``inventories/lab``
    when exactly lab1..lab3 are up as plain stand-ins, the inventory `lab up` wrote otherwise: for other sizes (so
    after ``lab up -n 2`` nothing defaults to three hosts) and whenever it carries more (a router, engine groups,
    vLLM hosts: a routed lab of 3 then drains through its router)."""
    for var in ("KNOBFLEET_INVENTORY", "ANSIBLE_INVENTORY"):
        value = os.environ.get(var, "").strip()
        if value:
            sources = [s for s in value.split(",") if s.strip()]
            if len(sources) > 1:
                raise InventoryError(
                    f"{var}={value}: {len(sources)} inventory sources; knobfleet reads one: pass -i PATH"
                )
            return Path(os.path.expanduser(sources[0].strip()))
    proj = paths.project()
    if proj is not None:
        return proj.inventory
    if paths.uses_collection() and not paths.examples():  # installed, outside any project: never the lab's
        from knobfleet.errors import UsageError

        raise UsageError(
            f"{Path.cwd()}: no knobfleet project here or above (no knobfleet.toml) and no inventory given; "
            "pass -i INVENTORY, create a project with `knobfleet init DIR`, or pass --examples for the built-in lab"
        )
    from knobfleet import labid

    lab_dir = labid.selected(paths.state_dir())
    up = set()
    for pid_file in (lab_dir / "run").glob("*.pid") if (lab_dir / "run").is_dir() else ():
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            up.add(pid_file.stem)
        except (OSError, ValueError):
            continue
    written = lab_dir / "inventory"
    other = labid.of(lab_dir).slot != 0  # another lab's addresses: inventories/lab names 127.0.1.1-3
    if up and (written / "hosts.yml").is_file() and (other or up != {"lab1", "lab2", "lab3"} or _carries_more(written)):
        return written
    return paths.default_inventory()


# What `lab up` writes into its inventory that ``inventories/lab`` does not hold: the router, engine groups, vLLM or
# SGLang hosts. A lab with any of them must be used through the written inventory, or a rollout would not drain.
_LAB_BASE_VARS = frozenset({"all/main.yml", "all/lab_ssh.yml"})


def _carries_more(written: Path) -> bool:
    gv = written / "group_vars"
    try:
        found = {p.relative_to(gv).as_posix() for p in gv.rglob("*.yml")} if gv.is_dir() else set()
    except OSError:
        return True
    return bool(found - _LAB_BASE_VARS) or (written / "host_vars").is_dir()
