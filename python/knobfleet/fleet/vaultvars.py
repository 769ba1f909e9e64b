"""Vault values in the inventory vars Ansible resolved (pure): which values are vault-encrypted, their decrypted
text, how many values a var holds once its YAML aliases are expanded, a vault value refused outside the env and the
flags, messages scrubbed of vault values, and the host env and args names a vault value reached.

Only an inventory read through Ansible (``ansible_inventory.py``, a cache miss) uses them.
"""

from __future__ import annotations

import json
from typing import Any

from knobfleet.errors import InventoryError


def is_vaulted(value: Any) -> bool:
    """A vault-encrypted value: AnsibleVaultEncryptedUnicode (ansible-core < 2.19) or EncryptedString."""
    name = type(value).__name__
    return "Vault" in name or name == "EncryptedString"


def plain_value(value: Any) -> Any:
    """Vault-encrypted values decrypted into plain strings (decryption errors surface here, as AnsibleError)."""
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    if is_vaulted(value):
        return str(value)
    return value


def _leaves(value: Any, keep: Any) -> set[str]:
    """The text of every leaf inside ``value`` that ``keep`` accepts. Each dict or list is visited once, however many
    YAML aliases point at it (an alias bomb in a var nobody uses is as cheap as its text), without recursion."""
    out: set[str] = set()
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict | list):
            if id(v) not in seen:
                seen.add(id(v))
                stack.extend(v.values() if isinstance(v, dict) else v)
        elif keep(v):
            out.add(str(v))
    return out


def vaulted_values(value: Any, out: set[str]) -> set[str]:
    """The decrypted text of every vault-encrypted value inside ``value``, added to ``out``."""
    return out | _leaves(value, is_vaulted)


def file_values(docs: list[Any]) -> set[str]:
    """Every string of the vars files Ansible decrypted (``ansible-vault encrypt group_vars/all/vault.yml``): each
    var of such a file is from the vault, whatever its type after decryption (a plain ``str`` there, not the inline
    ``!vault`` type). Pure."""
    return _leaves(list(docs), lambda v: isinstance(v, str) and bool(v))


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


def refuse_vaulted_elsewhere(
    where: str, host: str, wanted: dict[str, Any], plain: dict[str, Any], vaulted: set[str]
) -> None:
    """A vault value in a knob_serve_* var other than the env and the flags (a model path, a port, a user) would be
    shown in clear in the launch line, the unit and every report: refused with one line naming the var, never the
    value. Pure."""
    for name in sorted(plain):
        if not name.startswith("knob_serve_") or name in VAULT_OK:
            continue
        if is_vaulted(wanted.get(name)) or (vaulted and _holds(plain[name], vaulted)):
            raise InventoryError(
                f"{where}: host {host}: {name} comes from the vault, but knobfleet shows it in the launch line, the "
                "unit and every report; only knob_serve_host_env and knob_serve_host_args values are kept secret: "
                "move the secret there"
            )


def scrub(message: str, vaulted: set[str]) -> str:
    """``message`` with every vault value in it (4 characters or more) and every value shaped like a secret replaced
    by a placeholder: the controller's one rule (``secretrule.scrub``), which also knows every vault value the
    process decrypted before."""
    from knobfleet import secretrule

    return secretrule.scrub(message, vaulted)


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
            inline = isinstance(raw, dict) and is_vaulted(raw.get(name))
            if inline or text in vaulted or any(len(v) >= 4 and v in text for v in vaulted):
                names.append(str(name))
    return names
