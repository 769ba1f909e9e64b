"""Use case: apply a profile to hosts (and its plan). One rule decides everything (ops/plan.plan_host over the
live-state rule): a host already in sync is left alone, a host that must be refused is refused before
anything changes, every other host goes through ``playbooks/apply.yml`` (the role re-checks with the same
rule on the host), and the engine the role reports ready is checked once more with the same rule.

Each host goes through the steps of ``ops/steps.py`` (pre-check, the slots' before steps, install, restart, ready,
finish, verify, gate, the slots' after steps), batch by batch; a failure or an interrupt (SIGINT, SIGTERM:
``ops/interrupts.py``) runs the done steps' undos in reverse. The hosts are reached only through the ``Hosts``
door the caller hands in.

Here: the rollout (``_Rollout``: batches, the play's request, interrupts) and what one play did on a host
(``_outcome``). Beside it: the batch's steps (ops/apply_steps.py), the restores (ops/apply_restore.py), the
playbook started ahead of the pre-check (ops/apply_ahead.py) and the report (ops/apply_report.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from knobfleet.errors import LockHeld
from knobfleet.fleet.hosts import Hosts, door
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, HostResult, RunRequest, RunResult, controller_id, new_run_id, operator
from knobfleet.live.verify import Declared
from knobfleet.ops import apply_cost, interrupts, plan, ranks
from knobfleet.ops.apply_ahead import last_applied, remember_applied, run_ahead, speculative
from knobfleet.ops.apply_gate import GateStep
from knobfleet.ops.apply_report import ApplyReport
from knobfleet.ops.apply_restore import roll_back_earlier
from knobfleet.ops.apply_steps import Play, Verify, slot_failed
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.precheck import Options, pre_check, stale_hint
from knobfleet.ops.steps import InstallResult, PreCheckResult, ReadyResult, RestartResult, Slots
from knobfleet.profiles.model import Profile
from knobfleet.render import Rendered, profile_vars, render_host
from knobfleet.stepcore import Batch, Journal, Step, StepResult, drive, undo_walk


def _diff_text(d: dict[str, Any], path: str) -> str:
    return plan.file_diff(str(d.get("before", "")), str(d.get("after", "")), path)


def _outcome(
    hv: HostVars, hr: HostResult, typed: list[StepResult], batch: int, check: bool, before: int | None = None
) -> HostOutcome:
    """What the playbook did on one host: its steps' typed results (``read_play``, the one reader of the play's
    step-keyed results), and for a check run the diffs of what would be installed. ``verified`` then checks the
    ready engine with the live rule: the verify step."""
    steps = {s.step: s for s in typed}
    inst = steps.get("install")
    assert isinstance(inst, InstallResult), "read_play always types the install step"
    out = HostOutcome(hv.host, "failed", batch, changed_tasks=hr.changed)
    # Another run's lock is recognised by the refusal's fields (lock_held; lock: the holder's run_id, operator, since,
    # controller, holder_host, holder_pid and the lock's path; knob_store.lock_refusal), not by its message's text.
    if inst.lock_held or (inst.lock and not check and not hr.success):
        out.lock = inst.lock
    if not hr.success:
        out.message = hr.first_failure()
        if inst.refused:
            out.status = "refused"
            out.message = inst.message or out.message
        out.generation, out.previous, out.committed = inst.generation, inst.previous, inst.committed
        if inst.died and before is not None:  # whatever it did is unknown: back to what the pre-check saw
            out.died, out.generation, out.previous = True, None, before
            out.message = f"{inst.died}; what it changed is unknown, so generation {before:04d} is restored"
        elif inst.died:  # nothing names the generation to go back to: left as it is, and said so
            out.died, out.committed = True, False
            out.message = f"{inst.died}; the pre-check saw no generation to restore: see `knobfleet drift`"
        return out
    if check:
        return _pending(hv, hr, out)
    restart, ready = steps.get("restart"), steps.get("ready")
    started = isinstance(restart, RestartResult) and restart.started
    out.generation, out.previous = inst.generation, inst.previous
    # an engine group's rank restarts with its group even when its own generation did not change
    out.restarted = out.committed = inst.committed or (isinstance(restart, RestartResult) and restart.restarted)
    out.status = "applied" if inst.committed else "unchanged"
    out.actions = list(inst.actions or (["install", "restart"] if out.generation != out.previous else []))
    if isinstance(ready, ReadyResult):
        out.main_pid, out.ready_s, out.startup = ready.main_pid, ready.ready_s, ready.startup
    if isinstance(restart, RestartResult):
        out.restart_s = restart.restart_s
    if started:
        out.message = "the engine was not running: started it"
    elif out.restarted and not inst.committed and hv.group is not None:
        out.message = f"restarted with its engine group {hv.group.name} (its own generation did not change)"
    return out


def _pending(hv: HostVars, hr: HostResult, out: HostOutcome) -> HostOutcome:
    """A check run's outcome: the diffs of the staged files and what would restart."""
    staged = [d for d in hr.diffs if d.get("step") in ("stage", "install")]
    out.diffs = [{"path": d["before_header"], "diff": _diff_text(d, str(d["before_header"]))} for d in staged]
    for d in staged:
        if d.get("before_header") == hv.script_path:
            out.knob_changes = [
                str(c)
                for c in plan.knob_changes(str(d.get("before", "")), str(d.get("after", "")), hv.adapter().argv_spec)
            ]
    out.status = "pending" if hr.diffs or hr.changed else "in-sync"
    out.restarted = bool(hr.diffs)
    would = [v for v in hr.results.get("ready", {}).get("would") or [] if v != "daemon-reload"]
    if out.diffs:
        out.message = "changes pending; would restart the engine"
    elif would:
        out.message = f"files in sync; would {' and '.join(would)} the engine (not running or not enabled)"
    else:
        out.message = "no change"
    out.generation = hr.results.get("begin", {}).get("generation")
    return out


