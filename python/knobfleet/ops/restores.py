"""Every restore that puts a host back on an earlier generation goes through the rollout's machine
(``stepcore.drive``): rollback, ``apply --rollback-fleet``, the canary's. A host a router fronts is drained first (a
host the router will not give up stays in service on its current generation, refused with one line), restored,
then put back in its router whatever the restore did, one host at a time, so the capacity guard is never passed
and no request is cut by a restart. Hosts no router fronts are restored together in one play.

A failed batch's restore is the play's undo inside the batch's own machine (ops/apply_steps.py), with the drain
already done; a rejected gate is a step of that machine too (ops/apply_gate.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from knobfleet.fleet.hosts import Hosts
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event
from knobfleet.ops import interrupts
from knobfleet.ops.steps import StepName
from knobfleet.ops.transaction import RestoreOutcome, RestoreTarget, restore
from knobfleet.stepcore import Batch, Journal, Step, StepResult, drive, undo_walk

NOT_TOUCHED = "not touched: interrupted"


def restore_routed(
    hosts: list[HostVars],
    inventory: Path | Hosts,
    targets: dict[str, RestoreTarget],
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    finish: bool = False,
) -> list[RestoreOutcome]:
    """``restore``; hosts a router fronts go one at a time through the rollout's machine (``stepcore.drive``): drained
    first (a host the router will not give up stays in service on its current generation, refused with one line),
    restored, then put back whatever the restore did, so no host is left out of its router. Rollback's undo is
    nothing: a restore that failed is reported (RestoreFailed), the host is put back in its router all the same.

    A signal is acted on between hosts (the rest are reported not touched: ``rollback``), unless ``finish``: an undo
    (the canary's rollback and its swap, ``--rollback-fleet``) restores every host whatever arrives meanwhile, and
    the signal waits for the caller's next checkpoint."""
    from knobfleet.ops.routing import router_slots

    slots = router_slots(hosts)
    if slots is None:
        return restore(hosts, inventory, targets, break_lock=break_lock, on_event=on_event)
    routed = {hv.host for hv in hosts if hv.router_url}  # the hosts the slots' steps cover
    plain = [hv for hv in hosts if hv.host not in routed]
    outcomes = (
        restore(plain, inventory, {h.host: targets[h.host] for h in plain}, break_lock=break_lock, on_event=on_event)
        if plain
        else []
    )
    for hv in hosts:
        if hv.host not in routed:
            continue
        if interrupts.pending() and not finish:  # a signal: the hosts rolled back stay so, the rest are not touched
            outcomes.append(RestoreOutcome(hv.host, False, message=NOT_TOUCHED))
            continue
        batch = Batch(1, [hv.host], Journal(), on_fail=_slot_failed)
        steps: list[Step] = [
            *slots.before,
            _Restore(hv, inventory, targets[hv.host], break_lock, on_event),
            *slots.after,
        ]
        try:  # a signal is acted on between hosts, never between a drain and its re-add
            drive(steps, batch, lambda _: None)
        except BaseException:  # the restore raised: the journal walked back (the drain undone), then raised
            undo_walk(steps, batch, batch.hosts)
            raise
        outcomes.append(batch.outcomes[hv.host])
    order = {hv.host: i for i, hv in enumerate(hosts)}
    return sorted(outcomes, key=lambda o: order.get(o.host, len(order)))


def _slot_failed(batch: Batch, host: str, why: str) -> None:
    """A slot's step failed ``host`` (``Batch.fail``). Before the restore (a drain the router refused), the host
    stays in service on its current generation. After it (a re-add that failed), every drained host has been put
    back whatever its restore did, so the failure joins the restore's message and fails the host."""
    o = batch.outcomes.get(host)
    if o is None:
        batch.outcomes[host] = RestoreOutcome(
            host, False, message=f"{why}; it stays in service on its current generation"
        )
    else:
        batch.outcomes[host] = dataclasses.replace(o, ok=False, message="; ".join([o.message, why]).strip("; "))


@dataclass
class _Restore:
    """Rollback's install..ready: the restore play of one host (its outcome, ok or not, goes on to the re-add)."""

    hv: HostVars
    inventory: Path | Hosts
    target: RestoreTarget
    break_lock: bool
    on_event: Callable[[Event], None] | None
    name: StepName = "install"

    def do(self, batch: Batch) -> None:
        for h in list(batch.going):
            got = restore(
                [self.hv], self.inventory, {h: self.target}, break_lock=self.break_lock, on_event=self.on_event
            )
            for o in got:
                batch.outcomes[o.host] = o
                batch.journal.add(StepResult("install", o.host, o.ok, o.message))

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        return []
