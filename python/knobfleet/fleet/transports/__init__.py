"""Transports: how knobfleet runs one of its on-host module functions on many hosts and gets one outcome
per host. Two ship: ``ssh`` (the fast path over Ansible's own multiplexed connections) and ``ansible``
(a playbook through ansible-runner). ``--via`` takes ``auto`` or any registered name, on every command.

Adding one (say ``docker exec`` for engines in containers) is one file with a class that has ``name``,
``ineligible(hv)``, ``warm_up(key, payload)`` and ``run(hosts, call, inventory, on_event)``, plus its line
in ``REGISTRY`` below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from knobfleet.errors import UsageError
from knobfleet.fleet.transports.ssh import HostFailure, Outcome, SshTransport, bundle

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars

__all__ = ["REGISTRY", "VIA", "HostFailure", "ModuleCall", "Outcome", "Transport", "choose", "run", "warm_up"]


@dataclass(frozen=True)
class ModuleCall:
    """One module function to run on every host: ``role/library/module.py``'s ``function(args[host])``; the
    playbook that runs the same module through Ansible, and the key of the module's result there."""

    role: str
    module: str
    function: str
    playbook: str
    result_key: str
    args: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeout_s: float = 60.0

    def source(self) -> bytes:
        from knobfleet import paths

        return paths.module_source(self.role, self.module).read_bytes()


class Transport(Protocol):
    name: ClassVar[str]

    def ineligible(self, hv: HostVars) -> str | None:
        """Why this transport cannot reach ``hv`` exactly as Ansible would (None: it can)."""

    def warm_up(self, key: str, source: bytes) -> None:
        """Start work saved for ``key`` by an earlier run, before the slow imports (optional: may do nothing)."""

    def run(
        self,
        hosts: Sequence[HostVars],
        call: ModuleCall,
        inventory: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Outcome]:
        """``call`` on every host, each bounded by ``call.timeout_s``; an outcome per host, never an exception
        for one host's failure."""


def _ansible() -> Transport:
    from knobfleet.fleet.transports.ansible import AnsibleTransport

    return AnsibleTransport()


REGISTRY: dict[str, Callable[[], Transport]] = {"ssh": SshTransport, "ansible": _ansible}
VIA = ("auto", *REGISTRY)


def choose(hosts: Sequence[HostVars], via: str) -> Transport:
    """The transport for ``via``: a registered name, or ``auto`` = ssh when it reaches every host as Ansible
    would, else ansible. A named transport that cannot reach a host is a usage error."""
    if via not in VIA:
        raise UsageError(f"--via {via!r}: expected one of {', '.join(VIA)}")
    if via == "auto":
        fast = REGISTRY["ssh"]()
        return fast if not any(fast.ineligible(hv) for hv in hosts) else REGISTRY["ansible"]()
    chosen = REGISTRY[via]()
    reasons = [r for r in (chosen.ineligible(hv) for hv in hosts) if r]
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise UsageError(
            f"--via {via}: {reasons[0]}{more} cannot be reached that way as Ansible reaches it; "
            "use --via auto (falls back to the playbook) or --via ansible"
        )
    return chosen


def warm_up(call: ModuleCall, inventory: Path, limit: str | None, via: str) -> None:
    """Start the probes the last run over the same inventory and limit saved, first thing (ssh only)."""
    from knobfleet.fleet.inventory import fingerprint

    if via not in ("auto", "ssh") or not inventory.exists():
        return
    key = fingerprint(inventory, limit)
    if key:
        from knobfleet import paths

        SshTransport().warm_up(f"{call.module}:{key}", bundle(call.source(), paths.module_utils_dir()))


def run(
    hosts: Sequence[HostVars],
    call: ModuleCall,
    inventory: Path,
    via: str = "auto",
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Outcome]:
    """``call`` on ``hosts`` through the chosen transport. A host whose python the fast path did not find is
    retried through Ansible (its interpreter discovery finds one)."""
    chosen = choose(hosts, via)
    if chosen.name != "ssh":
        from knobfleet.fleet.transports.ssh import stop_unused

        stop_unused()
    out = chosen.run(hosts, call, inventory, on_event)
    retry = [hv for hv in hosts if out[hv.host].missing_python]
    if retry:
        out.update(REGISTRY["ansible"]().run(retry, call, inventory, on_event))
    return out
