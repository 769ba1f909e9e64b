"""Use case: apply a profile to hosts through ``playbooks/apply.yml`` (and its --check plan)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet import plan
from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, LockHeld
from knobfleet.hostvars import HostVars
from knobfleet.profiles.model import Profile
from knobfleet.render import Rendered, profile_vars, render_host
from knobfleet.runner import Event, RunRequest, controller_id, new_run_id, operator, run_playbook

TASK_COMMIT = "Store a new generation and install it atomically when anything changed"
TASK_READY = "Restart if the generation changed and wait for readiness (health 200, main process stable)"
TASK_BEGIN = "Take the host lock and adopt pre-knobfleet files as generation 0"
TASK_STAGE = "Stage the rendered serve script and unit, validating what changed"
WATCH = ("SGLANG_SM120_MMA_TARGET_CTAS", "SGLANG_SM120_MMA_BLOCK_H")


@dataclass
class HostOutcome:
    host: str
    status: str  # applied | unchanged | failed | not-run | pending | in-sync
    batch: int
    generation: int | None = None
    previous: int | None = None
    restarted: bool = False
    main_pid: int | None = None
    ready_s: float | None = None
    message: str = ""
    live: plan.LiveCheck | None = None
    diffs: list[dict[str, Any]] = field(default_factory=list)
    knob_changes: list[str] = field(default_factory=list)
    lock: dict[str, Any] | None = None
    changed_tasks: int = 0
    committed: bool = False  # the run changed files or restarted the engine: a failure must be restored
    restored: Any = None  # RestoreOutcome when a failure was rolled back

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "status": self.status,
            "batch": self.batch,
            "generation": self.generation,
            "previous": self.previous,
            "restarted": self.restarted,
            "main_pid": self.main_pid,
            "ready_s": self.ready_s,
            "message": self.message,
            "changed_tasks": self.changed_tasks,
        }
        if self.restored is not None:
            out["restored"] = self.restored.as_json()
        if self.live is not None:
            out["live"] = {"ok": self.live.ok, "problems": self.live.problems, "seen": self.live.seen}
        if self.knob_changes or self.diffs:
            out["knob_changes"] = self.knob_changes
            out["diffs"] = [{"path": d.get("path"), "diff": d.get("diff")} for d in self.diffs]
        return out


@dataclass
class ApplyReport:
    profile: Profile
    check: bool
    run_ids: list[str]
    hosts: list[HostOutcome]
    wall_s: float
    ansible_s: float

    @property
    def exit_code(self) -> int:
        if any(h.status == "failed" for h in self.hosts):
            return EXIT_ERROR
        if self.check:
            return EXIT_DRIFT if any(h.status == "pending" for h in self.hosts) else EXIT_OK
        return EXIT_OK

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "version": self.profile.version,
            "hash": self.profile.content_hash,
            "check": self.check,
            "run_ids": self.run_ids,
            "wall_s": round(self.wall_s, 3),
            "exit_code": self.exit_code,
            "hosts": [h.as_json() for h in self.hosts],
        }


def _diff_text(d: dict[str, Any], path: str) -> str:
    import difflib

    before, after = str(d.get("before", "")), str(d.get("after", ""))
    return "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"{path} (installed)", f"{path} (profile)"
        )
    )


def _outcome(hv: HostVars, rendered: Rendered, result: Any, batch: int, check: bool) -> HostOutcome:
    hr = result.host(hv.host)
    out = HostOutcome(hv.host, "failed", batch, changed_tasks=hr.changed)
    begin = hr.results.get(TASK_BEGIN, {})
    if begin.get("lock_held") or (begin.get("lock") and not check and not hr.success):
        out.lock = begin.get("lock")
    if not hr.success:
        out.message = hr.first_failure()
        if "locked by" in out.message:
            out.lock = begin.get("lock") or out.lock
        commit = hr.results.get(TASK_COMMIT, {})
        out.generation = commit.get("generation", begin.get("generation"))
        out.previous = commit.get("previous", begin.get("generation"))
        out.committed = bool(commit.get("changed"))
        return out
    if check:
        staged = [d for d in hr.diffs if d.get("task") == TASK_STAGE]
        script_diffs = [d for d in staged if d.get("before_header") == hv.script_path]
        out.diffs = [{"path": d["before_header"], "diff": _diff_text(d, str(d["before_header"]))} for d in staged]
        for d in script_diffs:
            out.knob_changes = [str(c) for c in plan.knob_changes(str(d.get("before", "")), str(d.get("after", "")))]
        out.status = "pending" if hr.diffs or hr.changed else "in-sync"
        out.restarted = bool(hr.diffs)
        would = [v for v in hr.results.get(TASK_READY, {}).get("would") or [] if v != "daemon-reload"]
        if out.diffs:
            out.message = "changes pending; would restart the engine"
        elif would:
            out.message = f"files in sync; would {' and '.join(would)} the engine (not running or not enabled)"
        else:
            out.message = "no change"
        out.generation = begin.get("generation")
        return out
    commit = hr.results.get(TASK_COMMIT, {})
    ready = hr.results.get(TASK_READY, {})
    out.generation, out.previous = commit.get("generation"), commit.get("previous")
    out.restarted = bool(commit.get("changed"))
    out.committed = bool(commit.get("changed"))
    out.status = "applied" if commit.get("changed") else "unchanged"
    out.main_pid, out.ready_s = ready.get("main_pid"), ready.get("ready_s")
    if "start" in (ready.get("done") or []):
        out.message = "the engine was not running: started it"
    out.live = plan.check_live(rendered.env, rendered.argv, out.main_pid, ready.get("processes") or [], list(WATCH))
    if not out.live.ok:
        out.status = "failed"
        out.message = "live process does not match the profile: " + "; ".join(out.live.problems[:3])
    return out


IN_SYNC = "already in sync: checked with one probe, no Ansible run"


def live_from_probe(doc: dict[str, Any], rendered: Rendered) -> plan.LiveCheck:
    """Pure: the live check of a probe document's engine processes against what was rendered."""
    try:
        main_pid: int | None = int((doc.get("unit_props") or {}).get("MainPID", "0")) or None
    except ValueError:
        main_pid = None
    return plan.check_live(rendered.env, rendered.argv, main_pid, doc.get("processes") or [], list(WATCH))


