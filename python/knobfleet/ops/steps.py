"""The rollout of a host as explicit typed steps, each with a typed result and a defined undo, and the machine that
drives them.

    pre-check -> slot-before -> install -> restart -> ready -> finish -> verify [-> gate] -> slot-after

=============  =====================================================  ==========================================
step           what it does                                           undo
=============  =====================================================  ==========================================
pre-check      one quick probe: in sync (left alone), refused, or go  nothing (nothing changed)
slot-before    each ``SlotStep.do`` in order (a router drain, a       each done step's ``undo``, in reverse
               group's barrier); nothing of knobfleet's changed yet
install        lock, adopt, stage, commit (knob_generation install)   restore: the previous generation, or the
restart        daemon-reload + restart when the generation changed    same one restarted when only the restart
ready          health 200 and a stable main process (knob_ready)      was new (``restore_targets``); the role
finish         mark good, release the lock (knob_generation finish)   released the lock in its ``always``
verify         the ready engine's probe against the rendered files    nothing of its own (the play's restore)
gate           ``apply --gate``: the benchmark gate, host still       restore the rejected host (the play's
               drained; a rejection fails the host and the batch      own restore skips it)
slot-after     each ``SlotStep.do`` in order (a router re-add)        each done step's ``undo``, in reverse
=============  =====================================================  ==========================================

That is the order the steps run in: install, restart, ready and finish run on the host in one play of the
knob_serve role (three remote calls per changed host: the performance contract in docs/PERFORMANCE.md), so the
host's finish comes before the controller's verify; their typed results are read from that play's step-keyed
results (``read_play``). The slots run on the controller, before the play and after the verify, so a slot plugs
in with no change to the other steps.

The machine (``drive``, ``undo_walk``) knows none of this: a rollout hands it a list of ``Step`` objects for a
``Batch`` of hosts. It calls the checkpoint (where a deferred SIGINT/SIGTERM is raised) before each step and once
after the last, and each step's ``do`` runs it for the hosts still going. A failed or interrupted host is then
undone by walking its journal: every step its journal shows reached, newest first, gets ``undo`` for it. A new
step is one class with ``name``, ``do`` and ``undo``, plus one line in the rollout's list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

StepName = Literal["pre-check", "slot-before", "install", "restart", "ready", "finish", "verify", "slot-after", "gate"]
STEPS: tuple[StepName, ...] = (
    "pre-check",
    "slot-before",
    "install",
    "restart",
    "ready",
    "finish",
    "verify",
    "gate",
    "slot-after",
)
# The boundaries the machine checkpoints at: before each controller-side step, and "end" after the last one.
Boundary = Literal["slot-before", "install", "verify", "gate", "slot-after", "end"]


@dataclass(frozen=True)
class StepResult:
    step: StepName
    host: str
    ok: bool
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class PreCheckResult(StepResult):
    decided: str | None = None  # the status the pre-check decided (in-sync, unchanged, refused, pending), or None


@dataclass(frozen=True, kw_only=True)
class SlotResult(StepResult):
    slot: str = ""  # the slot step's name
    detail: Any = None  # what the slot step returned (a router client's result)


@dataclass(frozen=True, kw_only=True)
class InstallResult(StepResult):
    generation: int | None = None
    previous: int | None = None
    committed: bool = False  # a new generation, or a restart decided on the current one
    refused: bool = False
    lock: dict[str, Any] | None = None
    lock_held: bool = False  # refused for another run's lock (``lock`` names its holder)
    actions: tuple[str, ...] = ()
    # The on-host install died before it reported (killed, out of memory): what it changed is unknown, so the host
    # is restored (``committed``) to the generation the pre-check saw, and the message says why.
    died: str = ""


@dataclass(frozen=True, kw_only=True)
class RestartResult(StepResult):
    restarted: bool = False
    started: bool = False  # the engine was not running: started it
    restart_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ReadyResult(StepResult):
    main_pid: int | None = None
    ready_s: float | None = None
    probe: dict[str, Any] | None = None
    startup: dict[str, Any] | None = None  # what the start cost (module_utils/knob_startup: stop, start, phases)


@dataclass(frozen=True, kw_only=True)
class VerifyResult(StepResult):
    findings: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FinishResult(StepResult):
    released: bool = True


class SlotStep(Protocol):
    """A step a slot runs for one host, with its undo. A router client's drain is one: ``do`` drains the host
    and waits until it is idle, ``undo`` puts it back; its re-add is the slot-after step."""

    name: str

    def do(self, host: str) -> Any:
        """Do it; return a result whose truth (``bool(result)`` or ``result.ok``) says it worked, or raise."""

    def undo(self, host: str) -> None:
        """Put back what ``do`` did (called only after ``do`` returned a success)."""


@dataclass(frozen=True)
class Slots:
    before: Sequence[SlotStep] = ()  # after the pre-check, before anything changes on the host
    after: Sequence[SlotStep] = ()  # after the ready engine verified


def succeeded(result: Any) -> bool:
    ok = getattr(result, "ok", None)
    return bool(result) if ok is None else bool(ok)


def run_slot(steps: Sequence[SlotStep], host: str, where: StepName, done: list[SlotStep]) -> list[SlotResult]:
    """Run a slot's steps for ``host`` in order, stopping at the first that fails; returns their results, and
    appends each step that succeeded to ``done`` as it succeeds (what to undo, even when an interrupt cuts the
    slot short). A step that raises fails (``KeyboardInterrupt`` goes through)."""
    results: list[SlotResult] = []
    for s in steps:
        try:
            got = s.do(host)
        except Exception as exc:  # a slot's client failing is this host's failure, not the rollout's crash
            results.append(SlotResult(where, host, False, f"{s.name}: {exc}", slot=s.name))
            break
        ok = succeeded(got)
        msg = "" if ok else f"{s.name}: {getattr(got, 'message', None) or 'failed'}"
        results.append(SlotResult(where, host, ok, msg, slot=s.name, detail=got))
        if not ok:
            break
        done.append(s)
    return results


def undo_slot(done: Sequence[SlotStep], host: str) -> list[str]:
    """Undo a slot's done steps in reverse; the problems (an undo that raised), one line each."""
    problems = []
    for s in reversed(done):
        try:
            s.undo(host)
        except Exception as exc:
            problems.append(f"{host}: undo of {s.name} failed: {exc}")
    return problems


