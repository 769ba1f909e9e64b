"""The apply's pre-check: one quick probe per host decides whether it is in sync (left alone), refused (the engine
version it runs lacks a knob, another run holds its lock, a foreign drop-in...) or goes on to the rollout; in a
plan (``--check``) what would change. Also the apply's options. The rollout itself is ``ops/apply.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.fleet.hosts import Hosts, door
from knobfleet.fleet.hostvars import HostVars
from knobfleet.live.verify import Declared
from knobfleet.ops import plan
from knobfleet.ops.outcome import IN_SYNC, HostOutcome
from knobfleet.profiles.model import Profile
from knobfleet.render import Rendered


@dataclass(frozen=True)
class Options:
    check: bool = False
    serial: str | None = None
    canary: bool = False
    max_fail_percent: float = 0.0
    break_lock: bool = False
    rollback_fleet: bool = False
    via: str = "auto"
    foreign_dropins: str | None = None  # None: each host's knob_serve_foreign_dropins
    overrides: dict[str, Any] = field(default_factory=dict)
    force_restart: bool = False  # behind a router: a drain that times out restarts anyway (requests dropped)
    # apply --gate: judges each host of a batch before it is put back (ops/apply_gate.py); a verdict has host,
    # passed, reason and as_json(). Hosts already in sync go through the batches too, to be judged.
    gate: Any = None
    # Told the rollout's restarts and what they will cost (ops/restart_cost.Cost.lines) once the pre-check has
    # read the hosts' ledgers, before the first batch starts: the CLI prints them.
    announce: Any = None


def from_plan(p: plan.HostPlan, check: bool, current: int | None) -> HostOutcome:
    """The outcome of a host decided by the pre-check alone (in sync, refused, or — in a plan — pending)."""
    if p.refused:
        return HostOutcome(
            p.host, "refused", 0, current, current, message=str(p.refusal), actions=p.actions, findings=p.findings
        )
    if p.in_sync:
        return HostOutcome(
            p.host,
            "in-sync" if check else "unchanged",
            0,
            current,
            current,
            main_pid=p.main_pid,
            message="no change" if check else IN_SYNC,
            seen=p.seen,
        )
    kinds = sorted({f.kind.value for f in p.findings})
    return HostOutcome(
        p.host,
        "pending",
        0,
        current,
        current,
        restarted=bool({"restart", "start"} & set(p.actions)),
        main_pid=p.main_pid,
        message=f"would {', '.join(p.actions)} ({', '.join(kinds)})",
        actions=p.actions,
        findings=p.findings,
        seen=p.seen,
        diffs=p.diffs,
        knob_changes=p.knob_changes,
        cache_cold=p.cache_cold,
    )


def version_refusal(
    profile: Profile,
    hv: HostVars,
    doc: dict[str, Any],
    catalog_dir: Path | None = None,
    notes: dict[str, str] | None = None,
) -> str | None:
    """Why ``profile`` cannot go to this host, given the engine version it runs (``hostversion.host_version``: the first
    of ``knob_serve_engine_version``, the engine's own server info, the package metadata of its launcher's
    environment, the first line of ``knob_serve_version_file``): a knob that version lacks or rejects, a version with
    no synced catalog, a version file that cannot be read, or another version than the profile pins on a host naming
    no installs. None: the host runs the version the profile was validated on, or says none; then ``notes[host]``
    (where given) says so (``hostversion.unknown_note``): validated against the catalog the profile was validated on,
    never in silence. ``catalog_dir``: the catalogs the profile was resolved with (default: the store's)."""
    from knobfleet.errors import ProfileError
    from knobfleet.profiles import catalog as catalogs
    from knobfleet.profiles import hostversion
    from knobfleet.profiles import versions as engine_versions

    if profile.engine_version and hv.launchers:
        return None  # it launches the install of the version it pins (render refuses a host without one)
    if catalog_dir is None:
        from knobfleet.ops.profiles import store

        catalog_dir = store().catalog_dir
    pinned = catalogs.catalog_for(profile.engine, catalog_dir)
    got = hostversion.host_version(doc, hv.engine_version, pinned.serve.info_version, hv.version_file)
    version = got.version
    if version is None and hv.version_file:
        return (f"engine version unreadable: {hv.version_file} gives {got.raw!r}; fix the file, or name the version "
                f"in knob_serve_engine_version; nothing was changed")  # fmt: skip
    if version is None:
        if notes is not None and pinned.generated:  # the version-specific catalog speaks for it: said, not silent
            on = profile.validated_on or pinned.version
            notes[hv.host] = hostversion.unknown_note(hv.host, profile.engine, on, got, profile.ref)
        return None
    said = got.said(profile.engine)
    if profile.engine_version and version != profile.engine_version:
        return (f"runs {said}, and profile {profile.ref} pins {profile.engine} {profile.engine_version}: name that "
                f"version's install in knob_serve_launchers, or upgrade the host; nothing was changed")  # fmt: skip
    if not pinned.generated or version == (profile.validated_on or pinned.version):
        return None
    try:
        cat = catalogs.catalog_for(profile.engine, catalog_dir, version)
    except ProfileError as exc:
        return f"runs {said}: {exc.problems[0].split(': ', 1)[1]}; nothing was changed"
    problems = engine_versions.problems_on(profile, cat)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"runs {said}: profile {profile.ref}: {problems[0]}{more}; nothing was changed"


def pre_check(
    profile: Profile,
    hosts: list[HostVars],
    rendered: dict[str, Rendered],
    inventory: Path | Hosts,
    opts: Options,
    versions: dict[str, str | None] | None = None,
    notes: dict[str, str] | None = None,
    seen: dict[str, dict[str, Any]] | None = None,
) -> dict[str, HostOutcome]:
    """Hosts decided by one quick probe each: in sync (left alone), refused, or — in a plan — pending. Empty when
    no transport ``--via`` allows answers without a playbook for every host: then the role decides on every
    host. ``notes`` (where given) gets, per host, what the pre-check has to say without refusing it (an engine
    version nothing reports: validated against the profile's own catalog). ``seen`` (where given) gets each probed
    host's ledger tail and engine version, which price the restarts (ops/restart_cost.py)."""
    from knobfleet.engines.adapter import engine as adapter

    gate = door(inventory, opts.via)
    outcomes = gate.probe(hosts, quick=True)
    if not outcomes:
        return {}
    declared = Declared(profile.name, profile.version, profile.content_hash)
    eng = adapter(profile.engine)
    from knobfleet.ops.profiles import store

    catalog_dir = store().catalog_dir  # once, not per host
    out = {}
    for hv in hosts:
        o = outcomes[hv.host]
        if o.doc is None:
            continue  # unreachable or erroring now: the playbook run reports it
        if versions is not None and hv.version_file:
            versions[hv.host] = o.doc.get("engine_version")
        if seen is not None:
            package = o.doc.get("engine_package") or {}
            seen[hv.host] = {
                "ledger": (o.doc.get("generations") or {}).get("ledger") or [],
                "current": (o.doc.get("generations") or {}).get("current"),
                "engine_version": package.get("version") or o.doc.get("engine_version"),
            }
        wrong = version_refusal(profile, hv, o.doc, catalog_dir, notes)
        if wrong is not None:
            current = (o.doc.get("generations") or {}).get("current")
            out[hv.host] = HostOutcome(hv.host, "refused", 0, current, current, message=wrong)
            continue
        policy = opts.foreign_dropins or hv.foreign_dropins
        runs = running_version(hv, o.doc, eng.info_version)
        after = profile.engine_version or runs  # unpinned: the host keeps the version it runs
        p = plan.plan_host(o.doc, rendered[hv.host], declared, eng, policy, opts.break_lock, (runs, after))
        if p.in_sync or p.refused or opts.check:
            out[hv.host] = from_plan(p, opts.check, (o.doc.get("generations") or {}).get("current"))
            lock = (o.doc.get("generations") or {}).get("lock")
            if p.refused and isinstance(lock, dict) and not lock.get("corrupt") and _refused_for_the_lock(p):
                out[hv.host].message = lock_refusal(lock)
    return out


def running_version(hv: HostVars, doc: dict[str, Any], info_version: tuple[str | int, ...]) -> str | None:
    """The engine version the host runs now, as the version check reads it (None: no source says)."""
    from knobfleet.profiles.hostversion import host_version

    return host_version(doc, hv.engine_version, info_version, hv.version_file).version


def _refused_for_the_lock(p: plan.HostPlan) -> bool:
    """Whether the pre-check refused the host for another run's lock (its ``interrupted_apply`` finding on the
    lock, not on a generation left installing): decided on the finding's fields, not its text."""
    from knobfleet.module_utils.knob_rules import Kind

    held = [f for f in p.findings if f.kind is Kind.INTERRUPTED_APPLY and f.name == "lock"]
    return bool(held) and p.refusal == held[0].message


def lock_refusal(holder: dict[str, Any]) -> str:
    """The refusal of a host another run holds locked, from the lock's own fields."""
    return (
        f"lock held by {holder.get('operator')} (run {holder.get('run_id')}) since {holder.get('since')} from "
        f"{holder.get('controller')}{stale_hint(holder)}"
    )


def stale_hint(holder: dict[str, Any]) -> str:
    import os
    import socket

    ctrl = str(holder.get("controller") or "")
    host, _, pid = ctrl.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
        return f"; that applier (pid {pid}) no longer runs, so the lock is stale: re-run with --break-lock to break it"
    return "; wait for it to finish (or, if it was killed, re-run with --break-lock)"
