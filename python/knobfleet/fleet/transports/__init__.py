"""Transports: how knobfleet runs one of its on-host module functions on many hosts and gets one outcome
per host. Two ship: ``ssh`` (the fast path over Ansible's own multiplexed connections) and ``ansible``
(a playbook through ansible-runner). ``--via`` takes ``auto`` or any registered name, on every command.

Adding one (say ``docker exec`` for engines in containers) is one file with a class that has ``name``,
``ineligible(hv)``, ``warm_up(key, payload)`` and ``run(hosts, call, inventory, on_event)``, plus its line
in ``REGISTRY`` below. A transport that can hand each host's outcome over as it arrives also has
``stream(hosts, call, inventory, on_event, forks)`` (the ssh one does); ``stream`` below falls back to ``run``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from knobfleet.errors import UsageError
from knobfleet.fleet.transports.ssh import HostFailure, Outcome, SshTransport, Target, bundle, default_forks

__all__ = [
    "REGISTRY",
    "VIA",
    "HostFailure",
    "ModuleCall",
    "Outcome",
    "Target",
    "Transport",
    "choose",
    "default_forks",
    "run",
    "stream",
    "warm_up",
]


@dataclass(frozen=True)
class ModuleCall:
    """One module function to run on every host: ``role/library/module.py``'s ``function(args[host])``; the
    playbook that runs the same module through Ansible, and the key of the module's result there."""

    role: str
    module: str
    function: str
    playbook: str
    result_key: str
    args: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    timeout_s: float = 60.0
    # Options of every host's call kept out of any argv and cached file (the fleet's secret-marker key): the ssh
    # transport sends them on stdin; through Ansible the task reads them from the run's 0600 vars file.
    private: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def source(self) -> bytes:
        from knobfleet import paths

        return paths.module_source(self.role, self.module).read_bytes()


class Transport(Protocol):
    name: ClassVar[str]

    def ineligible(self, hv: Target) -> str | None:
        """Why this transport cannot reach ``hv`` exactly as Ansible would (None: it can)."""

    def warm_up(self, key: str, source: bytes) -> None:
        """Start work saved for ``key`` by an earlier run, before the slow imports (optional: may do nothing)."""

    def run(
        self,
        hosts: Sequence[Target],
        call: ModuleCall,
        inventory: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        forks: int | None = None,
    ) -> dict[str, Outcome]:
        """``call`` on every host, at most ``forks`` at once, each bounded by ``call.timeout_s``; an outcome per
        host, never an exception for one host's failure."""


def _ansible() -> Transport:
    from knobfleet.fleet.transports.ansible import AnsibleTransport

    return AnsibleTransport()


REGISTRY: dict[str, Callable[[], Transport]] = {"ssh": SshTransport, "ansible": _ansible}
VIA = ("auto", *REGISTRY)


def choose(hosts: Sequence[Target], via: str) -> Transport:
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


def warm_up(call: ModuleCall, inventory: Path, limit: str | None, via: str, forks: int | None = None) -> None:
    """Start the probes the last run over the same inventory and limit saved, first thing (ssh only; at most
    ``forks`` of them)."""
    from knobfleet.fleet.inventory import fingerprint

    if via not in ("auto", "ssh") or not inventory.exists():
        return
    key = fingerprint(inventory, limit)
    if key:
        from knobfleet import paths

        SshTransport().warm_up(
            f"{call.module}:{key}", bundle(call.source(), paths.module_utils_dir(), call.private), forks
        )


def stream(
    hosts: Sequence[Target],
    call: ModuleCall,
    inventory: Path,
    via: str = "auto",
    on_event: Callable[[dict[str, Any]], None] | None = None,
    forks: int | None = None,
) -> Iterator[Outcome]:
    """``call`` on ``hosts`` through the chosen transport, at most ``forks`` hosts at once (default:
    ``default_forks()``), each host's outcome as it arrives. A host whose python the fast path did not find is
    retried through Ansible (its interpreter discovery finds one) once the others are done."""
    chosen = choose(hosts, via)
    if chosen.name != "ssh":
        from knobfleet.fleet.transports.ssh import stop_unused

        stop_unused()
    forks = forks if forks is not None else default_forks()
    retry: list[Target] = []
    by_name = {hv.host: hv for hv in hosts}
    each = getattr(chosen, "stream", None)
    outcomes: Iterable[Outcome] = (
        each(hosts, call, inventory, on_event, forks)
        if each
        else chosen.run(hosts, call, inventory, on_event, forks).values()
    )
    for o in outcomes:
        if o.missing_python:
            retry.append(by_name[o.host])
        else:
            yield o
    if retry:
        yield from REGISTRY["ansible"]().run(retry, call, inventory, on_event, forks).values()


def run(
    hosts: Sequence[Target],
    call: ModuleCall,
    inventory: Path,
    via: str = "auto",
    on_event: Callable[[dict[str, Any]], None] | None = None,
    forks: int | None = None,
) -> dict[str, Outcome]:
    """``stream``, collected: every host's outcome, in the order of ``hosts``."""
    got = {o.host: o for o in stream(hosts, call, inventory, via, on_event, forks)}
    return {hv.host: got[hv.host] for hv in hosts}