def read_play(host: str, results: dict[str, dict[str, Any]], success: bool) -> list[StepResult]:
    """Pure: the remote steps' typed results from one host's step-keyed play results (runner.HostResult.results),
    in order, up to the first that failed (or was not reached)."""
    begin, commit = results.get("begin", {}), results.get("commit", {})
    ready, finish = results.get("ready", {}), results.get("finish", {})
    failed = {k for k, v in results.items() if isinstance(v, dict) and v.get("failed")}
    install_ok = bool(commit) and not failed & {"begin", "stage", "commit", "install"}
    died = module_died(results.get("knob_generation")) if not begin and not commit else ""
    out: list[StepResult] = [
        InstallResult(
            "install",
            host,
            install_ok,
            str(begin.get("msg") or "") if begin.get("refused") else "",
            generation=commit.get("generation", begin.get("generation")),
            previous=commit.get("previous", begin.get("generation")),
            committed=bool(commit.get("changed")) or bool(died),
            refused=bool(begin.get("refused")),
            died=died,
            lock=begin.get("lock"),
            lock_held=bool(begin.get("lock_held")),
            actions=tuple(commit.get("actions") or ()),
        )
    ]
    if not install_ok:
        return out
    done = ready.get("done") or []
    ready_ok = bool(ready) and "ready" not in failed
    out.append(
        RestartResult(
            "restart",
            host,
            bool(ready) and (ready_ok or "restart" in done),
            restarted="restart" in done,
            started="start" in done,
            restart_s=(ready.get("systemctl_s") or {}).get("restart"),
        )
    )
    out.append(
        ReadyResult(
            "ready",
            host,
            ready_ok,
            main_pid=ready.get("main_pid"),
            ready_s=ready.get("ready_s"),
            probe=ready.get("probe") if isinstance(ready.get("probe"), dict) else None,
            startup=ready.get("startup") if isinstance(ready.get("startup"), dict) else None,
        )
    )
    if ready_ok:
        out.append(FinishResult("finish", host, success and "finish" not in failed, released=bool(finish) or success))
    return out


