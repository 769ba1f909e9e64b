"""``apply --gate`` as a step of each batch (``gate``, between verify and slot-after): each host the batch left on
the new profile is judged while it is still out of its router, before the batch is put back and before any later
batch starts. A rejected host fails like any failed host: the step's undo restores it (the play's own restore then
skips it), the drain's undo puts it back in its router, and the rollout stops at this batch, so a rejected profile
never reaches the next one. An engine group is judged once, on its head; a rejection sends every rank back.

The judge is the caller's (``Options.gate``: the benchmark gate of experiment/gate.py, which sits above ops); it
takes a host's vars and returns a verdict with ``host``, ``passed``, ``reason`` and ``as_json()``. A judge that
raises is a rejection: a profile the gate could not judge has not passed it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from knobfleet.ops import interrupts
from knobfleet.ops.apply_restore import restore_and_attach
from knobfleet.ops.steps import StepName
from knobfleet.stepcore import Batch, StepResult

if TYPE_CHECKING:
    from knobfleet.ops.apply_steps import Rollout
    from knobfleet.ops.transaction import RestoreTarget

JUDGED = ("applied", "unchanged")


@dataclass(frozen=True)
class Unjudged:
    """The verdict on a host whose gate could not run (its bench or its baseline's apply failed, or a signal came):
    not passed."""

    host: str
    reason: str
    passed: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "passed": False, "reason": self.reason}


@dataclass
class GateStep:
    """gate: the judge on each host still going that the play left on the profile (an engine group's head only).
    Undo: the rejected hosts back to the generation they ran before this apply (an unchanged host: its previous
    good one), in one restore; each is then no longer ``committed``, so the play's undo leaves it alone."""

    rollout: Rollout
    name: StepName = "gate"
    targets: dict[str, RestoreTarget] = field(default_factory=dict)

    def do(self, batch: Batch) -> None:
        r = self.rollout
        judge = r.opts.gate
        if judge is None or r.opts.check:
            return
        for h in list(batch.going):
            hv = r.by_name[h]
            if h not in batch.going or batch.outcomes[h].status not in JUDGED:
                continue
            if hv.group is not None and h != hv.group.head.host:
                continue  # judged with its head
            verdict = self.judged(judge, hv)
            r.gates.append(verdict)
            batch.journal.add(StepResult("gate", h, bool(verdict.passed), str(verdict.reason)))
            if not verdict.passed:
                members = hv.group.hosts if hv.group is not None else [h]
                for m in members:
                    if m in batch.going:
                        self.reject(batch, m, h, str(verdict.reason))

    @staticmethod
    def judged(judge: Any, hv: Any) -> Any:
        try:
            verdict = judge(hv)
        except interrupts.Interrupted:  # a signal during the gate's own applies: not judged, and acted on next
            interrupts.request()
            return Unjudged(hv.host, "interrupted during the gate")
        except Exception as exc:  # a gate that could not judge has not passed the profile
            return Unjudged(hv.host, f"the gate could not judge it: {exc}")
        if interrupts.pending():
            return Unjudged(hv.host, "interrupted during the gate")
        return verdict

    def reject(self, batch: Batch, host: str, judged: str, reason: str) -> None:
        from knobfleet.ops.transaction import RestoreTarget

        o = batch.outcomes[host]
        new_gen = o.generation is not None and o.generation != o.previous
        self.targets[host] = RestoreTarget(o.previous if new_gen else None, f"gate: {reason}", "failed", "restore")
        o.status, o.message = "failed", f"gate rejected: {reason}"
        group = self.rollout.by_name[host].group
        if group is not None and judged != host:
            o.message += f" (on {judged}, the head of engine group {group.name})"
            batch.journal.add(StepResult("gate", host, False, o.message))
        batch.stop(host)

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        r = self.rollout
        targets = {h: t for h in hosts if (t := self.targets.pop(h, None)) is not None}
        if not targets:
            return []
        chosen = [batch.outcomes[h] for h in targets]
        reasons = {o.host: o.message for o in chosen}
        with interrupts.shielded(raise_at_end=False):
            restore_and_attach(
                chosen,
                targets,
                r.hosts,
                r.door,
                r.opts.break_lock,
                r.on_event,
                r.report,
                lambda host: reasons[host],
            )
        for o in chosen:  # restored here: the play's undo must not restore it a second time
            o.committed = False
        return []
