"""The read path's view of the fleet: for each host, how to reach it, the probe's options, its declared engine and
profile; for each engine, its part of the live-state rule. Plain data, cached, so ``drift`` and ``verify`` import
neither pydantic nor the catalogs (nor ansible) when nothing they depend on changed.

The cache (``<state>/cache/readpath/<key>.json``) is keyed by the inventory's fingerprint (every inventory file,
the --limit, the host-vars model: ``inventory.fingerprint``), every catalog file knobfleet would read, the
knob_serve role's defaults (the model's defaults) and the source of the code that turns them into this view.
It is written only when the inventory itself is cacheable (no inventory script or plugin, no lookup/now in
vars). It holds no secret: the probe's options name secret env vars but never carry a value.
``KNOBFLEET_INVENTORY_CACHE=0`` turns it off with the inventory cache.

This module is standard library only; ``build`` imports the validated models on a miss.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import paths
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.module_utils.knob_doc import ProbeDoc

SCHEMA = 1
KEEP_CACHED = 32
_PKG = Path(__file__).resolve().parent.parent
# The code that makes the view: a change in any of it is a miss (an editable checkout changes without a version).
_SOURCES = (
    "fleet/readhost.py",
    "fleet/probe.py",
    "fleet/hostvars.py",
    "groups.py",
    "engines/adapter.py",
    "profiles/catalog.py",
    "profiles/merge.py",
    "profiles/model.py",
)


@dataclass(frozen=True)
class ReadHost:
    """One host as the read path needs it (a ``transports.base.Target``)."""

    host: str
    address: str
    connection: dict[str, str]
    probe: dict[str, Any]
    engine: str | None = None
    profile: str | None = None
    group: dict[str, Any] | None = None  # the engine group this host is a rank of (groups.EngineGroup as JSON)
    router: dict[str, str] | None = None  # the router that fronts it: {"kind", "url", "worker"} (knob_router_*)


class LazyRules(Mapping[str, dict[str, Any]]):
    """Each engine's rule part, built from its catalog on first use (the uncached path); an engine without a
    readable catalog is absent."""

    def __init__(self) -> None:
        self._got: dict[str, dict[str, Any] | None] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._got:
            from knobfleet.engines.adapter import engine
            from knobfleet.errors import KnobfleetError

            try:
                self._got[name] = engine(name).rules()
            except KnobfleetError:
                self._got[name] = None
        got = self._got[name]
        if got is None:
            raise KeyError(name)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, v in self._got.items() if v is not None)

    def __len__(self) -> int:
        return sum(v is not None for v in self._got.values())


@dataclass(frozen=True)
class ReadPlan:
    hosts: list[ReadHost]
    engines: Mapping[str, dict[str, Any]]
    default_engine: str
    cached: bool = field(default=False, compare=False)

    def rules_for(self, host: ReadHost, doc: dict[str, Any]) -> dict[str, Any]:
        """The engine part of the rule for ``host``: its declared engine, else the one its current generation
        recorded, else the default engine (as ``ops.drift.engine_rules``)."""
        name = host.engine or recorded_engine(doc)
        try:
            return self.engines[name or self.default_engine]
        except KeyError:
            return self.engines[host.engine or self.default_engine]


def recorded_engine(doc: ProbeDoc | dict[str, Any]) -> str | None:
    """The engine the host's current generation recorded in its meta.json, if any."""
    gens = doc.get("generations") or {}
    for entry in gens.get("list") or []:
        if isinstance(entry, dict) and entry.get("generation") == gens.get("current"):
            recorded = (entry.get("meta") or {}).get("engine")
            return recorded if isinstance(recorded, str) else None
    return None


def from_hostvars(hv: HostVars) -> ReadHost:
    from knobfleet.fleet.probe import probe_args

    group = asdict(hv.group) if hv.group is not None else None
    router = {"kind": hv.router_kind, "url": hv.router_url, "worker": hv.base_url} if hv.router_url else None
    return ReadHost(hv.host, hv.address, dict(hv.connection), probe_args(hv), hv.engine, hv.profile, group, router)


