"""A fake ``Hosts`` door for the rollout's unit tests: each host is a small model of what the knob_serve role
keeps on a host (current generation, lock, generation statuses), the apply and restore plays act on it as the
role does (the lock is released in the role's ``always``), and every call is logged in order."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.fleet.runner import HostResult, RunRequest, RunResult
from knobfleet.fleet.transports.base import Outcome, Target
from knobfleet.stepcore import PerHost, StepResult

CLEAN = Path(__file__).parents[1] / "live" / "verify_cases" / "clean" / "probe.json"
REMOTE = ("install", "restart", "ready", "finish")


@dataclass
class Host:
    current: int = 3
    lock: str | None = None
    status: dict[int, str] = field(default_factory=lambda: {3: "good"})
    # install, restart, ready, finish: that step fails on the host; begin: refused; killed: the install's process is
    # killed after it moved `current` to a new generation (left 'installing', the lock still held)
    fail_at: str | None = None
    bad_probe: bool = False  # the ready engine's probe does not match the profile (the verify step fails)
    in_sync: bool = False  # the host already runs what is applied: nothing changes, nothing restarts


@dataclass
class FakeHosts:
    hosts: dict[str, Host]
    log: list[str] = field(default_factory=list)
    inventory: Path = Path("/nonexistent/inventory")
    during_play: Callable[[], None] | None = None  # e.g. a signal arriving while the play runs

    def quick(self, hosts: Sequence[Target]) -> bool:
        return False

    def warm_up(self, limit: str | None) -> None:
        return None

    def reaching(self, hosts: Sequence[Target]) -> FakeHosts:
        return self

    def probe(self, hosts: Sequence[Any], on_event: Any = None, *, quick: bool = False) -> dict[str, Outcome]:
        return {}

    def stream(self, hosts: Sequence[Any], on_event: Any = None) -> Iterator[Outcome]:
        doc = json.loads(CLEAN.read_text())
        for hv in hosts:
            self.log.append(f"probe {hv.host}")
            yield Outcome(hv.host, doc=doc)

    def play(self, req: RunRequest, hosts: Sequence[Target] = ()) -> RunResult:
        names = [hv.host for hv in hosts]
        self.log.append(f"play {req.playbook} {','.join(names)}")
        result = RunResult(req.run_id or "run", 0, "successful", {}, Path("/nonexistent"), 0.0)
        for h in names:
            result.hosts[h] = (self._apply if req.playbook == "apply.yml" else self._restore)(h, req)
        if self.during_play is not None:
            self.during_play()
        return result

    def _apply(self, name: str, req: RunRequest) -> HostResult:
        host = self.hosts[name]
        hr = HostResult(name)
        run = str(req.trusted_vars["knob_serve_run_id"])
        host.lock = run  # begin
        new = host.current + 1
        previous = host.current
        try:
            if host.in_sync:
                hr.results["begin"] = {"generation": previous}
                hr.results["commit"] = {"changed": False, "generation": previous, "previous": previous, "actions": []}
                hr.results["ready"] = {"main_pid": 42, "ready_s": 0.0, "done": [], "probe": None}
                hr.results["finish"] = {"changed": False}
                return hr
            if host.fail_at == "begin":  # a foreign drop-in: refused before anything changes
                hr.results["begin"] = {"failed": True, "refused": True, "msg": "foreign drop-in", "generation": 3}
                hr.failures.append(("install", "foreign drop-in"))
                return hr
            if host.fail_at == "killed":  # the on-host install killed after it moved `current`: no result, lock held
                host.current, host.status[new] = new, "installing"
                msg = "MODULE FAILURE\nSee stdout/stderr for the exact error"
                hr.results["knob_generation"] = {"failed": True, "rc": 137, "module_stdout": "", "msg": msg}
                hr.failures.append(("install", "MODULE FAILURE"))
                return hr
            if host.fail_at == "install":
                hr.results["begin"] = {"generation": previous}
                hr.results["commit"] = {"failed": True, "msg": "systemd-analyze verify failed"}
                hr.failures.append(("install", "systemd-analyze verify failed"))
                return hr
            host.status[new] = "installing"
            host.current = new
            hr.results["begin"] = {"generation": previous}
            hr.results["commit"] = {"changed": True, "generation": new, "previous": previous, "actions": ["install"]}
            if host.fail_at in ("restart", "ready"):
                done = [] if host.fail_at == "restart" else ["daemon-reload", "restart"]
                hr.results["ready"] = {"failed": True, "done": done, "msg": f"{host.fail_at} failed"}
                hr.failures.append(("ready", f"{host.fail_at} failed"))
                host.status[new] = "failed"  # the role's rescue
                return hr
            probe = json.loads(CLEAN.read_text()) if host.bad_probe else None
            hr.results["ready"] = {"main_pid": 42, "ready_s": 0.5, "done": ["daemon-reload", "restart"], "probe": probe}
            if host.fail_at == "finish":
                hr.results["finish"] = {"failed": True, "msg": "ledger unwritable"}
                hr.failures.append(("finish", "ledger unwritable"))
                host.status[new] = "failed"
                return hr
            hr.results["finish"] = {"changed": True}
            host.status[new] = "good"
            return hr
        finally:
            hr.failed = len(hr.failures)
            if host.fail_at != "killed":
                host.lock = None  # the role's always: release (a killed module releases nothing)

    def _restore(self, name: str, req: RunRequest) -> HostResult:
        host = self.hosts[name]
        plan = req.unsafe_vars["knob_restore_plan"][name]
        if host.lock is not None and not req.trusted_vars.get("knob_serve_break_lock"):
            hr = HostResult(name)
            hr.results["restore"] = {"failed": True, "msg": f"locked by run {host.lock}"}
            hr.failures.append(("restore", f"locked by run {host.lock}"))
            hr.failed = 1
            return hr
        for n, s in host.status.items():  # the restore's begin: another run's 'installing' generation is interrupted
            if s == "installing":
                host.status[n] = "interrupted"
        to = plan["to"] if plan["to"] is not None else max(n for n, s in host.status.items() if s == "good")
        previous = host.current
        if plan["leave"] and previous != to:
            host.status[previous] = plan["leave"]
        host.current = to
        host.lock = None
        hr = HostResult(name)
        hr.results["restore"] = {"generation": to, "previous": previous}
        return hr


def slot(name: str, log: list[str], fails_on: set[str] = frozenset(), raises: bool = False) -> PerHost:  # type: ignore[assignment]
    """A slot's step (a router client's drain or re-add, say) that logs what it does and its undo: the same
    ``stepcore.PerHost`` the router's steps are."""

    def act(host: str) -> StepResult:
        log.append(f"{name} {host}")
        if host in fails_on and raises:
            raise RuntimeError("router said 503")
        return StepResult(name, host, host not in fails_on, "failed" if host in fails_on else "")

    def revert(host: str) -> StepResult:
        log.append(f"undo {name} {host}")
        return StepResult(name, host, True)

    return PerHost(name, act, revert)
