"""One step shape and one step result for every rollout: apply's batches, the restores, the router's drain and
re-add, the gate. Pure data and the machine that drives them; no I/O of its own.

A step is one object with ``name``, ``do(batch)`` and ``undo(batch, hosts)`` (``Step``). ``do`` runs it for the
hosts of the ``Batch`` still going, writes each host's typed result (a ``StepResult`` or a subclass of it) to the
batch's ``Journal``, and stops the hosts it failed (``Batch.fail``, which tells the rollout why in its own words).
``undo`` puts back what it did on the hosts named, each of which its journal shows reached.

A step that does one thing per host on its own (a router's drain of that host's worker) is a ``PerHost``: a
function per host and its inverse, no class of its own.

The machine (``drive``, ``undo_walk``) knows none of the steps: it calls the checkpoint (where a deferred
SIGINT/SIGTERM is raised) before each step and once after the last, and a failed or interrupted host is undone by
walking its journal: every step its journal shows reached, newest first, gets ``undo`` for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class StepResult:
    """What one step did on one host: the step's name, the host, whether it worked and one line saying why not.
    Steps that know more subclass it (ops/steps.py: the install's generation; fleet/router.py: the router's
    outcome and the requests in flight)."""

    step: str
    host: str
    ok: bool
    message: str = ""


@dataclass
class Journal:
    """Each host's steps as they happened: the typed results, in order."""

    steps: dict[str, list[StepResult]] = field(default_factory=dict)

    def add(self, *results: StepResult) -> None:
        for r in results:
            self.steps.setdefault(r.host, []).append(r)

    def names(self, host: str) -> list[str]:
        return [r.step for r in self.steps.get(host, [])]

    def reached(self, host: str, step: str) -> bool:
        return step in self.names(host)


# How a rollout hears that a step failed a host: (the batch, the host, one line naming the step and why).
OnFail = Callable[["Batch", str, str], None]


@dataclass
class Batch:
    """One batch of a rollout as the machine sees it: its hosts in order, those still going, the journal every
    step writes its typed results to, and ``outcomes``, the rollout's own record of each host (whatever the
    rollout keeps: an apply's ``HostOutcome``). ``on_fail`` is the rollout's: it records, in its own words, why a
    host that a step failed stops there."""

    number: int
    hosts: list[str]
    journal: Journal
    outcomes: dict[str, Any] = field(default_factory=dict)
    going: list[str] = field(default_factory=list)
    on_fail: OnFail | None = None

    def __post_init__(self) -> None:
        self.going = list(self.hosts)

    def stop(self, host: str) -> None:
        """``host`` failed this step: the later steps skip it (its undo is the rollout's to call)."""
        if host in self.going:
            self.going.remove(host)

    def fail(self, host: str, why: str) -> None:
        """A step failed ``host`` for ``why`` (one line naming the step): the rollout records it, the host stops."""
        if self.on_fail is not None:
            self.on_fail(self, host, why)
        self.stop(host)


class Step(Protocol):
    """A step of a rollout, one shape for all: ``do`` runs it for ``batch.going`` (journaling each host's typed
    result under ``name`` and stopping the hosts it failed); ``undo`` puts back what it did on ``hosts`` (each of
    which its journal shows reached) and returns the problems, one line each starting ``"HOST: "``. An undo may
    raise (a restore that failed): the older steps are still undone, then it is raised."""

    @property
    def name(self) -> str: ...

    def do(self, batch: Batch) -> None: ...

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]: ...


@dataclass
class PerHost:
    """A step that does one thing for each host still going that it ``covers``, on its own: ``act(host)`` returns
    the host's typed result (a raise is a failure, one line); ``revert(host)`` is its undo, called only for the
    hosts whose ``act`` worked, and fails by returning a result that is not ok, or by raising. A router's drain is
    one (fleet/router.drain, reverted by the re-add); so is its re-add and the wait in between."""

    name: str
    act: Callable[[str], StepResult]
    revert: Callable[[str], StepResult] | None = None
    covers: Collection[str] | None = None  # None: every host
    done: list[str] = field(default_factory=list)

    def do(self, batch: Batch) -> None:
        for h in list(batch.going):
            if self.covers is not None and h not in self.covers:
                continue
            try:
                got = self.act(h)
            except Exception as exc:  # this host's failure (a client that raised), not the rollout's crash
                got = StepResult(self.name, h, False, str(exc) or type(exc).__name__)
            batch.journal.add(got)
            if got.ok:
                self.done.append(h)
            else:
                batch.fail(h, f"{self.name}: {got.message or 'failed'}")

    def undo(self, batch: Batch, hosts: list[str]) -> list[str]:
        problems = []
        for h in hosts:
            if h not in self.done or self.revert is None:
                continue
            self.done.remove(h)
            try:
                back = self.revert(h)
            except Exception as exc:
                problems.append(f"{h}: undo of {self.name} failed: {exc}")
                continue
            if not back.ok:
                problems.append(f"{h}: undo of {self.name} failed: {back.message or 'failed'}")
        return problems


def drive(steps: Sequence[Step], batch: Batch, checkpoint: Callable[[str], None]) -> None:
    """The rollout of one batch: each step in order, with the checkpoint before it (named by the step) and once
    more at the end (``"end"``)."""
    for step in steps:
        checkpoint(step.name)
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