def sync_problems(doc: dict[str, Any], rendered: Rendered, profile: Profile, knobs: tuple[str, ...]) -> list[str]:
    """Pure: why applying ``profile`` would still do something on the host ``doc`` describes (empty: nothing).

    Stricter than the role's own no-change test: installed files byte-equal to what the role renders now,
    the current generation from this exact profile, enabled and running, no lock, and no finding at all
    from ``verify`` (live env/argv, drop-ins, daemon-reload, health…). Anything else goes through Ansible."""
    from knobfleet.verify import Declared, verify_host

    problems = []
    files = doc.get("files") or {}
    for name, sha in (("script", rendered.script_sha256), ("unit", rendered.unit_sha256)):
        if (files.get(name) or {}).get("sha256") != sha:
            problems.append(f"{name} differs from the rendered one")
    props = doc.get("unit_props") or {}
    if props.get("UnitFileState") != "enabled":
        problems.append(f"unit is {props.get('UnitFileState') or 'not installed'}, not enabled")
    gens = doc.get("generations") or {}
    if gens.get("lock"):
        problems.append("host lock is held")
    verdict = verify_host(rendered.host, doc, Declared(profile.name, profile.version, profile.content_hash), knobs)
    if verdict.status != "in_sync" or verdict.findings:
        problems += [f.kind for f in verdict.findings] or [verdict.status]
    if verdict.hash != profile.content_hash:
        problems.append("current generation is another profile")
    problems += live_from_probe(doc, rendered).problems[:1]
    return problems


