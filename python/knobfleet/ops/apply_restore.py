"""apply's restores: a failed host back to where it was (``restore_targets``, ``restore_failed``: the play's
undo, inside the batch's machine, the host already drained), the earlier batches under --rollback-fleet
(``roll_back_earlier``: through ``restores.restore_routed``, each routed host drained, restored and put back in
turn), each result attached to its host's outcome; a restore that fails stops everything with RestoreFailed and
the manual steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from knobfleet.fleet.hosts import Hosts
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event
from knobfleet.ops.apply_report import ApplyReport
from knobfleet.ops.outcome import HostOutcome
from knobfleet.profiles.model import Profile


def restore_and_attach(
    chosen: list[HostOutcome],
    targets: dict[str, Any],
    hosts: list[HostVars],
    inventory: Path | Hosts,
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    report: Callable[[], ApplyReport],
    what_failed: Callable[[str], str],
    routed: bool = False,
) -> None:
    """Restore ``targets``, attach each result to its outcome; if any restore fails, stop everything with
    RestoreFailed and the manual steps (no further hosts are touched). ``routed``: hosts still in their routers,
    each drained before its restore and put back after it (``restores.restore_routed``); else the hosts were
    drained already (a failed batch's undo)."""
    from knobfleet.ops.restores import restore_routed
    from knobfleet.ops.transaction import RestoreFailed, manual_steps, restore

    chosen_hosts = [hv for hv in hosts if hv.host in targets]
    got = (
        restore_routed(chosen_hosts, inventory, targets, break_lock, on_event, finish=True)
        if routed
        else restore(hosts, inventory, targets, break_lock=break_lock, on_event=on_event)
    )
    results = {r.host: r for r in got}
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


def restore_targets(failed: list[HostOutcome]) -> dict[str, Any]:
    """Pure: where each failed host goes back to — the previous generation when a new one was installed, else
    the same generation again (the engine was restarted on it)."""
    from knobfleet.ops.transaction import RestoreTarget

    targets = {}
    for o in failed:
        if o.died:  # its own generation, if any, is left 'installing': the restore's begin marks it interrupted
            targets[o.host] = RestoreTarget(o.previous, o.message, "", "restore")
            continue
        new_gen = o.generation is not None and o.generation != o.previous
        to = o.previous if new_gen else o.generation
        targets[o.host] = RestoreTarget(to, o.message, "failed" if new_gen else "", "restore")
    return targets


def restore_failed(
    batch: list[HostOutcome],
    hosts: list[HostVars],
    inventory: Path | Hosts,
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    outcomes: list[HostOutcome],
    profile: Profile,
    run_ids: list[str],
    started: float,
) -> None:
    """The transaction's second half: every host whose new generation failed goes back to the previous one."""
    failed = [o for o in batch if o.status == "failed" and o.committed]
    messages = {o.host: o.message for o in failed}
    # a host whose install died still holds this run's lock (nothing released it): its restore breaks that lock
    for group, breaks in (([o for o in failed if not o.died], break_lock), ([o for o in failed if o.died], True)):
        # (a died host is ``committed`` only where the pre-check named its generation)
        targets = restore_targets(group)
        if targets:
            restore_and_attach(
                group,
                targets,
                hosts,
                inventory,
                breaks,
                on_event,
                lambda: ApplyReport(profile, False, run_ids, outcomes, time.monotonic() - started, 0.0),
                lambda host: f"apply failed ({messages[host]})",
            )


def roll_back_earlier(
    earlier: list[HostOutcome],
    hosts: list[HostVars],
    inventory: Path | Hosts,
    on_event: Callable[[Event], None] | None,
    outcomes: list[HostOutcome],
    profile: Profile,
    run_ids: list[str],
    started: float,
) -> None:
    """--rollback-fleet: hosts of earlier, successful batches go back to their previous generation too."""
    from knobfleet.ops.transaction import RestoreTarget

    targets = {
        o.host: RestoreTarget(o.previous, "rollback-fleet: a later batch failed", "rolled-back", "rollback")
        for o in earlier
    }
    if not targets:
        return
    restore_and_attach(
        earlier,
        targets,
        hosts,
        inventory,
        False,
        on_event,
        lambda: ApplyReport(profile, False, run_ids, outcomes, time.monotonic() - started, 0.0),
        lambda host: "--rollback-fleet after a failed batch",
        routed=True,
    )
    for o in earlier:
        if o.restored is not None and o.restored.ok:
            o.status = "rolled-back"
            o.message = f"rolled back to generation {o.restored.generation:04d} (--rollback-fleet)"
