"""Use case: apply a profile to hosts (and its plan). One rule decides everything (ops/plan.plan_host over the
live-state rule): a host already in sync is left alone, a host that must be refused is refused before
anything changes, every other host goes through ``playbooks/apply.yml`` (the role re-checks with the same
rule on the host), and the engine the role reports ready is checked once more with the same rule.

Each host goes through the steps of ``ops/steps.py`` (pre-check, slot-before, install, restart, ready, verify,
slot-after, finish), batch by batch; a failure or an interrupt (SIGINT, SIGTERM: ``ops/interrupts.py``) runs the
done steps' undos in reverse. The hosts are reached only through the ``Hosts`` door the caller hands in."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, LockHeld
from knobfleet.fleet.hosts import Hosts, door
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, RunRequest, RunResult, controller_id, new_run_id, operator
from knobfleet.live.verify import Declared, check_rendered
from knobfleet.ops import interrupts, plan, ranks
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.precheck import Options as Options  # the apply use case's options, where its callers find them
from knobfleet.ops.precheck import pre_check, stale_hint
from knobfleet.ops.steps import (
    Batch,
    Boundary,
    Journal,
    PreCheckResult,
    SlotRun,
    Slots,
    SlotStep,
    Step,
    StepName,
    VerifyResult,
    drive,
    read_play,
    undo_walk,
)
from knobfleet.profiles.model import Profile
from knobfleet.render import Rendered, profile_vars, render_host


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
        if any(h.status in ("failed", "refused") for h in self.hosts):
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
    return plan.file_diff(str(d.get("before", "")), str(d.get("after", "")), path)


def _outcome(hv: HostVars, result: RunResult, batch: int, check: bool) -> HostOutcome:
    """What the playbook did on one host, from the steps its modules report (``_verified`` checks the ready engine
    with the live rule: the verify step)."""
    hr = result.host(hv.host)
    out = HostOutcome(hv.host, "failed", batch, changed_tasks=hr.changed)
    begin = hr.results.get("begin", {})
    # Another run's lock is recognised by the refusal's fields (lock_held; lock: the holder's run_id, operator, since,
    # controller, holder_host, holder_pid and the lock's path; knob_store.lock_refusal), not by its message's text.
    if begin.get("lock_held") or (begin.get("lock") and not check and not hr.success):
        out.lock = begin.get("lock")
    if not hr.success:
        out.message = hr.first_failure()
        if begin.get("refused"):
            out.status = "refused"
            out.message = str(begin.get("msg") or out.message)
        commit = hr.results.get("commit", {})
        out.generation = commit.get("generation", begin.get("generation"))
        out.previous = commit.get("previous", begin.get("generation"))
        out.committed = bool(commit.get("changed"))
        return out
    if check:
        staged = [d for d in hr.diffs if d.get("step") in ("stage", "install")]
        out.diffs = [{"path": d["before_header"], "diff": _diff_text(d, str(d["before_header"]))} for d in staged]
        for d in staged:
            if d.get("before_header") == hv.script_path:
                out.knob_changes = [
                    str(c)
                    for c in plan.knob_changes(
                        str(d.get("before", "")), str(d.get("after", "")), hv.adapter().argv_spec
                    )
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
        out.generation = begin.get("generation")
        return out
    commit = hr.results.get("commit", {})
    ready = hr.results.get("ready", {})
    out.generation, out.previous = commit.get("generation"), commit.get("previous")
    # an engine group's rank restarts with its group even when its own generation did not change
    out.restarted = out.committed = bool(commit.get("changed")) or "restart" in (ready.get("done") or [])
    out.status = "applied" if commit.get("changed") else "unchanged"
    out.actions = list(commit.get("actions") or (["install", "restart"] if out.generation != out.previous else []))
    out.main_pid, out.ready_s = ready.get("main_pid"), ready.get("ready_s")
    out.restart_s = (ready.get("systemctl_s") or {}).get("restart")
    if "start" in (ready.get("done") or []):
        out.message = "the engine was not running: started it"
    elif out.restarted and not commit.get("changed") and hv.group is not None:
        out.message = f"restarted with its engine group {hv.group.name} (its own generation did not change)"
    return out


def _verified(
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


def apply(
    profile: Profile,
    hosts: list[HostVars],
    inventory: Path | Hosts,
    opts: Options | None = None,
    on_event: Callable[[Event], None] | None = None,
    slots: Slots | None = None,
    checkpoint: Callable[[Boundary], None] | None = None,
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
    checkpoint_hook: Callable[[Boundary], None] | None
    journal: Journal = field(default_factory=Journal)
    outcomes: list[HostOutcome] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ansible_s: float = 0.0
    later: list[HostOutcome] = field(default_factory=list)  # the batches after the current one (shown as not run)

    def __post_init__(self) -> None:
        self.by_name = {hv.host: hv for hv in self.hosts}
        self.groups = ranks.of(self.hosts)
        self.versions: dict[str, str | None] = {}  # engine versions the pre-check read (engine groups)
        self.notes: dict[str, str] = {}  # the pre-check's word on a host it did not refuse (versions.unknown_note)
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

    def checkpoint(self, step: Boundary) -> None:
        if self.checkpoint_hook is not None:
            self.checkpoint_hook(step)
        interrupts.checkpoint()

    def report(self) -> ApplyReport:
        return ApplyReport(self.profile, False, self.run_ids, self.outcomes, time.monotonic() - self.started, 0.0)

    def playbook(
        self, group: list[str], run_id: str, gate: Path | None = None, cancel: Callable[[], bool] | None = None
    ) -> RunResult:
        assert self.engine is not None
        with interrupts.shielded(raise_at_end=False):  # the role releases its locks; the next checkpoint raises
            return self.door.play(
                RunRequest(
                    playbook="apply.yml",
                    inventory=self.door.inventory,
                    limit=",".join(group),
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
        last = _last_applied(self.door.inventory)
        if self.groups:
            decided = self.group_decisions(
                pre_check(profile, hosts, self.rendered, self.door, opts, self.versions, self.notes)
            )
        elif speculative(hosts, opts, profile.content_hash, last, self.door) and not self.slots.before:
            # One batch, a real change, hosts a quick transport reaches: ansible-playbook starts (~1 s of its own
            # start-up) while the pre-check probes; the role waits at its gate for the decision, and hosts decided
            # here end there. (A slot before the restart must run between the two: then the pre-check goes first.)
            ahead_id = new_run_id()
            decided, ahead = _ahead(
                lambda gate, cancel: self.playbook([hv.host for hv in hosts], ahead_id, gate, cancel),
                ahead_id,
                len(hosts),
                lambda: pre_check(profile, hosts, self.rendered, self.door, opts, notes=self.notes),
            )
        else:
            decided = pre_check(profile, hosts, self.rendered, self.door, opts, notes=self.notes)
        for host, o in decided.items():
            self.journal.add(PreCheckResult("pre-check", host, o.status != "refused", o.message, decided=o.status))
        todo = [hv.host for hv in hosts if hv.host not in decided]
        groups = plan.batches(todo, opts.serial, opts.canary, self.units(todo))
        self.outcomes = list(decided.values())
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
                    _roll_back_earlier(
                        earlier, hosts, self.door, self.on_event, self.outcomes, profile, self.run_ids, self.started
                    )
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
            profile, opts.check, self.run_ids, self.outcomes, time.monotonic() - self.started, self.ansible_s
        )
        if not opts.check:
            _remember_applied(self.door.inventory, last, profile.content_hash, self.outcomes)
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

    def batch(self, group: list[str], n: int, groups: list[list[str]], ahead: RunResult | None) -> list[HostOutcome]:
        """One batch through the steps (``steps.drive``); a failed host's done steps are undone by walking its
        journal (``steps.undo_walk``: the re-add, the restore, the drain); an interrupt undoes every host of the
        batch that started, then raises ``Interrupted``."""
        batch = Batch(n, group, self.journal)
        self.later = [
            HostOutcome(h, "not-run", m, message="not touched: an earlier batch failed")
            for m, g in enumerate(groups[n:], start=n + 1)
            for h in g
        ]
        before, play = _SlotBefore(self.slots.before, self.opts.check), _Play(self, ahead)
        steps: list[Step] = [before, play, _Verify(self, play, before), _SlotAfter(self.slots.after, self.opts.check)]
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

    def _interrupted(self, steps: list[Step], batch: Batch, play: _Play) -> NoReturn:
        """An interrupt inside a batch: every host of it that started is undone as if it had failed (its journal
        walked back), the rest are not run; then ``Interrupted``. A host the play started ahead of the pre-check
        (``play.ahead``) has started, whatever step the batch itself had reached: the play's results are read."""
        if play.ahead is not None and not self.opts.check:
            play.take(batch, play.ahead, [h for h in batch.hosts if h not in batch.outcomes and h in play.ahead.hosts])
        for h in batch.hosts:
            o = batch.outcomes.get(h)
            started = o is not None or self.journal.reached(h, "slot-before")
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