def apply(
    profile: Profile,
    hosts: list[HostVars],
    inventory: Path | Hosts,
    opts: Options | None = None,
    on_event: Callable[[Event], None] | None = None,
    slots: Slots | None = None,
    checkpoint: Callable[[str], None] | None = None,
) -> ApplyReport:
    """Render for every host first (a bad input changes nothing anywhere), decide each host with the pre-check,
    then roll out the rest in batches, stopping at the first batch whose failures exceed the budget.
    ``inventory``: the ``Hosts`` door (or an inventory's path: the default door with ``opts.via``). ``slots``:
    the steps plugged in before the restart and after the ready engine verified. ``checkpoint(next_step)`` is
    called at every step boundary (default: raise a deferred SIGINT/SIGTERM there)."""
    opts = opts or Options()
    if slots is None:  # hosts behind a router are drained first and put back once verified (ops/routing.py)
        from knobfleet.ops.routing import paced_serial, router_slots

        slots = None if opts.check else router_slots(hosts, force_restart=opts.force_restart)
        if slots is not None:  # batches follow the routers' capacity guard unless --serial says otherwise
            serial = paced_serial(hosts, opts.serial, opts.canary)
            if serial != opts.serial:
                from dataclasses import replace

                opts = replace(opts, serial=serial)
    rollout = _Rollout(profile, hosts, _door(inventory, opts), opts, on_event, slots or Slots(), checkpoint)
    with interrupts.deferred():  # a signal is acted on at the rollout's step boundaries only
        return rollout.run()