def _in_sync_outcomes(
    profile: Profile,
    hosts: list[HostVars],
    rendered: dict[str, Rendered],
    inventory: Path,
    check: bool,
    early: Any = None,
    plan_key: str | None = None,
) -> dict[str, HostOutcome]:
    """Hosts with nothing to do, found by one fast-path probe per host (empty when the fast path cannot
    reach every host as Ansible would: then Ansible's own no-change run decides). ``early``/``plan_key``:
    probes the CLI started speculatively (drift.start_early)."""
    from knobfleet import drift

    if not hosts or drift.choose_via(hosts, "auto") != "ssh":
        drift.stop_unused(early)
        return {}
    docs = drift.probe(hosts, inventory, via="ssh", early=early, plan_key=plan_key)
    knobs = drift.known_knobs()
    out = {}
    for hv in hosts:
        doc = docs[hv.host]
        if not isinstance(doc, dict) or sync_problems(doc, rendered[hv.host], profile, knobs):
            continue
        current = (doc.get("generations") or {}).get("current")
        live = live_from_probe(doc, rendered[hv.host])
        out[hv.host] = HostOutcome(
            hv.host,
            "in-sync" if check else "unchanged",
            0,
            generation=current,
            previous=current,
            main_pid=live.main_pid,
            message="no change" if check else IN_SYNC,
            live=live,
        )
    return out


def apply(
    profile: Profile,
    hosts: list[HostVars],
    inventory: Path,
    *,
    check: bool = False,
    serial: str | None = None,
    canary: bool = False,
    max_fail_percent: float = 0.0,
    break_lock: bool = False,
    on_event: Callable[[Event], None] | None = None,
    overrides: dict[str, Any] | None = None,
    rollback_fleet: bool = False,
    via: str = "auto",
    early: Any = None,
    plan_key: str | None = None,
) -> ApplyReport:
    """Render for every host first (a bad input changes nothing anywhere), skip the hosts a fast probe
    shows already in sync (``via="auto"``), then roll out the rest in batches, stopping at the first
    batch whose failures exceed ``max_fail_percent``."""
    started = time.monotonic()
    rendered = {hv.host: render_host(profile, hv) for hv in hosts}
    by_name = {hv.host: hv for hv in hosts}
    plan.batches([hv.host for hv in hosts], serial, canary)  # a bad --serial fails before anything runs
    skipped = {} if via == "ansible" else _in_sync_outcomes(profile, hosts, rendered, inventory, check, early, plan_key)
    groups = plan.batches([hv.host for hv in hosts if hv.host not in skipped], serial, canary)
    outcomes: list[HostOutcome] = list(skipped.values())
    run_ids: list[str] = []
    ansible_s = 0.0
    failed_total = 0
    stopped = False
    for n, group in enumerate(groups, start=1):
        if stopped:
            outcomes += [HostOutcome(h, "not-run", n, message="not touched: an earlier batch failed") for h in group]
            continue
        run_id = new_run_id()
        run_ids.append(run_id)
        result = run_playbook(
            RunRequest(
                playbook="apply.yml",
                inventory=inventory,
                limit=",".join(group),
                trusted_vars={
                    "knob_serve_run_id": run_id,
                    "knob_serve_operator": operator(),
                    "knob_serve_controller": controller_id(),
                    "knob_serve_break_lock": break_lock,
                    **(overrides or {}),
                },
                unsafe_vars={"knob_serve_profile": profile_vars(profile)},
                check=check,
                diff=check,
                forks=min(max(len(group), 1), 64),
                on_event=on_event,
                run_id=run_id,
            )
        )
        ansible_s += result.wall_s
        batch_out = [_outcome(by_name[h], rendered[h], result, n, check) for h in group]
        outcomes += batch_out
        if not check:
            later = [
                HostOutcome(h, "not-run", m, message="not touched: an earlier batch failed")
                for m, g in enumerate(groups[n:], start=n + 1)
                for h in g
            ]
            _restore_failed(
                batch_out, hosts, inventory, break_lock, on_event, outcomes + later, profile, run_ids, started
            )
        failed_total += sum(o.status == "failed" for o in batch_out)
        done = sum(len(g) for g in groups[:n])
        if failed_total and failed_total * 100.0 / done > max_fail_percent:
            stopped = True
            if rollback_fleet and not check:
                earlier = [o for o in outcomes if o.batch < n and o.status == "applied" and o.previous is not None]
                _roll_back_earlier(earlier, hosts, inventory, on_event, outcomes, profile, run_ids, started)
    order = {hv.host: i for i, hv in enumerate(hosts)}
    outcomes.sort(key=lambda o: order.get(o.host, len(order)))
    report = ApplyReport(profile, check, run_ids, outcomes, time.monotonic() - started, ansible_s)
    locks = [o for o in outcomes if o.lock and o.status == "failed"]
    if locks and len(locks) == len([o for o in outcomes if o.status == "failed"]) and not check:
        first = locks[0]
        holder = first.lock or {}
        raise LockHeld(
            f"{first.host}: apply refused: locked by {holder.get('operator')} (run {holder.get('run_id')}) since "
            f"{holder.get('since')} from {holder.get('controller')}{_stale_hint(holder)}",
            report,
        )
    return report


