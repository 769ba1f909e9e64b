"""Restore and rollback: put hosts back on an earlier generation, restart, wait, verify the result.

Used by ``apply`` when a new generation fails (restore to the previous good one) and by
``knobfleet rollback``. Works only from what is stored on the hosts, never from controller profiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.errors import EXIT_RESTORE_FAILED, KnobfleetError
from knobfleet.fleet.hosts import Hosts, door
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, RunRequest, controller_id, new_run_id, operator
from knobfleet.live.verify import blocking_after_restore
from knobfleet.ops import interrupts


@dataclass(frozen=True)
class RestoreTarget:
    to: int | None  # None = the previous good generation
    reason: str
    leave: str = "rolled-back"  # status for the generation being left
    event: str = "rollback"


@dataclass
class RestoreOutcome:
    host: str
    ok: bool
    generation: int | None = None
    previous: int | None = None
    profile: str | None = None
    version: int | None = None
    message: str = ""
    findings: list[str] = field(default_factory=list)
    uninstalled: bool = False  # back to a bare host: knobfleet's files removed, the unit stopped

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "generation": self.generation,
            "previous": self.previous,
            "profile": self.profile,
            "version": self.version,
            "message": self.message,
            "findings": self.findings,
        }


class RestoreFailed(KnobfleetError):
    """A restore (after a failed apply, or a rollback) did not bring a host back; manual steps follow."""

    exit_code = EXIT_RESTORE_FAILED

    def __init__(self, message: str, outcomes: list[RestoreOutcome] | None = None, report: Any = None) -> None:
        super().__init__(message)
        self.outcomes = outcomes or []
        self.report = report


def manual_steps(hv: HostVars, generation: int | None) -> str:
    """The steps that put a host back on ``generation`` by hand and leave it one knobfleet applies to again:
    each file gets the mode, owner and group its generation recorded (an adopted 0700 script stays 0700), and
    the lock is never removed by hand: ``--break-lock`` breaks it and marks any generation left 'installing'
    interrupted, so the next apply is not refused."""
    gen = "NNNN (see `knobfleet history`)" if generation is None else f"{generation:04d}"
    d = f"{hv.service_state_dir}/generations/{gen}"
    script = hv.script_path.rsplit("/", 1)[-1]
    access = (
        'python3 -c \'import json,sys; f=json.load(open(sys.argv[1]))["files"][sys.argv[2]]; '
        'print("-m %04o -o %d -g %d" % (f.get("mode", 0o755 if sys.argv[2] == "script" else 0o644), '
        'f.get("uid", 0), f.get("gid", 0)))\' ' + f"{d}/meta.json"
    )
    return "\n".join(
        [
            f"  on {hv.host} ({hv.address}), as root:",
            f"    install $({access} script) {d}/{script} {hv.script_path}",
            f"    install $({access} unit) {d}/{hv.unit_name} {hv.unit_path}",
            f"    ln -sfn generations/{gen} {hv.service_state_dir}/current",
            f"    systemctl daemon-reload && systemctl restart {hv.unit_name}",
            f"    curl -s -o /dev/null -w '%{{http_code}}\\n' {hv.health_url}   # expect 200",
            "  then, from the controller, if a lock is reported held by a dead run: re-run with --break-lock",
            "  (it breaks the lock and marks any generation left 'installing' interrupted; never rm the lock by hand)",
        ]
    )


def restore(
    hosts: list[HostVars],
    inventory: Path | Hosts,
    targets: dict[str, RestoreTarget],
    *,
    break_lock: bool = False,
    on_event: Callable[[Event], None] | None = None,
    verify_after: bool = True,
) -> list[RestoreOutcome]:
    """Run playbooks/restore.yml for ``targets``, then probe and verify each restored host."""
    from knobfleet.ops import drift

    chosen = [hv for hv in hosts if hv.host in targets]
    if not chosen:
        return []
    gate = door(inventory)
    run_id = new_run_id()
    urls = {hv.host: hv.health_url for hv in chosen}
    plan = {
        h: {"to": t.to, "reason": t.reason, "leave": t.leave, "event": t.event, "url": urls.get(h, "")}
        for h, t in targets.items()
    }
    with interrupts.shielded():  # SIGINT/SIGTERM: the role finishes and releases the lock, then it is raised
        result = gate.play(
            RunRequest(
                playbook="restore.yml",
                inventory=gate.inventory,
                hosts=tuple(hv.host for hv in chosen),
                trusted_vars={
                    "knob_serve_run_id": run_id,
                    "knob_serve_controller": controller_id(),
                    "knob_serve_break_lock": break_lock,
                },
                unsafe_vars={
                    "knob_restore_plan": plan,
                    "knob_serve_operator": operator(),
                    # names the controller knows are secret beyond the inventory's own (vault-sourced values)
                    "knob_serve_secret_vaulted": {hv.host: list(hv.secret_env) for hv in chosen},
                    # each host's engine (its start-up phases, its info URL): the restart the restore causes is
                    # measured and kept like an apply's, phases and engine version included
                    "knob_restore_engines": {hv.host: hv.adapter().role_vars() for hv in chosen},
                },
                forks=min(len(chosen), 64),
                on_event=on_event,
                run_id=run_id,
            ),
            chosen,
        )
    outcomes: dict[str, RestoreOutcome] = {}
    for hv in chosen:
        hr = result.host(hv.host)
        res = hr.results.get("restore", {})
        out = RestoreOutcome(
            hv.host, hr.success, res.get("generation"), res.get("previous"), res.get("profile"), res.get("version")
        )
        if not hr.success:
            out.message = hr.first_failure()
        elif res.get("uninstalled"):
            out.uninstalled = True
            removed = ", ".join(res.get("removed") or []) or "nothing"
            out.message = (
                f"the host had no engine files before knobfleet: stopped the unit and removed what the failed "
                f"apply installed ({removed})"
            )
        outcomes[hv.host] = out
    if verify_after:
        ok_hosts = [hv for hv in chosen if outcomes[hv.host].ok and not outcomes[hv.host].uninstalled]
        if ok_hosts:
            for verdict in drift.check(ok_hosts, gate.reaching(ok_hosts), on_event=on_event):
                out = outcomes[verdict.host]
                # The restore's job is that the generation's files, env and command line are live again;
                # which finding kinds may predate the change (a drop-in put back) is data in the rule.
                serious = blocking_after_restore(verdict.findings)
                if verdict.status not in ("in_sync", "drift") or serious:
                    out.ok = False
                    out.findings = [f"{f.kind.value}: {f.message}" for f in serious]
                    out.message = "restored generation does not verify: " + (
                        "; ".join(out.findings[:3]) or verdict.error or verdict.status
                    )
    return [outcomes[hv.host] for hv in chosen]