@dataclass
class _Rollout:
    """One apply: the steps of every host, batch by batch, and their undo."""

    profile: Profile
    hosts: list[HostVars]
    door: Hosts
    opts: Options
    on_event: Callable[[Event], None] | None
    slots: Slots
    checkpoint_hook: Callable[[str], None] | None
    journal: Journal = field(default_factory=Journal)
    outcomes: list[HostOutcome] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ansible_s: float = 0.0
    later: list[HostOutcome] = field(default_factory=list)  # the batches after the current one (shown as not run)
    gates: list[Any] = field(default_factory=list)  # --gate: the verdicts so far (ops/apply_gate.py)

    def __post_init__(self) -> None:
        self.by_name = {hv.host: hv for hv in self.hosts}
        self.groups = ranks.of(self.hosts)
        self.versions: dict[str, str | None] = {}  # engine versions the pre-check read (engine groups)
        self.notes: dict[str, str] = {}  # the pre-check's word on a host it did not refuse (hostversion.unknown_note)
        self.seen: dict[str, dict[str, Any]] = {}  # per host the pre-check probed: ledger tail, engine version
        self.cost: Any = None  # ops/restart_cost.Cost, once the pre-check decided
        self.declared = Declared(self.profile.name, self.profile.version, self.profile.content_hash)
        self.rendered: dict[str, Rendered] = {}
        self.trusted: dict[str, Any] = {"knob_serve_break_lock": self.opts.break_lock, **self.opts.overrides}
        if self.opts.foreign_dropins:
            self.trusted["knob_serve_foreign_dropins"] = self.opts.foreign_dropins

    def units(self, hosts: list[str]) -> list[tuple[str, ...]] | None:
        """Restart units: an engine group's ranks are one (``--serial`` and the canary count units)."""
        return ranks.restart_units(hosts, self.groups) if self.groups else None

    def group_decisions(self, decided: dict[str, HostOutcome]) -> dict[str, HostOutcome]:
        """The pre-check's decisions per engine group, and the groups that would come up mismatched refused."""
        assert self.engine is not None
        refused = {}
        for name, g in self.groups.items():
            found = ranks.rendered_mismatch(g, self.rendered, self.engine.rules(), self.versions)
            if found:
                refused[name] = ranks.refusal_text(g, found)
        return ranks.merge_decided(decided, self.groups, refused)

    def outcome(self, host: str, hr: HostResult, typed: list[StepResult], n: int) -> HostOutcome:
        """What the play did on one host of batch ``n`` (``_outcome``), from its steps' typed results."""
        return _outcome(self.by_name[host], hr, typed, n, self.opts.check, self.seen.get(host, {}).get("current"))

    def checkpoint(self, step: str) -> None:
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(step)
        interrupts.checkpoint()

    def report(self) -> ApplyReport:
        return ApplyReport(
            self.profile,
            False,
            self.run_ids,
            self.outcomes,
            time.monotonic() - self.started,
            0.0,
            self.gates,
            self.cost,
        )

    def price(self, decided: dict[str, HostOutcome]) -> None:
        """The restarts this rollout causes and what they will cost (ops/apply_cost.py), told before the first
        batch; in a plan each pending host carries its own figure."""
        self.cost = apply_cost.cost(
            self.hosts, decided, self.seen, self.profile.name, self.opts, self.door.inventory, self.units
        )
        for h in self.cost.hosts:
            if h.host in decided:
                decided[h.host].cost = h.as_json()
        if self.opts.announce is not None:
            self.opts.announce(self.cost.lines())

    def playbook(
        self, group: list[str], run_id: str, gate: Path | None = None, cancel: Callable[[], bool] | None = None
    ) -> RunResult:
        assert self.engine is not None
        with interrupts.shielded(raise_at_end=False):  # the role releases its locks; the next checkpoint raises
            return self.door.play(
                RunRequest(
                    playbook="apply.yml",
                    inventory=self.door.inventory,
                    hosts=tuple(group),
                    trusted_vars={
                        "knob_serve_run_id": run_id,
                        "knob_serve_controller": controller_id(),
                        **({"knob_serve_gate": str(gate)} if gate else {}),
                        **self.trusted,
                    },
                    unsafe_vars={
                        "knob_serve_profile": profile_vars(self.profile),
                        "knob_serve_engine": self.engine.role_vars(),
                        "knob_serve_operator": operator(),
                        # names the controller knows are secret beyond the inventory's own (vault-sourced values)
                        "knob_serve_secret_vaulted": {h: list(self.by_name[h].secret_env) for h in group},
                        **(
                            {"knob_serve_groups": ranks.role_vars(self.groups, self.engine.name, self.rendered)}
                            if self.groups
                            else {}
                        ),
                    },
                    check=self.opts.check,
                    diff=self.opts.check,
                    forks=min(max(len(group), 1), 64),
                    on_event=self.on_event,
                    run_id=run_id,
                    cancel=cancel,
                ),
                [self.by_name[h] for h in group],
            )

    def run(self) -> ApplyReport:
        profile, hosts, opts = self.profile, self.hosts, self.opts
        self.engine = self.by_name[hosts[0].host].adapter(profile.engine) if hosts else None
        from knobfleet.fleet.fleetkey import fleet_key

        key = fleet_key()  # the same markers the hosts make (fleet/fleetkey.py)
        self.rendered = {hv.host: render_host(profile, hv, engine=self.engine, secret_key=key) for hv in hosts}
        # a bad --serial, or a --limit holding only some ranks of an engine group, fails before anything runs
        plan.batches([hv.host for hv in hosts], opts.serial, opts.canary, self.units([hv.host for hv in hosts]))
        ahead: RunResult | None = None
        last = last_applied(self.door.inventory)
        if self.groups:
            decided = self.group_decisions(
                pre_check(profile, hosts, self.rendered, self.door, opts, self.versions, self.notes, self.seen)
            )
        elif (
            speculative(hosts, opts, profile.content_hash, last, self.door)
            and not self.slots.before
            and opts.gate is None
        ):
            # One batch, a real change, hosts a quick transport reaches: ansible-playbook starts (~1 s of its own
            # start-up) while the pre-check probes; the role waits at its gate for the decision, and hosts decided
            # here end there. (A slot before the restart must run between the two: then the pre-check goes first.)
            ahead_id = new_run_id()
            decided, ahead = run_ahead(
                lambda gate, cancel: self.playbook([hv.host for hv in hosts], ahead_id, gate, cancel),
                ahead_id,
                len(hosts),
                lambda: pre_check(profile, hosts, self.rendered, self.door, opts, notes=self.notes, seen=self.seen),
            )
        else:
            decided = pre_check(profile, hosts, self.rendered, self.door, opts, notes=self.notes, seen=self.seen)
        if opts.gate is not None and not opts.check:  # a host already on the profile is judged in its batch too
            decided = {h: o for h, o in decided.items() if o.status != "unchanged"}
        for host, o in decided.items():
            self.journal.add(PreCheckResult("pre-check", host, o.status != "refused", o.message, decided=o.status))
        todo = [hv.host for hv in hosts if hv.host not in decided]
        groups = plan.batches(todo, opts.serial, opts.canary, self.units(todo))
        self.outcomes = list(decided.values())
        self.price(decided)
        self.batches(groups, ahead)
        order = {hv.host: i for i, hv in enumerate(hosts)}
        self.outcomes.sort(key=lambda o: order.get(o.host, len(order)))
        for o in self.outcomes:  # what the pre-check had to say without refusing (an engine version nothing reports)
            if o.host in self.notes and o.status in ("pending", "applied", "failed"):
                o.message = "; ".join(m for m in (o.message, self.notes[o.host]) if m)
        for o in self.outcomes:
            g = self.by_name[o.host].group if o.host in self.by_name else None
            if g is not None:
                m = g.member(o.host)
                o.group = f"{g.name} {'rank' if m.role == 'rank' else m.role} {m.rank}"
        report = ApplyReport(
            profile,
            opts.check,
            self.run_ids,
            self.outcomes,
            time.monotonic() - self.started,
            self.ansible_s,
            self.gates,
            self.cost,
        )
        if not opts.check:
            remember_applied(self.door.inventory, last, profile.content_hash, self.outcomes)
            apply_cost.remember(self.door.inventory, self.outcomes, report.wall_s)
        locks = [o for o in self.outcomes if o.lock and o.status == "failed"]
        if locks and len(locks) == len([o for o in self.outcomes if o.status == "failed"]) and not opts.check:
            first = locks[0]
            holder = first.lock or {}
            raise LockHeld(
                f"{first.host}: apply refused: locked by {holder.get('operator')} (run {holder.get('run_id')}) since "
                f"{holder.get('since')} from {holder.get('controller')}{stale_hint(holder)}",
                report,
            )
        return report

    def batches(self, groups: list[list[str]], ahead: RunResult | None) -> None:
        """Every batch in turn, until one's failures exceed the budget: the later ones are not run, and with
        --rollback-fleet the earlier batches' hosts go back too (each drained first: ``roll_back_earlier``)."""
        opts = self.opts
        failed_total, stopped = 0, False
        for n, group in enumerate(groups, start=1):
            if stopped:
                self.outcomes += [
                    HostOutcome(h, "not-run", n, message="not touched: an earlier batch failed") for h in group
                ]
                continue
            assert self.engine is not None
            batch_out = self.batch(group, n, groups, ahead)
            ahead = None
            failed_total += sum(o.status == "failed" for o in batch_out)
            done = sum(len(g) for g in groups[:n])
            if failed_total and failed_total * 100.0 / done > opts.max_fail_percent:
                stopped = True
                if opts.rollback_fleet and not opts.check:
                    earlier = [
                        o for o in self.outcomes if o.batch < n and o.status == "applied" and o.previous is not None
                    ]
                    roll_back_earlier(
                        earlier,
                        self.hosts,
                        self.door,
                        self.on_event,
                        self.outcomes,
                        self.profile,
                        self.run_ids,
                        self.started,
                    )

    def batch(self, group: list[str], n: int, groups: list[list[str]], ahead: RunResult | None) -> list[HostOutcome]:
        """One batch through the steps (``stepcore.drive``); a failed host's done steps are undone by walking its
        journal (``stepcore.undo_walk``: the re-add, the restore, the drain); an interrupt undoes every host of the
        batch that started, then raises ``Interrupted``."""
        batch = Batch(n, group, self.journal, on_fail=slot_failed)
        self.later = [
            HostOutcome(h, "not-run", m, message="not touched: an earlier batch failed")
            for m, g in enumerate(groups[n:], start=n + 1)
            for h in g
        ]
        play = Play(self, ahead)
        slots = Slots() if self.opts.check else self.slots  # a plan (--check) takes no host out of its router
        steps: list[Step] = [*slots.before, play, Verify(self, play)]
        if self.opts.gate is not None and not self.opts.check:  # judged while still out of its router
            steps.append(GateStep(self))
        steps += slots.after
        try:
            drive(steps, batch, self.checkpoint)
        except KeyboardInterrupt:
            self._interrupted(steps, batch, play)
        self.outcomes += [batch.outcomes[h] for h in group]
        if not self.opts.check:
            self._undo(steps, batch, [batch.outcomes[h] for h in group])
        return [batch.outcomes[h] for h in group]

    def _undo(self, steps: list[Step], batch: Batch, outcomes: list[HostOutcome]) -> None:
        """The failed and refused hosts' done steps, undone newest first (a restore that fails stops everything:
        RestoreFailed with the manual steps, once the drains are put back); each undo's problem joins its host's
        message."""
        undone = [o for o in outcomes if o.status in ("failed", "refused")]  # refused on the host: nothing changed
        problems = undo_walk(steps, batch, [o.host for o in undone])
        for o in undone:
            mine = [p for p in problems if p.startswith(f"{o.host}: ")]
            if mine:
                o.message += " (" + "; ".join(p.removeprefix(f"{o.host}: ") for p in mine) + ")"

    def _interrupted(self, steps: list[Step], batch: Batch, play: Play) -> NoReturn:
        """An interrupt inside a batch: every host of it that started is undone as if it had failed (its journal
        walked back), the rest are not run; then ``Interrupted``. A host the play started ahead of the pre-check
        (``play.ahead``) has started, whatever step the batch itself had reached: the play's results are read."""
        if play.ahead is not None and not self.opts.check:
            play.take(batch, play.ahead, [h for h in batch.hosts if h not in batch.outcomes and h in play.ahead.hosts])
        for h in batch.hosts:
            o = batch.outcomes.get(h)
            started = o is not None or any(n != "pre-check" for n in self.journal.names(h))
            if o is None:
                o = batch.outcomes[h] = HostOutcome(h, "not-run", batch.number, message="not touched: interrupted")
            if started:
                names = self.journal.names(h)
                was = o.status
                o.status = "failed"
                o.message = f"interrupted after {names[-1] if names else 'the first step'}" + (
                    f" ({o.message})" if was == "failed" else ""
                )
                if was in ("unchanged", "pending", "in-sync"):
                    o.committed = False
            if not any(x is o for x in self.outcomes):
                self.outcomes.append(o)
        if not self.opts.check:
            self._undo(steps, batch, [batch.outcomes[h] for h in batch.hosts])
        self.outcomes += self.later
        restored = [o for o in batch.outcomes.values() if o.restored is not None and o.restored.ok]
        what = f"; restored {len(restored)} host(s) to their previous generation" if restored else ""
        raise interrupts.Interrupted(f"knobfleet: interrupted: no further hosts were touched{what}", self.report())


def _door(inventory: Path | Hosts, opts: Options) -> Hosts:
    return door(inventory, opts.via)
