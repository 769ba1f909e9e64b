"""The steps of apply's batch (``stepcore``'s machine drives them): ``[*slots.before, Play, Verify, *slots.after]``.
The slots' steps (a router's drain and re-add) are ``stepcore.Step``s of their own; a host one of them fails is
recorded in apply's words by ``slot_failed``. The play is install, restart, ready and finish in one play of the
knob_serve role, undone by the restore of the hosts it changed; verify checks each ready engine with the live rule
(``verified``) and has no undo of its own.

The steps reach the rollout that drives them (ops/apply.py) through ``Rollout``, the part of it they use, so
neither this file nor ops/apply_gate.py imports apply (not even for a type)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from knobfleet.fleet.router import RouterResult
from knobfleet.fleet.runner import RunResult, new_run_id
from knobfleet.live.verify import Declared, check_rendered
from knobfleet.ops import interrupts, plan, ranks
from knobfleet.ops.apply_restore import restore_failed
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.steps import StepName, VerifyResult, read_play
from knobfleet.render import Rendered
from knobfleet.stepcore import Batch

if TYPE_CHECKING:
    from knobfleet.engines.adapter import Engine
    from knobfleet.fleet.hosts import Hosts
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.fleet.runner import Event, HostResult
    from knobfleet.groups import EngineGroup
    from knobfleet.ops.apply_report import ApplyReport
    from knobfleet.ops.precheck import Options
    from knobfleet.profiles.model import Profile
    from knobfleet.stepcore import StepResult


class Rollout(Protocol):
    """What the batch's steps (here, and the gate's: ops/apply_gate.py) use of the rollout (ops/apply._Rollout):
    its profile, hosts and options, the door, the run's records, and one play, one host's outcome, the report."""

    profile: Profile
    hosts: list[HostVars]
    by_name: dict[str, HostVars]
    groups: dict[str, EngineGroup]
    door: Hosts
    opts: Options
    on_event: Callable[[Event], None] | None
    engine: Engine | None
    declared: Declared
    rendered: dict[str, Rendered]
    outcomes: list[HostOutcome]
    later: list[HostOutcome]
    gates: list[Any]
    run_ids: list[str]
    started: float
    ansible_s: float

    def playbook(
        self, group: list[str], run_id: str, gate: Path | None = None, cancel: Callable[[], bool] | None = None
    ) -> RunResult: ...

    def outcome(self, host: str, hr: HostResult, typed: list[StepResult], n: int) -> HostOutcome: ...

    def report(self) -> ApplyReport: ...


def verified(
    out: HostOutcome, doc: Any, rendered: Rendered, declared: Declared, engine: dict[str, Any], run: str
) -> None:
    """The verify step for one host the play left ready: its engine's probe (``doc``) against the rendered files,
    with the live rule; a finding fails the host."""
    if not isinstance(doc, dict) or out.status not in ("applied", "unchanged"):
        return
    from knobfleet.engines.adapter import engine as adapter

    out.findings = check_rendered(doc, rendered, declared, engine, run)
    out.seen = plan.seen_knobs(doc, adapter(engine.get("name")))
    if out.findings:
        out.status = "failed"
        out.message = "live state does not match the profile: " + "; ".join(f.message for f in out.findings[:3])


def slot_failed(batch: Batch, host: str, why: str) -> None:
    """A slot's step failed ``host`` (``Batch.fail``): before the play, nothing of knobfleet's changed on it (a
    drain the router refused); after it, the engine was ready and verified (a re-add that failed), so the host is
    failed and undone."""
    if batch.journal.reached(host, "install"):
        o = batch.outcomes[host]
        o.status, o.message = "failed", f"after the engine was ready: {why}"
    else:
        batch.outcomes[host] = HostOutcome(host, "failed", batch.number, message=f"before the restart: {why}")


@dataclass
class Play:
    """install, restart, ready and finish: one play of the knob_serve role for the hosts still going (or the
    play started ahead of the pre-check), its step-keyed results typed into the journal (``read_play``). Undo:
    the restore of the hosts it changed (``restore_targets``), in one play."""

    rollout: Rollout
    ahead: RunResult | None
    name: StepName = "install"
    result: RunResult | None = None
    played: list[str] = field(default_factory=list)

    def do(self, batch: Batch) -> None:
        live = list(batch.going)
        if live:
            result = self.ahead if self.ahead is not None else self.rollout.playbook(live, new_run_id())
            self.ahead = None
            self.take(batch, result, live)

    def take(self, batch: Batch, result: RunResult, hosts: list[str]) -> None:
        r = self.rollout
        self.result, self.played = result, hosts
        r.run_ids.append(result.run_id)
        r.ansible_s += result.wall_s
        for h in hosts:
            hr = result.host(h)
            typed = read_play(h, hr.results, hr.success)
            batch.journal.add(*typed)
            out = batch.outcomes[h] = r.outcome(h, hr, typed, batch.number)
            if out.status in ("failed", "refused"):
                batch.stop(h)

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        r = self.rollout
        with interrupts.shielded(raise_at_end=False):
            restore_failed(
                [batch.outcomes[h] for h in hosts],
                r.hosts,
                r.door,
                r.opts.break_lock,
                r.on_event,
                r.outcomes + r.later,
                r.profile,
                r.run_ids,
                r.started,
            )
        return []


@dataclass
class Verify:
    """verify: each ready engine's probe against its rendered files (``verified``), then the engine groups'
    cross-rank rule (a failed rank fails its group); the drains that went on under --force-restart are noted.
    Undo: nothing of its own (the play's restore puts the host back)."""

    rollout: Rollout
    play: Play
    name: StepName = "verify"

    def do(self, batch: Batch) -> None:
        r, result = self.rollout, self.play.result
        if r.opts.check or result is None:
            return
        assert r.engine is not None
        rules = r.engine.rules()
        docs = {h: result.host(h).results.get("ready", {}).get("probe") for h in self.play.played}
        for h in self.play.played:
            verified(batch.outcomes[h], docs[h], r.rendered[h], r.declared, rules, result.run_id)
        if r.groups:  # the ranks of a group agree, and fail or pass together
            ranks.after_play({h: batch.outcomes[h] for h in self.play.played}, docs, r.groups, rules)
        for h in self.play.played:
            out = batch.outcomes[h]
            if batch.journal.reached(h, "ready"):
                batch.journal.add(VerifyResult("verify", h, out.status != "failed", out.message))
            if out.status == "failed":
                batch.stop(h)
        for h in self.play.played:  # the drains that timed out and went on under --force-restart
            for f in batch.journal.steps.get(h, []):
                if isinstance(f, RouterResult) and f.forced:
                    batch.outcomes[h].dropped = f.inflight or 0
                    batch.outcomes[h].message = "; ".join(m for m in (batch.outcomes[h].message, f.message) if m)

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        return []
