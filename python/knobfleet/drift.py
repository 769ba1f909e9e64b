"""Use cases: verify / drift. One probe task per host through Ansible, then the pure ``verify``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from knobfleet.errors import KnobfleetError
from knobfleet.hostvars import HostVars
from knobfleet.runner import Event, RunRequest, run_playbook
from knobfleet.verify import Declared, HostVerdict, unreachable, verify_host

TASK_PROBE = "Probe the engine service (read-only)"


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


def known_knobs() -> tuple[str, ...]:
    from knobfleet.profiles.catalog import catalog_for

    names: list[str] = []
    for engine in ("sglang", "vllm"):
        try:
            names += list(catalog_for(engine).env_knobs())
        except KnobfleetError:
            continue
    return tuple(names)


def probe(
    hosts: list[HostVars], inventory: Path, on_event: Callable[[Event], None] | None = None
) -> dict[str, dict[str, Any] | str]:
    """Each host's probe document, or the reason there is none (a string starting with 'unreachable')."""
    result = run_playbook(
        RunRequest(
            playbook="probe.yml",
            inventory=inventory,
            limit=",".join(hv.host for hv in hosts),
            forks=min(max(len(hosts), 1), 64),
            on_event=on_event,
        )
    )
    out: dict[str, dict[str, Any] | str] = {}
    for hv in hosts:
        hr = result.host(hv.host)
        doc = hr.results.get(TASK_PROBE, {}).get("probe")
        if hr.unreachable:
            out[hv.host] = "unreachable: " + hr.first_failure().removeprefix(f"{TASK_PROBE}: ").removeprefix(
                "unreachable: "
            )
        elif not hr.success or not isinstance(doc, dict):
            out[hv.host] = "error: " + hr.first_failure()
        else:
            out[hv.host] = doc
    return out


def check(
    hosts: list[HostVars],
    inventory: Path,
    on_event: Callable[[Event], None] | None = None,
    save_probes: Path | None = None,
) -> list[HostVerdict]:
    docs = probe(hosts, inventory, on_event)
    if save_probes is not None:
        import json

        save_probes.mkdir(parents=True, exist_ok=True)
        for host, doc in docs.items():
            if isinstance(doc, dict):
                write_atomic(save_probes / f"{host}.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    cache: dict[str, Declared | str] = {}
    knobs = known_knobs()
    verdicts = []
    for hv in hosts:
        doc = docs[hv.host]
        if isinstance(doc, str):
            if doc.startswith("unreachable"):
                verdicts.append(unreachable(hv.host, doc))
            else:
                verdicts.append(HostVerdict(hv.host, "error", error=doc))
            continue
        declared = _declared(hv, cache)
        if isinstance(declared, str):
            verdicts.append(HostVerdict(hv.host, "error", error=declared))
            continue
        verdicts.append(verify_host(hv.host, doc, declared, knobs))
    return verdicts


def prometheus(verdicts: list[HostVerdict]) -> str:
    """Prometheus textfile-collector format."""

    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    lines = [
        "# HELP knobfleet_drift_findings Findings per host and kind from the last knobfleet drift run.",
        "# TYPE knobfleet_drift_findings gauge",
    ]
    for v in verdicts:
        counts: dict[str, int] = {}
        for f in v.findings:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        for kind, n in sorted(counts.items()):
            lines.append(f'knobfleet_drift_findings{{host="{esc(v.host)}",kind="{kind}"}} {n}')
    lines += [
        "# HELP knobfleet_profile_info Profile each host's current generation runs.",
        "# TYPE knobfleet_profile_info gauge",
    ]
    for v in verdicts:
        if v.profile is not None:
            lines.append(
                f'knobfleet_profile_info{{host="{esc(v.host)}",profile="{esc(v.profile)}",'
                f'version="{v.version}",hash="{esc(v.hash)}"}} 1'
            )
    lines += [
        "# HELP knobfleet_probe_success Whether the host could be probed (1) or not (0).",
        "# TYPE knobfleet_probe_success gauge",
    ]
    for v in verdicts:
        lines.append(
            f'knobfleet_probe_success{{host="{esc(v.host)}"}} {0 if v.status in ("unreachable", "error") else 1}'
        )
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
