"""Use cases: verify / drift. One probe per host through a transport (fleet/probe.py), then the one live-state
rule against the host's current generation (live/verify.py). Nothing is changed on any host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.errors import KnobfleetError
from knobfleet.fleet import probe as probing
from knobfleet.live.verify import Declared, HostVerdict, unreachable, verify_host

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars


def _declared(hv: HostVars, cache: dict[str, Declared | str]) -> Declared | str | None:
    if not hv.profile:
        return None
    if hv.profile not in cache:
        from knobfleet.profiles.store import ProfileStore

        try:
            p = ProfileStore().resolve(hv.profile)
            cache[hv.profile] = Declared(p.name, p.version, p.content_hash)
        except KnobfleetError as exc:
            cache[hv.profile] = f"knob_profile {hv.profile!r} cannot be resolved: {str(exc).splitlines()[0]}"
    return cache[hv.profile]


def engine_rules(hv: HostVars, doc: dict[str, Any]) -> dict[str, Any]:
    """The engine part of the rule for ``hv``: its declared engine, else the one its current generation
    recorded, else the default engine."""
    name = hv.engine
    if name is None:
        gens = doc.get("generations") or {}
        for entry in gens.get("list") or []:
            if isinstance(entry, dict) and entry.get("generation") == gens.get("current"):
                recorded = (entry.get("meta") or {}).get("engine")
                name = recorded if isinstance(recorded, str) else None
    try:
        return hv.adapter(name).rules()
    except KnobfleetError:
        return hv.adapter().rules()


def verdict_for(hv: HostVars, doc: dict[str, Any], declared: Declared | None) -> HostVerdict:
    return verify_host(hv.host, doc, declared, engine_rules(hv, doc))


def check(
    hosts: list[HostVars],
    inventory: Path,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    save_probes: Path | None = None,
    via: str = "auto",
) -> list[HostVerdict]:
    outcomes = probing.probe(hosts, inventory, via, on_event)
    if save_probes is not None:
        import json

        save_probes.mkdir(parents=True, exist_ok=True)
        for host, o in outcomes.items():
            if o.doc is not None:
                write_atomic(save_probes / f"{host}.json", json.dumps(o.doc, indent=1, sort_keys=True) + "\n")
    cache: dict[str, Declared | str] = {}
    verdicts = []
    for hv in hosts:
        o = outcomes[hv.host]
        if o.error is not None:
            if o.error.kind == "unreachable":
                verdicts.append(unreachable(hv.host, str(o.error)))
            else:
                verdicts.append(HostVerdict(hv.host, "error", error=str(o.error)))
            continue
        declared = _declared(hv, cache)
        if isinstance(declared, str):
            verdicts.append(HostVerdict(hv.host, "error", error=declared))
            continue
        verdicts.append(verdict_for(hv, o.doc, declared))
    return verdicts


def write_atomic(path: Path, text: str) -> None:
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run_testinfra(inventory: Path, limit: str | None, quiet: bool) -> int:
    """``verify --testinfra``: the shipped host checks (tests/testinfra) against the same hosts."""
    import subprocess
    import sys

    from knobfleet import paths

    tests = paths.project_root() / "tests" / "testinfra"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--hosts=ansible://{limit or 'all'}",
        f"--ansible-inventory={inventory.resolve()}",
        str(tests),
    ]
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # ansible-inventory
    proc = subprocess.run(cmd, capture_output=quiet, text=True, cwd=paths.project_root(), env=env)
    return proc.returncode