class _SlotBefore(SlotRun):
    """slot-before: before anything of knobfleet's changes on the host (a router drain); a host whose step fails
    goes no further. Nothing runs in a plan (--check)."""

    def __init__(self, slot: Sequence[SlotStep], check: bool) -> None:
        super().__init__("slot-before", () if check else slot)

    def fail(self, batch: Batch, host: str, why: str) -> None:
        batch.outcomes[host] = HostOutcome(host, "failed", batch.number, message=f"before the restart: {why}")

    def forced(self) -> dict[str, tuple[int, str]]:
        """The drains that timed out and went on under --force-restart: {host: (requests dropped, its line)}."""
        return {h: f for h, results in self.results.items() if (f := _forced(results)) is not None}


class _SlotAfter(SlotRun):
    """slot-after: once the engine is ready and verified (a router re-add); a host whose step fails is failed (and
    undone). Nothing runs in a plan (--check)."""

    def __init__(self, slot: Sequence[SlotStep], check: bool) -> None:
        super().__init__("slot-after", () if check else slot)

    def hosts(self, batch: Batch) -> list[str]:
        return [h for h in batch.going if batch.outcomes[h].status in ("applied", "unchanged")]

    def fail(self, batch: Batch, host: str, why: str) -> None:
        o = batch.outcomes[host]
        o.status, o.message = "failed", f"after the engine was ready: {why}"


