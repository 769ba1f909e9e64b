"""An inventory read through ansible-core's own code (InventoryManager/VariableManager), so group_vars/host_vars
precedence is exactly Ansible's: the hosts a ``--limit`` keeps, each one's ``knob_*`` and connection vars resolved
(templated, vault values decrypted), checked and turned into host vars, and the engine groups across them.

Only an inventory cache miss gets here (``fleet.inventory.read_hosts``, through its ``_load``): this module, ansible
and pydantic are imported then, never on a cached read. Ansible's own messages may quote a vars file's lines (a
token in them): an error names the file and the line, and validation messages are scrubbed of vault values.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import paths, secretrule
from knobfleet.errors import InventoryError
from knobfleet.fleet.vaultvars import (
    MAX_VALUES,
    expanded_size,
    file_values,
    is_vaulted,
    plain_value,
    refuse_vaulted_elsewhere,
    scrub,
    vault_sourced,
    vaulted_values,
)
from knobfleet.rules import shown

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars

_NONDETERMINISTIC = ("lookup(", "query(", "q(", "now(")


def load(
    inventory: Path, limit: str | None, where: str, vault_secrets: Callable[[Any], None]
) -> tuple[list[HostVars], bool]:
    """The hosts of ``inventory`` (``limit``: an Ansible ``--limit`` pattern), in order, and whether their vars
    may be cached (none calls lookup/query/now). ``vault_secrets`` gives Ansible's loader the vault secrets the
    user's setup names (``fleet.inventory.vault_secrets``)."""
    import warnings

    from knobfleet.fleet import ansible_cfg
    from knobfleet.fleet.hostvars import attach_groups

    ansible_cfg.config_file(paths.project_root())  # an ansible.cfg that is a FIFO or device: one line, not a hang
    with warnings.catch_warnings():  # ansible-core's modules, imported here once with their warnings off
        warnings.simplefilter("ignore")
        import ansible.errors
        import ansible.inventory.manager
        import ansible.parsing.dataloader
        import ansible.template
        import ansible.vars.manager

    _forget_vars_files()
    loader = ansible.parsing.dataloader.DataLoader()
    decrypted = _track_vault_files(loader)
    try:
        vault_secrets(loader)
    except ansible.errors.AnsibleError as exc:
        raise InventoryError(f"{where}: cannot read the vault password: {str(exc).splitlines()[0]}") from None
    check = f"check it with `ansible-inventory -i {where} --list`"
    manager, everyone, hosts = _parse(loader, inventory, limit, where, check)
    varman = ansible.vars.manager.VariableManager(loader=loader, inventory=manager)
    out: list[HostVars] = []
    group_decls: dict[str, Any] = {}  # each host's knob_engine_groups
    deterministic = True
    for host in hosts:
        hv, declared, fixed = _host_vars(loader, varman, host, where, check, decrypted)
        out.append(hv)
        group_decls[host.name] = declared
        deterministic = deterministic and fixed
    if any(d not in (None, {}, "") for d in group_decls.values()):
        out = attach_groups(out, group_decls, _addresses(loader, varman, out, everyone), where)
    return out, deterministic


def _forget_vars_files() -> None:
    """Ansible's host_group_vars plugin keeps, per process, the vars files it found in each folder: a later read in
    the same process (``drift --watch``, a lab rebooted by the same test session) would look for a group_vars file
    removed since and fail as a vars file it cannot parse. Every read looks again."""
    try:
        from ansible.plugins.vars import host_group_vars
    except ImportError:
        return
    found = getattr(host_group_vars, "FOUND", None)
    if isinstance(found, dict):
        found.clear()