def _restore_and_attach(
    chosen: list[HostOutcome],
    targets: dict[str, Any],
    hosts: list[HostVars],
    inventory: Path,
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    report: Callable[[], ApplyReport],
    what_failed: Callable[[str], str],
) -> None:
    """Restore ``targets``, attach each result to its outcome; if any restore fails, stop everything with
    RestoreFailed and the manual steps (no further hosts are touched)."""
    from knobfleet.transaction import RestoreFailed, manual_steps, restore

    results = {r.host: r for r in restore(hosts, inventory, targets, break_lock=break_lock, on_event=on_event)}
    for o in chosen:
        o.restored = results.get(o.host)
    broken = [r for r in results.values() if not r.ok]
    if broken:
        by_name = {hv.host: hv for hv in hosts}
        lines = [
            f"{r.host}: {what_failed(r.host)}, and restoring generation {targets[r.host].to} failed too: {r.message}"
            for r in broken
        ]
        lines.append("No further hosts were touched. Restore by hand:")
        lines += [manual_steps(by_name[r.host], targets[r.host].to) for r in broken]
        raise RestoreFailed("\n".join(lines), broken, report())


def _restore_failed(
    batch: list[HostOutcome],
    hosts: list[HostVars],
    inventory: Path,
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    outcomes: list[HostOutcome],
    profile: Profile,
    run_ids: list[str],
    started: float,
) -> None:
    """The transaction's second half: every host whose new generation failed goes back to the previous one."""
    from knobfleet.transaction import RestoreTarget

    failed = [o for o in batch if o.status == "failed" and o.committed]
    targets = {}
    for o in failed:
        new_gen = o.generation is not None and o.generation != o.previous
        to = o.previous if new_gen else o.generation
        targets[o.host] = RestoreTarget(to, o.message, "failed" if new_gen else "", "restore")
    if targets:
        messages = {o.host: o.message for o in failed}
        _restore_and_attach(
            failed,
            targets,
            hosts,
            inventory,
            break_lock,
            on_event,
            lambda: ApplyReport(profile, False, run_ids, outcomes, time.monotonic() - started, 0.0),
            lambda host: f"apply failed ({messages[host]})",
        )


def _roll_back_earlier(
    earlier: list[HostOutcome],
    hosts: list[HostVars],
    inventory: Path,
    on_event: Callable[[Event], None] | None,
    outcomes: list[HostOutcome],
    profile: Profile,
    run_ids: list[str],
    started: float,
) -> None:
    """--rollback-fleet: hosts of earlier, successful batches go back to their previous generation too."""
    from knobfleet.transaction import RestoreTarget

    targets = {
        o.host: RestoreTarget(o.previous, "rollback-fleet: a later batch failed", "rolled-back", "rollback")
        for o in earlier
    }
    if not targets:
        return
    _restore_and_attach(
        earlier,
        targets,
        hosts,
        inventory,
        False,
        on_event,
        lambda: ApplyReport(profile, False, run_ids, outcomes, time.monotonic() - started, 0.0),
        lambda host: "--rollback-fleet after a failed batch",
    )
    for o in earlier:
        if o.restored is not None and o.restored.ok:
            o.status = "rolled-back"
            o.message = f"rolled back to generation {o.restored.generation:04d} (--rollback-fleet)"


def _stale_hint(holder: dict[str, Any]) -> str:
    import os
    import socket

    ctrl = str(holder.get("controller") or "")
    host, _, pid = ctrl.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
        return f"; that applier (pid {pid}) no longer runs, so the lock is stale: re-run with --break-lock to break it"
    return "; wait for it to finish (or, if it was killed, re-run with --break-lock)"
