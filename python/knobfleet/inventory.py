"""Read hosts and their ``knob_serve_*`` vars through ansible-core's own inventory code.

Using ansible's InventoryManager/VariableManager means group_vars/host_vars precedence is exactly
Ansible's. ansible is imported lazily: it is slow to import and most CLI paths never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobfleet import paths
from knobfleet.errors import InventoryError
from knobfleet.hostvars import HostVars, from_inventory_vars


def load_hosts(inventory: Path, limit: str | None = None) -> list[HostVars]:
    """Hosts of ``inventory`` (optionally restricted by an Ansible ``--limit`` pattern), in order."""
    where = paths.display(inventory)
    if not inventory.exists():
        raise InventoryError(f"{where}: inventory not found; pass -i PATH (default: inventories/lab)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(inventory)])
    except AnsibleError as exc:
        raise InventoryError(f"{where}: cannot parse inventory: {exc}") from None
    if limit:
        manager.subset(limit)
    hosts = manager.get_hosts()
    if not hosts:
        what = f" matching --limit {limit!r}" if limit else ""
        raise InventoryError(f"{where}: no hosts{what}; check the pattern against `ansible-inventory --list`")
    varman = VariableManager(loader=loader, inventory=manager)
    out: list[HostVars] = []
    for host in hosts:
        raw: dict[str, Any] = varman.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=raw)
        wanted = {k: v for k, v in raw.items() if k.startswith("knob_") or k == "ansible_host"}
        try:
            resolved = templar.template(wanted, fail_on_undefined=True)
        except AnsibleError as exc:
            raise InventoryError(f"{where}: host {host.name}: cannot resolve vars: {exc}") from None
        out.append(from_inventory_vars(host.name, dict(resolved), where))
    return out
