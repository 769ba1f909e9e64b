"""What ran on the hosts a measurement was taken on, read from the hosts themselves when the command ends: the
profile and generation each one runs and the engine version it reports (one probe per host, read as ``history``
and ``drift`` read it). A report names them even where the record itself held none (a bench of the current
profile, an A/B's winner, a canary's hosts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.errors import KnobfleetError

if TYPE_CHECKING:
    from knobfleet.fleet.hosts import Hosts
    from knobfleet.fleet.hostvars import HostVars


def on_hosts(hosts: Sequence[HostVars], inventory: Path | Hosts) -> dict[str, dict[str, Any]]:
    """host -> {profile (name@version, None when unmanaged), generation, engine_version}, from one probe per host
    (the engine's own report of its version first, as ``drift`` reads it); {} when the hosts cannot be read (the
    measurement stands; its report then says the generation was not recorded)."""
    from knobfleet.fleet.fleetkey import fleet_key
    from knobfleet.fleet.hosts import door
    from knobfleet.ops.history import from_probe
    from knobfleet.profiles.hostversion import reported

    try:
        outcomes = door(inventory).probe(list(hosts))
    except (KnobfleetError, OSError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for hv in hosts:
        o = outcomes.get(hv.host)
        if o is None or o.error is not None or o.doc is None:
            continue
        h = from_probe(hv.host, o.doc, hv.secrets(), fleet_key())
        gen = next((g for g in h.generations if g.number == h.current), None)
        named = f"{gen.profile}@{gen.version}" if gen is not None and gen.profile else None
        out[hv.host] = {"profile": named, "generation": h.current, "engine_version": reported(o.doc)[0]}
    return out


def stamp(doc: dict[str, Any], hosts: Sequence[HostVars], inventory: Path | Hosts) -> dict[str, Any]:
    """``doc`` with what ran on ``hosts`` added: ``generations`` and ``engine_versions`` per host, its ``profile``
    (a bench of the current profile) and ``engine_version`` (one host) where the record had none."""
    seen = on_hosts(hosts, inventory)
    if not seen:
        return doc
    out = dict(doc)
    out["generations"] = {h: s["generation"] for h, s in seen.items() if s["generation"] is not None}
    versions = {h: s["engine_version"] for h, s in seen.items() if s["engine_version"]}
    if versions:
        out["engine_versions"] = versions
    if len(seen) == 1:
        (state,) = seen.values()
        out["engine_version"] = out.get("engine_version") or state["engine_version"]
        if "profile" in out and not out.get("profile"):
            out["profile"] = state["profile"]
    return out


def sides(hosts: Sequence[HostVars], inventory: Path | Hosts) -> dict[str, Any]:
    """A canary's record fields for what its hosts run: ``generations`` and ``engine_versions`` per host."""
    seen = on_hosts(hosts, inventory)
    return {
        "generations": {h: s["generation"] for h, s in seen.items() if s["generation"] is not None},
        "engine_versions": {h: s["engine_version"] for h, s in seen.items() if s["engine_version"]},
    }