def module_died(res: Any) -> str:
    """Pure: why the on-host install (one ``knob_generation install`` call) ended without reporting its steps, or
    "" when it reported (or was never reached). Ansible says ``MODULE FAILURE`` when a module's process gives no
    result (SIGKILL, the OOM killer, a crash of the interpreter), with its exit status in ``rc``."""
    if not isinstance(res, dict) or not res.get("failed") or "steps" in res or res.get("failed_step"):
        return ""
    if not str(res.get("msg") or "").startswith("MODULE FAILURE"):
        return ""
    rc = res.get("rc")
    how = {137: "killed (SIGKILL)", -9: "killed (SIGKILL)", 143: "terminated (SIGTERM)", -15: "terminated (SIGTERM)"}
    why = how.get(rc, "crashed") if isinstance(rc, int) else "crashed"
    return f"the on-host install died before it reported (MODULE FAILURE, exit status {rc}: {why})"


@dataclass
class Journal:
    """Each host's steps as they happened: the typed results, in order."""

    steps: dict[str, list[StepResult]] = field(default_factory=dict)

    def add(self, *results: StepResult) -> None:
        for r in results:
            self.steps.setdefault(r.host, []).append(r)

    def names(self, host: str) -> list[StepName]:
        return [r.step for r in self.steps.get(host, [])]

    def reached(self, host: str, step: StepName) -> bool:
        return step in self.names(host)


@dataclass
class Batch:
    """One batch of a rollout as the machine sees it: its hosts in order, those still going, the journal every
    step writes its typed results to, and ``outcomes``, the rollout's own record of each host (whatever the
    rollout keeps: an apply's ``HostOutcome``)."""

    number: int
    hosts: list[str]
    journal: Journal
    outcomes: dict[str, Any] = field(default_factory=dict)
    going: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.going = list(self.hosts)

    def stop(self, host: str) -> None:
        """``host`` failed this step: the later steps skip it (its undo is the rollout's to call)."""
        if host in self.going:
            self.going.remove(host)


class Step(Protocol):
    """A step of a rollout, one shape for all: ``do`` runs it for ``batch.going`` (journaling each host's typed
    result under ``name`` and stopping the hosts it failed); ``undo`` puts back what it did on ``hosts`` (each of
    which its journal shows reached) and returns the problems, one line each starting ``"HOST: "``. An undo may
    raise (a restore that failed): the older steps are still undone, then it is raised."""

    name: StepName

    def do(self, batch: Batch) -> None: ...

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]: ...


def drive(steps: Sequence[Step], batch: Batch, checkpoint: Callable[[Boundary], None]) -> None:
    """The rollout of one batch: each step in order, with the checkpoint before it and once more at the end."""
    for step in steps:
        checkpoint(step.name)  # type: ignore[arg-type]  # the controller-side steps are boundaries too
        step.do(batch)
    checkpoint("end")


def undo_walk(steps: Sequence[Step], batch: Batch, hosts: Sequence[str]) -> list[str]:
    """Undo ``hosts``: walk the steps newest first and undo each on the hosts whose journal shows it reached
    (one call per step, so a restore stays one play for the batch). A step whose undo raises does not stop the
    older steps' undos; the first such error is raised once they are done. Returns the problems."""
    problems: list[str] = []
    error: BaseException | None = None
    for step in reversed(steps):
        mine = [h for h in hosts if batch.journal.reached(h, step.name)]
        if not mine:
            continue
        try:
            problems += step.undo(batch, mine)
        except BaseException as exc:  # a failed restore: put the rest back first, then say so
            error = error or exc
    if error is not None:
        raise error
    return problems


@dataclass
class SlotRun:
    """A slot as a step: its ``SlotStep``s for each host ``hosts(batch)`` names (the hosts still going), stopping a
    host at its first failing one (``fail`` records why). Undo: each host's done slot steps, in reverse. Apply's
    drain and re-add, and rollback's, are this step."""

    name: StepName
    slot: Sequence[SlotStep]
    done: dict[str, list[SlotStep]] = field(default_factory=dict)
    results: dict[str, list[SlotResult]] = field(default_factory=dict)

    def do(self, batch: Batch) -> None:
        for h in self.hosts(batch):
            got = self.results[h] = run_slot(self.slot, h, self.name, self.done.setdefault(h, []))
            batch.journal.add(*got)
            if got and not got[-1].ok:
                self.fail(batch, h, got[-1].message)
                batch.stop(h)

    def hosts(self, batch: Batch) -> list[str]:
        return list(batch.going)

    def fail(self, batch: Batch, host: str, why: str) -> None:
        """Record on ``batch.outcomes`` why ``host`` stops here (the rollout's own words)."""

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        return [p for h in hosts for p in undo_slot(self.done.pop(h, []), h)]