def _parse(loader: Any, inventory: Path, limit: str | None, where: str, check: str) -> tuple[Any, Any, Any]:
    """Ansible's InventoryManager over ``inventory``, every host in it and the hosts ``limit`` keeps (at least
    one, else an InventoryError whose line quotes nothing of the file)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager

    with quiet_display() as parse_warnings:  # Ansible's parse warnings quote the file's lines: never shown
        try:
            manager = InventoryManager(loader=loader, sources=[str(inventory)])
        except AnsibleError as exc:
            line = re.search(r"line (\d+)", str(exc))
            at = f" near line {line.group(1)}" if line else ""
            raise InventoryError(f"{where}: cannot parse inventory{at}; {check}") from None
        everyone = manager.get_hosts()
        if limit:  # its "Could not match supplied host pattern" warning quotes the pattern raw: never shown
            manager.subset(limit)
        hosts = manager.get_hosts()
    if not hosts and any("parse" in w for w in parse_warnings):
        raise InventoryError(f"{where}: not a YAML or INI inventory Ansible can parse; {check}")
    if not hosts:
        what = f" matching --limit {_pattern(limit)}" if limit else ""
        raise InventoryError(f"{where}: no hosts{what}; check the pattern against `ansible-inventory --list`")
    return manager, everyone, hosts


def _pattern(limit: str) -> str:
    """A --limit pattern for a one-line message: invisible characters escaped, a long one cut."""
    text = shown(limit)
    text = f"'{text}'" if text == limit else text  # shown() quotes only what it escapes
    return text if len(text) <= 120 else f"{text[:117]}... ({len(limit)} characters)"


def _track_vault_files(loader: Any) -> list[Any]:
    """The parsed content of every vault-encrypted file ``loader`` decrypts from now on (Ansible's DataLoader says
    which with its ``show_content`` flag): their vars are from the vault too, though they decrypt to plain strings."""
    found: list[Any] = []
    decrypt = loader._decrypt_if_vault_data

    def tracked(b_data: bytes, b_file_name: bytes | None = None) -> tuple[bytes, bool]:
        data, show = decrypt(b_data, b_file_name)
        if not show:
            with contextlib.suppress(Exception):  # a file Ansible itself then refuses: its own error says why
                found.append(loader.load(data, show_content=False))
        return data, show

    loader._decrypt_if_vault_data = tracked
    return found


def _host_vars(
    loader: Any,
    varman: Any,
    host: Any,
    where: str,
    check: str,
    decrypted: list[Any] = (),  # type: ignore[assignment]
) -> tuple[HostVars, Any, bool]:
    """One host's vars as Ansible resolves them: its host vars, its ``knob_engine_groups`` and whether they may be
    cached (no lookup/query/now). A vault value is refused where knobfleet would show it, names the host env and
    args it reached as secret, and never appears in a message."""
    from ansible.errors import AnsibleError
    from ansible.template import Templar

    from knobfleet.fleet.hostvars import SECRET_VARS, connection_vars, from_inventory_vars

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
    text = json.dumps(wanted, default=lambda o: "lookup(vault)" if is_vaulted(o) else str(o))
    fixed = not any(call in text for call in _NONDETERMINISTIC)
    secrets = {k: True for k in SECRET_VARS if raw.get(k)}
    try:
        resolved = templar.template(wanted, fail_on_undefined=True)
        plain = plain_value(resolved)
        vaulted = vaulted_values(raw, set()) | file_values(decrypted)  # inline !vault, and vault-encrypted files
        secretrule.remember(vaulted)  # no later message of this process shows one
        refuse_vaulted_elsewhere(where, host.name, wanted, plain, vaulted)
        sourced = vault_sourced(wanted, plain, vaulted)
        if sourced:
            declared = plain.get("knob_serve_secret_env")
            plain["knob_serve_secret_env"] = [*(declared if isinstance(declared, list) else []), *sourced]
        try:
            hv = from_inventory_vars(host.name, {**plain, **secrets}, where)
        except InventoryError as exc:  # a validation message quotes the value: never a vault value or a token
            raise InventoryError(scrub(str(exc), vaulted)) from None
        return hv, plain.get("knob_engine_groups"), fixed
    except AnsibleError as exc:
        text = str(exc).splitlines()[0]
        if "vault" in text.lower():
            raise InventoryError(
                f"{where}: host {host.name}: a vault-encrypted var cannot be decrypted ({text}); set "
                "ANSIBLE_VAULT_PASSWORD_FILE (or vault_password_file in ansible.cfg) to its password file"
            ) from None
        raise InventoryError(f"{where}: host {host.name}: cannot resolve vars: {text}") from None


def _addresses(loader: Any, varman: Any, out: list[HostVars], everyone: Any) -> dict[str, str]:
    """Every host's address, the hosts a ``--limit`` left out included: their ranks still name rank 0's."""
    from ansible.template import Templar

    addresses = {hv.host: hv.address for hv in out}
    for host in everyone:  # ranks a --limit left out still name rank 0's address
        if host.name not in addresses:
            raw = varman.get_vars(host=host, include_hostvars=False)
            addresses[host.name] = str(
                Templar(loader=loader, variables=raw).template(raw.get("ansible_host", host.name))
            )
    return addresses


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
def quiet_display() -> Iterator[list[str]]:
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
