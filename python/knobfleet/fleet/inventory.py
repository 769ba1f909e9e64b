"""Read hosts and their ``knob_serve_*`` vars through ansible-core's own inventory code.

Using ansible's InventoryManager/VariableManager means group_vars/host_vars precedence is exactly
Ansible's. ansible is imported lazily: it is slow to import and most CLI paths never need it.

The result is cached under ``<state>/cache/inventory`` keyed by the sha256 of every inventory file's
path and content (plus the --limit and this model's source): reading a static inventory through
InventoryManager costs ~0.1 s, a cache hit ~2 ms. Never cached: dynamic inventories (executable files,
``plugin:`` sources) and vars whose templates call lookup/query/now, whose values can change without
any file changing. ``KNOBFLEET_INVENTORY_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
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
_NONDETERMINISTIC = ("lookup(", "query(", "q(", "now(")


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
    except (OSError, ValueError, TypeError):
        return None  # missing, unreadable, not a regular file or stale: read the inventory again


def _write_cache(key: str, hosts: list[HostVars]) -> None:
    d = _cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = d / f".{key}.{os.getpid()}"
        tmp.write_text(json.dumps([hv.model_dump(mode="json") for hv in hosts]), encoding="utf-8")
        os.replace(tmp, d / f"{key}.json")
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
        secrets += CLI.setup_vault_secrets(loader, ids, vault_password_files=files, auto_prompt=False)
    if secrets:
        loader.set_vault_secrets(secrets)
    if context is not None and context._current is None:
        context._current = context(secrets=list(secrets))


VAULT_SCRIPT_TIMEOUT_S = 20.0
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

    path = os.path.expanduser(source)
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


def _is_vaulted(value: Any) -> bool:
    """A vault-encrypted value: AnsibleVaultEncryptedUnicode (ansible-core < 2.19) or EncryptedString."""
    name = type(value).__name__
    return "Vault" in name or name == "EncryptedString"


def _plain(value: Any) -> Any:
    """Vault-encrypted values decrypted into plain strings (decryption errors surface here, as AnsibleError)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if _is_vaulted(value):
        return str(value)
    return value