def plan_from_hostvars(hosts: Sequence[HostVars]) -> ReadPlan:
    """The view of already validated hosts (engine rules read from the catalogs as needed)."""
    from knobfleet.profiles.catalog import default_engine

    return ReadPlan([from_hostvars(hv) for hv in hosts], LazyRules(), default_engine())


# --- the cache -------------------------------------------------------------------------------------------


def _catalog_files() -> list[Path]:
    dirs = [paths.catalogs_dir(), *paths.catalog_overlay_dirs()]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir():
            out += sorted(p for p in d.rglob("*.yaml") if p.is_file())
    return out


def key(inventory: Path, limit: str | None) -> str | None:
    """The cache key of the view of ``inventory`` / ``limit``, or None when it cannot be cached."""
    from knobfleet.fleet.inventory import fingerprint

    inv = fingerprint(inventory, limit)
    if inv is None:
        return None
    h = sha256(f"readpath-{SCHEMA}\0{inv}\0{paths.catalogs_dir()}\0".encode())
    for rel in _SOURCES:
        with open(_PKG / rel, "rb") as fh:
            h.update(rel.encode() + b"\0" + fh.read())
    for f in [*_catalog_files(), *_role_defaults()]:
        h.update(f"\0{f}\0".encode() + f.read_bytes())
    return str(h.hexdigest())


def _role_defaults() -> list[Path]:
    """The knob_serve role's defaults: the host-var model takes its defaults (service, script path…) from there."""
    f = paths.roles_dir() / "knob_serve" / "defaults" / "main.yml"
    return [f] if f.is_file() else []


def _cache_file(k: str) -> Path:
    return paths.state_dir() / "cache" / "readpath" / f"{k}.json"


def to_json(plan: ReadPlan) -> str:
    engines = {name: plan.engines[name] for name in sorted(plan.engines)}
    return json.dumps(
        {"hosts": [asdict(h) for h in plan.hosts], "engines": engines, "default_engine": plan.default_engine}
    )


def from_json(text: str) -> ReadPlan:
    data = json.loads(text)
    hosts = [
        ReadHost(
            str(h["host"]),
            str(h["address"]),
            {str(k): str(v) for k, v in h["connection"].items()},
            dict(h["probe"]),
            h.get("engine"),
            h.get("profile"),
            h.get("group"),
            h.get("router"),
        )
        for h in data["hosts"]
    ]
    return ReadPlan(hosts, dict(data["engines"]), str(data["default_engine"]), cached=True)


def load(inventory: Path, limit: str | None) -> ReadPlan | None:
    """The cached view, or None (not cacheable, not cached yet, or unreadable)."""
    k = key(inventory, limit) if inventory.exists() else None
    if k is None:
        return None
    try:
        from knobfleet import safefile

        text = safefile.read_cache(_cache_file(k))
        return None if text is None else from_json(text)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _save(k: str, plan: ReadPlan) -> None:
    from knobfleet import safefile

    path = _cache_file(k)
    if not safefile.write_cache(path, to_json(plan)):
        return  # only costs time next run
    try:
        for old in sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEEP_CACHED]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # only costs time next run


def build(inventory: Path, limit: str | None) -> ReadPlan:
    """The view from the inventory and the catalogs (validated: pydantic, ansible on an inventory miss); saved
    for the next run when the inventory is cacheable."""
    from knobfleet.engines.adapter import engine
    from knobfleet.errors import KnobfleetError
    from knobfleet.fleet.inventory import read_hosts
    from knobfleet.profiles.catalog import default_engine, engine_names

    hosts, cacheable = read_hosts(inventory, limit)
    rules: dict[str, dict[str, Any]] = {}
    for name in engine_names():
        try:
            rules[name] = engine(name).rules()
        except KnobfleetError:
            continue  # as LazyRules: an engine whose catalog cannot be read falls back to the host's or default
    plan = ReadPlan([from_hostvars(hv) for hv in hosts], rules, default_engine())
    k = key(inventory, limit) if cacheable else None
    if k is not None:
        _save(k, plan)
    return plan


def plan_for(inventory: Path, limit: str | None) -> ReadPlan:
    """The cached view when there is one, else ``build``."""
    return load(inventory, limit) or build(inventory, limit)
