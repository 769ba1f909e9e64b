"""Use cases: verify / drift. One probe per host, then the pure ``verify``.

The probe is the knob_probe role's module. It runs either through ``playbooks/probe.yml`` or, when every
host is reachable over plain SSH exactly as Ansible would reach it, through the SSH fast path
(transport.py): the same module function over the same multiplexed connections, without starting
``ansible-playbook`` (~0.85 s of every run; docs/PERFORMANCE.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import paths, transport
from knobfleet.errors import KnobfleetError
from knobfleet.verify import Declared, HostVerdict, unreachable, verify_host

if TYPE_CHECKING:  # kept light: the CLI imports this module to start probes before pydantic loads
    from knobfleet.hostvars import HostVars
    from knobfleet.runner import Event

TASK_PROBE = "Probe the engine service (read-only)"
PROBE_TIMEOUT_S = 60.0  # the same bound as the role's task


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


def probe_args(hv: HostVars) -> dict[str, Any]:
    """The knob_probe module's options for ``hv``: what roles/knob_probe/tasks/main.yml passes it."""
    base = f"http://{hv.listen_host}:{hv.port}"
    return {
        "service": hv.service,
        "script_path": hv.script_path,
        "unit_path": hv.unit_path,
        "state_dir": hv.service_state_dir,
        "health_url": base + hv.readiness_path,
        "info_url": base + "/get_server_info",
        "http_timeout_s": 2.0,
    }


def choose_via(hosts: list[HostVars], via: str) -> str:
    """'ssh' or 'ansible' for ``via`` (auto, ssh or ansible); --via ssh on a host the fast path cannot
    reach is an error."""
    if via == "ansible":
        return "ansible"
    reasons = [r for r in (transport.ineligible(hv) for hv in hosts) if r]
    if not reasons:
        return "ssh"
    if via == "ssh":
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise KnobfleetError(
            f"--via ssh: {reasons[0]}{more} cannot be reached over plain SSH the way Ansible reaches it; "
            "use --via auto (falls back to the playbook) or --via ansible"
        )
    return "ansible"


def probe(
    hosts: list[HostVars],
    inventory: Path,
    on_event: Callable[[Event], None] | None = None,
    via: str = "auto",
    early: transport.Started | None = None,
    plan_key: str | None = None,
) -> dict[str, dict[str, Any] | str]:
    """Each host's probe document, or the reason there is none (a string starting with 'unreachable').
    ``early``: probes started speculatively by ``start_early`` (used only where they match)."""
    if choose_via(hosts, via) == "ssh":
        return _probe_ssh(hosts, inventory, on_event, early, plan_key)
    stop_unused(early)
    return _probe_ansible(hosts, inventory, on_event)


def stop_unused(early: transport.Started | None) -> None:
    """Stop speculative probes nobody collected (an error came first, or the playbook path was chosen)."""
    for _argv, proc in (early or {}).values():
        if proc.returncode is None and proc.poll() is None:
            proc.kill()
        if proc.stdout is not None and not proc.stdout.closed:
            proc.communicate()


def probe_source() -> bytes:
    return (paths.roles_dir() / "knob_probe" / "library" / "knob_probe.py").read_bytes()


def plan_key(inventory: Path, limit: str | None) -> str | None:
    """The key under which the fast path saves this probe's ssh commands, when the inventory can be cached."""
    from knobfleet.inventory import fingerprint

    key = fingerprint(inventory, limit)
    return f"probe:{key}" if key else None


def _probe_ssh(
    hosts: list[HostVars],
    inventory: Path,
    on_event: Callable[[Event], None] | None,
    early: transport.Started | None,
    key: str | None,
) -> dict[str, dict[str, Any] | str]:
    source = probe_source()
    outcomes = transport.run_function(
        hosts,
        paths.control_dir(),
        source,
        "knob_probe",
        "probe",
        {hv.host: probe_args(hv) for hv in hosts},
        timeout_s=PROBE_TIMEOUT_S,
        plan_key=key,
        started=early,
    )
    out: dict[str, dict[str, Any] | str] = {}
    retry = []
    for hv in hosts:
        o = outcomes[hv.host]
        if o.missing_python:
            retry.append(hv)  # Ansible's interpreter discovery finds it
        elif o.error or not isinstance(o.doc, dict):
            out[hv.host] = o.error or "error: the probe returned no document"
        else:
            out[hv.host] = o.doc
    if retry:
        out.update(_probe_ansible(retry, inventory, on_event))
    return out


def start_early(inventory: Path, limit: str | None, via: str) -> tuple[transport.Started, str | None]:
    """Start the fast-path probes saved by the last run over the same inventory, first thing (see transport)."""
    key = None if via == "ansible" else plan_key(inventory, limit)
    return (transport.start_planned(key, probe_source()) if key else {}), key


def _probe_ansible(
    hosts: list[HostVars], inventory: Path, on_event: Callable[[Event], None] | None
) -> dict[str, dict[str, Any] | str]:
    from knobfleet.runner import RunRequest, run_playbook

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
    via: str = "auto",
    early: transport.Started | None = None,
    plan_key: str | None = None,
) -> list[HostVerdict]:
    docs = probe(hosts, inventory, on_event, via, early, plan_key)
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
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