def _vaulted_values(value: Any, out: set[str]) -> set[str]:
    """The decrypted text of every vault-encrypted value inside ``value``. Each dict or list is visited once, however
    many YAML aliases point at it (an alias bomb in a var nobody uses is as cheap as its text), without recursion."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict | list):
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.extend(v.values() if isinstance(v, dict) else v)
        elif _is_vaulted(v):
            out.add(str(v))
    return out


MAX_VALUES = 100_000  # values in one knobfleet host var once its YAML aliases are expanded


def expanded_size(value: Any, limit: int = MAX_VALUES) -> int:
    """How many values ``value`` holds with every YAML alias expanded (what templating or JSON would build), counted
    in time linear in its distinct nodes; stops counting past ``limit``. Pure."""
    sizes: dict[int, int] = {}
    keep: list[Any] = []  # ids stay valid while counted

    def size(v: Any, depth: int) -> int:
        if not isinstance(v, dict | list):
            return 1
        if id(v) in sizes:
            return sizes[id(v)]
        if depth > 200:  # deeper than any real var: counted as over the limit
            return limit + 1
        keep.append(v)
        total = 1
        for child in v.values() if isinstance(v, dict) else v:
            total += size(child, depth + 1)
            if total > limit:
                break
        sizes[id(v)] = total
        return total

    return size(value, 0)


# Host vars that may hold a vault value: they are secret by construction (env and flags) or never shown.
VAULT_OK = ("knob_serve_host_env", "knob_serve_host_args", "knob_serve_secret_env")


def _holds(value: Any, vaulted: set[str]) -> bool:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return any(v == text or (len(v) >= 4 and v in text) for v in vaulted)


def _refuse_vaulted_elsewhere(
    where: str, host: str, wanted: dict[str, Any], plain: dict[str, Any], vaulted: set[str]
) -> None:
    """A vault value in a knob_serve_* var other than the env and the flags (a model path, a port, a user) would be
    shown in clear in the launch line, the unit and every report: refused with one line naming the var, never the
    value. Pure."""
    for name in sorted(plain):
        if not name.startswith("knob_serve_") or name in VAULT_OK:
            continue
        if _is_vaulted(wanted.get(name)) or (vaulted and _holds(plain[name], vaulted)):
            raise InventoryError(
                f"{where}: host {host}: {name} comes from the vault, but knobfleet shows it in the launch line, the "
                "unit and every report; only knob_serve_host_env and knob_serve_host_args values are kept secret: "
                "move the secret there"
            )


def scrub(message: str, vaulted: set[str]) -> str:
    """``message`` with every vault value in it (4 characters or more) and every value shaped like a secret replaced
    by a placeholder. Pure."""
    import re

    from knobfleet.module_utils.knob_redact import SHAPES

    for v in sorted((v for v in vaulted if len(v) >= 4), key=len, reverse=True):
        message = message.replace(v, "<a vault value>")
    for _what, pattern in SHAPES:
        message = re.sub(pattern + r"\S*", "<a secret>", message)
    return message


def vault_sourced(wanted: dict[str, Any], plain: dict[str, Any], vaulted: set[str]) -> list[str]:
    """Names of host env vars and host args whose values came from vault: encrypted inline, or templated from
    a vault-encrypted var (the value holds its text). They are secret whatever their names (knob_live)."""
    names = []
    for var in ("knob_serve_host_env", "knob_serve_host_args"):
        raw, got = wanted.get(var), plain.get(var)
        if not isinstance(got, dict):
            continue
        for name, value in got.items():
            text = str(value)
            inline = isinstance(raw, dict) and _is_vaulted(raw.get(name))
            if inline or text in vaulted or any(len(v) >= 4 and v in text for v in vaulted):
                names.append(str(name))
    return names


def _load(inventory: Path, limit: str | None, where: str) -> tuple[list[HostVars], bool]:
    import warnings

    from knobfleet.fleet import ansible_cfg
    from knobfleet.fleet.hostvars import SECRET_VARS, attach_groups, connection_vars, from_inventory_vars

    ansible_cfg.config_file(paths.project_root())  # an ansible.cfg that is a FIFO or device: one line, not a hang
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        vault_secrets(loader)
    except AnsibleError as exc:
        raise InventoryError(f"{where}: cannot read the vault password: {str(exc).splitlines()[0]}") from None
    check = f"check it with `ansible-inventory -i {where} --list`"
    with _quiet_display() as parse_warnings:  # Ansible's parse warnings quote the file's lines: never shown
        try:
            manager = InventoryManager(loader=loader, sources=[str(inventory)])
        except AnsibleError as exc:
            line = re.search(r"line (\d+)", str(exc))
            at = f" near line {line.group(1)}" if line else ""
            raise InventoryError(f"{where}: cannot parse inventory{at}; {check}") from None
    everyone = manager.get_hosts()
    if limit:
        manager.subset(limit)
    hosts = manager.get_hosts()
    if not hosts and any("parse" in w for w in parse_warnings):
        raise InventoryError(f"{where}: not a YAML or INI inventory Ansible can parse; {check}")
    if not hosts:
        what = f" matching --limit {limit!r}" if limit else ""
        raise InventoryError(f"{where}: no hosts{what}; check the pattern against `ansible-inventory --list`")
    varman = VariableManager(loader=loader, inventory=manager)
    out: list[HostVars] = []
    group_decls: dict[str, Any] = {}  # each host's knob_engine_groups
    deterministic = True
    for host in hosts:
        try:
            raw: dict[str, Any] = varman.get_vars(host=host, include_hostvars=False)
        except AnsibleError as exc:  # a vars file Ansible cannot parse: its text may quote a secret, never shown
            raise InventoryError(_vars_file_error(where, host.name, str(exc), check)) from None
        templar = Templar(loader=loader, variables=raw)
        wanted = {k: v for k, v in raw.items() if k.startswith("knob_") or k in connection_vars()}
        for k, v in wanted.items():
            if expanded_size(v) > MAX_VALUES:
                raise InventoryError(
                    f"{where}: host {host.name}: {k} holds more than {MAX_VALUES:,} values once its YAML aliases are "
                    "expanded (an alias bomb?) or nests deeper than 200; write it out plainly"
                )
        text = json.dumps(wanted, default=lambda o: "lookup(vault)" if _is_vaulted(o) else str(o))
        deterministic = deterministic and not any(call in text for call in _NONDETERMINISTIC)
        secrets = {k: True for k in SECRET_VARS if raw.get(k)}
        try:
            resolved = templar.template(wanted, fail_on_undefined=True)
            plain = _plain(resolved)
            vaulted = _vaulted_values(raw, set())
            _refuse_vaulted_elsewhere(where, host.name, wanted, plain, vaulted)
            sourced = vault_sourced(wanted, plain, vaulted)
            if sourced:
                declared = plain.get("knob_serve_secret_env")
                plain["knob_serve_secret_env"] = [*(declared if isinstance(declared, list) else []), *sourced]
            try:
                out.append(from_inventory_vars(host.name, {**plain, **secrets}, where))
            except InventoryError as exc:  # a validation message quotes the value: never a vault value or a token
                raise InventoryError(scrub(str(exc), vaulted)) from None
            group_decls[host.name] = plain.get("knob_engine_groups")
        except AnsibleError as exc:
            text = str(exc).splitlines()[0]
            if "vault" in text.lower():
                raise InventoryError(
                    f"{where}: host {host.name}: a vault-encrypted var cannot be decrypted ({text}); set "
                    "ANSIBLE_VAULT_PASSWORD_FILE (or vault_password_file in ansible.cfg) to its password file"
                ) from None
            raise InventoryError(f"{where}: host {host.name}: cannot resolve vars: {text}") from None
    if any(d not in (None, {}, "") for d in group_decls.values()):
        addresses = {hv.host: hv.address for hv in out}
        for host in everyone:  # ranks a --limit left out still name rank 0's address
            if host.name not in addresses:
                raw = varman.get_vars(host=host, include_hostvars=False)
                addresses[host.name] = str(
                    Templar(loader=loader, variables=raw).template(raw.get("ansible_host", host.name))
                )
        out = attach_groups(out, group_decls, addresses, where)
    return out, deterministic


def _vars_file_error(where: str, host: str, text: str, check: str) -> str:
    """One line for a vars file Ansible could not parse: the file and the line, never the offending text (Ansible's
    message quotes the line, which may hold a token)."""
    from knobfleet.rules import shown

    found = re.search(r"The error appears to be in '([^']+)': line (\d+)", text)
    if found:
        at = f"{shown(paths.display(Path(found.group(1))))}, near line {found.group(2)}"
        return f"{where}: host {host}: cannot parse {at} (a YAML or JSON syntax error); {check}"
    return f"{where}: host {host}: cannot read its vars (a vars file Ansible cannot parse); {check}"


@contextlib.contextmanager
def _quiet_display() -> Iterator[list[str]]:
    """Collect (instead of printing) Ansible's warnings while an inventory is parsed: they quote file contents."""
    from ansible.utils.display import Display

    display = Display()
    seen: list[str] = []

    def collect(msg: str, formatted: bool = False, **_: Any) -> None:
        seen.append(str(msg))

    display.warning = collect
    try:
        yield seen
    finally:
        del display.warning


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
    lab_dir = paths.state_dir() / "lab"
    up = set()
    for pid_file in (lab_dir / "run").glob("*.pid") if (lab_dir / "run").is_dir() else ():
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            up.add(pid_file.stem)
        except (OSError, ValueError):
            continue
    written = lab_dir / "inventory"
    if up and (written / "hosts.yml").is_file() and (up != {"lab1", "lab2", "lab3"} or _carries_more(written)):
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
