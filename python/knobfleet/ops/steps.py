"""The rollout of a host as explicit typed steps, each with a typed result and a defined undo (the shape and the
machine that drives them: ``stepcore``).

    pre-check -> [slots' before] -> install -> restart -> ready -> finish -> verify [-> gate] -> [slots' after]

=============  =====================================================  ==========================================
step           what it does                                           undo
=============  =====================================================  ==========================================
pre-check      one quick probe: in sync (left alone), refused, or go  nothing (nothing changed)
before         the slots' steps before the restart, in order (a       each step's own, newest first
               router's drain, then its settle); nothing of
               knobfleet's changed yet
install        lock, adopt, stage, commit (knob_generation install)   restore: the previous generation, or the
restart        daemon-reload + restart when the generation changed    same one restarted when only the restart
ready          health 200 and a stable main process (knob_ready)      was new (``restore_targets``); the role
finish         mark good, release the lock (knob_generation finish)   released the lock in its ``always``
verify         the ready engine's probe against the rendered files    nothing of its own (the play's restore)
gate           ``apply --gate``: the benchmark gate, host still       restore the rejected host (the play's
               drained; a rejection fails the host and the batch      own restore skips it)
after          the slots' steps once verified (a router's re-add)     each step's own, newest first
=============  =====================================================  ==========================================

That is the order the steps run in: install, restart, ready and finish run on the host in one play of the
knob_serve role (three remote calls per changed host: the performance contract in docs/PERFORMANCE.md), so the
host's finish comes before the controller's verify; their typed results are read from that play's step-keyed
results (``read_play``). The slots' steps run on the controller, before the play and after the verify; each is a
``stepcore.Step`` like the others, named by itself (``drain``, ``settle``, ``readmit``), so a slot plugs in with
no change to the other steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from knobfleet.stepcore import Step, StepResult

# The host's own steps, in order (the slots' steps around install..gate are named by themselves).
StepName = Literal["pre-check", "install", "restart", "ready", "finish", "verify", "gate"]
STEPS: tuple[StepName, ...] = ("pre-check", "install", "restart", "ready", "finish", "verify", "gate")


@dataclass(frozen=True, kw_only=True)
class PreCheckResult(StepResult):
    decided: str | None = None  # the status the pre-check decided (in-sync, unchanged, refused, pending), or None


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


@dataclass(frozen=True)
class Slots:
    """The steps a rollout plugs in around the host's own: ``before`` run after the pre-check, before anything of
    knobfleet's changes on the host (a router's drain, then the wait until it let the worker go); ``after`` once the
    ready engine verified (and judged, under ``--gate``): the re-add. Each is a ``stepcore.Step``."""

    before: Sequence[Step] = ()
    after: Sequence[Step] = ()


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
