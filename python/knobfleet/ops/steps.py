"""The rollout of a host as explicit typed steps, each with a typed result and a defined undo.

    pre-check -> slot-before -> install -> restart -> ready -> verify -> slot-after -> finish

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
verify         the ready engine's probe against the rendered files    the same restore
slot-after     each ``SlotStep.do`` in order (a router re-add)        each done step's ``undo``, in reverse
=============  =====================================================  ==========================================

A host's undo runs its done steps' undos in reverse: slot-after, then the restore, then slot-before.

install, restart, ready and finish run on the host in one play of the knob_serve role (three remote calls per
changed host: the performance contract in docs/PERFORMANCE.md); their typed results are read from that play's
step-keyed results (``read_play``). The slots run on the controller, before the play and after the verify, so a
slot plugs in with no change to the other steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

StepName = Literal["pre-check", "slot-before", "install", "restart", "ready", "verify", "slot-after", "finish"]
STEPS: tuple[StepName, ...] = (
    "pre-check",
    "slot-before",
    "install",
    "restart",
    "ready",
    "verify",
    "slot-after",
    "finish",
)
REMOTE: tuple[StepName, ...] = ("install", "restart", "ready", "finish")  # one play of the role
# Steps after which a failure or an interrupt restores the host (what changed there is knobfleet's).
RESTORES_FROM: StepName = "install"


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
    actions: tuple[str, ...] = ()


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
    out: list[StepResult] = [
        InstallResult(
            "install",
            host,
            install_ok,
            str(begin.get("msg") or "") if begin.get("refused") else "",
            generation=commit.get("generation", begin.get("generation")),
            previous=commit.get("previous", begin.get("generation")),
            committed=bool(commit.get("changed")),
            refused=bool(begin.get("refused")),
            lock=begin.get("lock"),
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
        )
    )
    if ready_ok:
        out.append(FinishResult("finish", host, success and "finish" not in failed, released=bool(finish) or success))
    return out


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