@dataclass
class _Play:
    """install, restart, ready and finish: one play of the knob_serve role for the hosts still going (or the
    play started ahead of the pre-check), its step-keyed results typed into the journal (``read_play``). Undo:
    the restore of the hosts it changed (``restore_targets``), in one play."""

    rollout: _Rollout
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
            batch.journal.add(*read_play(h, hr.results, hr.success))
            out = batch.outcomes[h] = _outcome(r.by_name[h], result, batch.number, r.opts.check)
            if out.status in ("failed", "refused"):
                batch.stop(h)

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        r = self.rollout
        with interrupts.shielded(raise_at_end=False):
            _restore_failed(
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
class _Verify:
    """verify: each ready engine's probe against its rendered files (``_verified``), then the engine groups'
    cross-rank rule (a failed rank fails its group); the drains that went on under --force-restart are noted.
    Undo: nothing of its own (the play's restore puts the host back)."""

    rollout: _Rollout
    play: _Play
    before: _SlotBefore
    name: StepName = "verify"

    def do(self, batch: Batch) -> None:
        r, result = self.rollout, self.play.result
        if r.opts.check or result is None:
            return
        assert r.engine is not None
        rules = r.engine.rules()
        docs = {h: result.host(h).results.get("ready", {}).get("probe") for h in self.play.played}
        for h in self.play.played:
            _verified(batch.outcomes[h], docs[h], r.rendered[h], r.declared, rules, result.run_id)
        if r.groups:  # the ranks of a group agree, and fail or pass together
            ranks.after_play({h: batch.outcomes[h] for h in self.play.played}, docs, r.groups, rules)
        for h in self.play.played:
            out = batch.outcomes[h]
            if batch.journal.reached(h, "ready"):
                batch.journal.add(VerifyResult("verify", h, out.status != "failed", out.message))
            if out.status == "failed":
                batch.stop(h)
        for h, (dropped, why) in self.before.forced().items():
            batch.outcomes[h].dropped = dropped
            batch.outcomes[h].message = "; ".join(m for m in (batch.outcomes[h].message, why) if m)

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        return []


def _forced(results: list[Any]) -> tuple[int, str] | None:
    """A drain among a host's slot results that timed out and went on under --force-restart: (dropped, its line)."""
    for r in results:
        d = getattr(r, "detail", None)
        if getattr(d, "forced", False):
            return int(getattr(d, "inflight", 0) or 0), str(getattr(d, "message", ""))
    return None


def speculative(
    hosts: list[HostVars], opts: Options, profile_hash: str, last: dict[str, str], via: Hosts | None = None
) -> bool:
    """Whether apply starts ansible-playbook before its pre-check has decided: a real change (not --check) in one
    batch, on hosts the SSH fast path reaches (so the pre-check probes them and can gate the run), unless this
    controller's last apply left every host on this very profile (``last``: host -> profile hash): then the apply
    is most likely a no-change one, which needs no playbook at all, and the probe goes first. A wrong guess costs
    time only: the pre-check decides either way."""
    return (
        bool(hosts)
        and any(last.get(hv.host) != profile_hash for hv in hosts)
        and not opts.check
        and opts.serial is None
        and not opts.canary
        and (via or Hosts(Path("."), opts.via)).quick(hosts)
    )


def _door(inventory: Path | Hosts, opts: Options) -> Hosts:
    return door(inventory, opts.via)


def _last_applied_file(inventory: Path) -> Path:
    import hashlib

    from knobfleet import paths

    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return paths.state_dir() / "cache" / "last-applied" / f"{key}.json"


def _last_applied(inventory: Path) -> dict[str, str]:
    """Host -> the profile hash this controller's last apply left it on (a hint for ``speculative``, never trusted
    for a decision)."""
    import json

    try:
        data = json.loads(_last_applied_file(inventory).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _remember_applied(inventory: Path, last: dict[str, str], profile_hash: str, outcomes: list[HostOutcome]) -> None:
    import json
    import os

    seen = dict(last)
    for o in outcomes:
        if o.status in ("applied", "unchanged"):
            seen[o.host] = profile_hash
        else:
            seen.pop(o.host, None)
    path = _last_applied_file(inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(seen, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a hint only: apply works the same without it


def _ahead(
    start: Callable[[Path, Callable[[], bool]], RunResult],
    run_id: str,
    n_hosts: int,
    decide: Callable[[], dict[str, HostOutcome]],
) -> tuple[dict[str, HostOutcome], RunResult | None]:
    """Run ``decide`` (the pre-check) in a thread while ``start`` runs the playbook here, gated: the role waits
    until the decision is in the gate file — the hosts decided (left alone or refused) end before anything runs
    on them; an error in the pre-check stops every host before any change and is raised here. When the pre-check
    decided every host, the playbook is cancelled: nothing can have run on any host before the gate. Returns the
    decisions and the run (None when every host was decided)."""
    import json
    import threading

    from knobfleet import paths

    gate = paths.state_dir() / "tmp" / f"gate-{run_id}.json"
    gate.parent.mkdir(parents=True, exist_ok=True)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["decided"] = decide()
            doc: dict[str, Any] = {"skip": sorted(box["decided"])}
            if interrupts.pending():  # Ctrl-C while the pre-check ran: stop every host before any change
                doc = {"abort": "knobfleet was interrupted during its pre-check; nothing was changed"}
                box["interrupted"] = True
        except BaseException as exc:  # raised below, in the caller's thread
            box["error"] = exc
            doc = {"abort": "knobfleet's pre-check failed; nothing was changed"}
        # decided before the gate appears: whoever reads the gate sees the cancel that goes with it
        box["cancel"] = "error" in box or "interrupted" in box or len(box.get("decided") or ()) == n_hosts
        tmp = gate.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(gate)  # whole or absent: the role reads it once it is non-empty

    thread = threading.Thread(target=work, name="pre-check", daemon=True)
    thread.start()
    try:
        result = start(gate, lambda: bool(box.get("cancel")))
    finally:
        thread.join()
        gate.unlink(missing_ok=True)
    if "error" in box:
        raise box["error"]
    decided: dict[str, HostOutcome] = box["decided"]
    return decided, (None if box["cancel"] else result)


def _restore_and_attach(
    chosen: list[HostOutcome],
    targets: dict[str, Any],
    hosts: list[HostVars],
    inventory: Path | Hosts,
    break_lock: bool,
    on_event: Callable[[Event], None] | None,
    report: Callable[[], ApplyReport],
    what_failed: Callable[[str], str],
) -> None:
    """Restore ``targets``, attach each result to its outcome; if any restore fails, stop everything with
    RestoreFailed and the manual steps (no further hosts are touched)."""
    from knobfleet.ops.transaction import RestoreFailed, manual_steps, restore

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


def restore_targets(failed: list[HostOutcome]) -> dict[str, Any]:
    """Pure: where each failed host goes back to — the previous generation when a new one was installed, else
    the same generation again (the engine was restarted on it)."""
    from knobfleet.ops.transaction import RestoreTarget

    targets = {}
    for o in failed:
        new_gen = o.generation is not None and o.generation != o.previous
        to = o.previous if new_gen else o.generation
        targets[o.host] = RestoreTarget(to, o.message, "failed" if new_gen else "", "restore")
    return targets


def _restore_failed(
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
    targets = restore_targets(failed)
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
