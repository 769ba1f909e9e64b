"""Transports: how knobfleet runs one of its on-host module functions on many hosts and gets one outcome
per host. Three ship: ``ssh`` (the fast path over Ansible's own multiplexed connections), ``ansible`` (a
playbook through ansible-runner) and ``local`` (the machine knobfleet runs on, no ssh). ``--via`` takes ``auto``
or any registered name, on every command.

The shared types live in ``base.py`` and are imported from there (``Job``, ``Outcome``, ``Target``, ...); this
package's own names are the registry and what is decided on it (``VIA``, ``choose``, ``run``, ...). Each transport
declares the connection variables it reads and its ``Capabilities``; what happens here (auto's choice, the
fallback for a host without python, the warm-up) is decided on those, never on a transport's name. Adding one is
one file with a class of the ``base.Transport`` shape, plus its line in ``REGISTRY`` below (``local.py`` is the
example).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from knobfleet.errors import UsageError
from knobfleet.fleet.transports.ansible import AnsibleTransport
from knobfleet.fleet.transports.base import (
    Job,
    ModuleCall,
    Outcome,
    Streaming,
    Target,
    Transport,
    bundle,
    collected,
)
from knobfleet.fleet.transports.local import LocalTransport
from knobfleet.fleet.transports.ssh import SshTransport

__all__ = ["REGISTRY", "VIA", "choose", "play_vars", "quick", "run", "stream", "stream_with", "warm_up"]


# In the order ``--via auto`` tries them: one instance of each for the process, holding its own state.
REGISTRY: dict[str, Transport] = {
    "ssh": SshTransport(),
    "ansible": AnsibleTransport(),
    "local": LocalTransport(),
}
VIA = ("auto", *REGISTRY)


def _fallback() -> Transport:
    """The transport that reaches every host Ansible reaches."""
    return next(t for t in REGISTRY.values() if t.caps.fallback)


def _auto(hosts: Sequence[Target]) -> Transport:
    for t in REGISTRY.values():
        if t.caps.auto and not t.caps.fallback and not any(t.ineligible(hv) for hv in hosts):
            return t
    return _fallback()


def choose(hosts: Sequence[Target], via: str) -> Transport:
    """The transport for ``via``: a registered name, or ``auto`` = the first transport ``auto`` may choose that
    reaches every host as Ansible would (ssh), else the fallback (ansible). A named transport that cannot reach a
    host is a usage error."""
    if via not in VIA:
        raise UsageError(f"--via {via!r}: expected one of {', '.join(VIA)}")
    if via == "auto":
        return _auto(hosts)
    chosen = REGISTRY[via]
    reasons = [r for r in (chosen.ineligible(hv) for hv in hosts) if r]
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        fallback = " (falls back to the playbook) or --via ansible" if not chosen.caps.fallback else ""
        raise UsageError(
            f"--via {via}: {reasons[0]}{more} cannot be reached that way as Ansible reaches it; "
            f"use --via auto{fallback}"
        )
    return chosen


def quick(hosts: Sequence[Target], via: str) -> Transport | None:
    """The transport that answers for ``hosts`` without starting ansible-playbook, as ``via`` allows: the one
    ``via`` chooses when it is quick and reaches every host; else None (never an error: the playbook decides)."""
    if not hosts or via not in VIA:
        return None
    if via == "auto":
        chosen = _auto(hosts)
    else:
        chosen = REGISTRY[via]
        if any(chosen.ineligible(hv) for hv in hosts):
            chosen = _auto(hosts) if chosen.caps.auto else chosen
            if any(chosen.ineligible(hv) for hv in hosts):
                return None
    return chosen if chosen.caps.quick else None


def play_vars(via: str) -> dict[str, Any]:
    """The extra vars a playbook run needs to reach hosts the way ``via`` names (none for auto)."""
    return dict(REGISTRY[via].caps.play_vars) if via in REGISTRY else {}


def warm_up(call: ModuleCall, key: Callable[[], str | None], via: str, forks: int | None = None) -> None:
    """Start the calls the last run over the same inventory and limit saved, first thing (only a transport that
    declares it warms up, and that ``via`` may choose; at most ``forks`` of them). ``key``: the inventory's
    fingerprint for that limit (asked only when a transport warms up; None: not cached)."""
    if via not in VIA:
        return
    named = [REGISTRY[via]] if via in REGISTRY else list(REGISTRY.values())
    warm = [t for t in named if t.caps.warms_up and (via in REGISTRY or t.caps.auto)]
    if not warm:
        return
    fingerprint = key()
    if fingerprint:
        from knobfleet import paths

        payload = bundle(call.source(), paths.module_utils_dir(), call.private)  # byte-equal to what the run sends
        for t in warm:
            t.warm_up(f"{call.module}:{fingerprint}", payload, forks)


def _stop_warm(chosen: Transport) -> None:
    """Stop what transports other than ``chosen`` started ahead (nobody will collect it)."""
    for t in REGISTRY.values():
        if t.caps.warms_up and t is not chosen:
            t.stop_warm()


def stream(job: Job, via: str = "auto") -> Iterator[Outcome]:
    """``job`` through the transport ``via`` chooses, at most ``job.limit()`` hosts at once, each host's outcome
    as it arrives. A host whose python the fast path did not find is retried through Ansible (its interpreter
    discovery finds one) once the others are done."""
    yield from stream_with(choose(job.hosts, via), job)


def stream_with(chosen: Transport, job: Job) -> Iterator[Outcome]:
    """``stream`` through a transport already chosen."""
    _stop_warm(chosen)
    job = job._replace(forks=job.limit())
    retry: list[Target] = []
    by_name = {hv.host: hv for hv in job.hosts}
    outcomes: Iterable[Outcome] = _streaming(chosen).stream(job) if chosen.caps.streams else chosen.run(job).values()
    for o in outcomes:
        if o.missing_python and not chosen.caps.fallback:
            retry.append(by_name[o.host])
        else:
            yield o
    if retry:
        yield from _fallback().run(job._replace(hosts=retry)).values()


def _streaming(t: Transport) -> Streaming:
    assert hasattr(t, "stream"), f"{type(t).__name__} declares caps.streams without a stream method"
    return t  # type: ignore[return-value]


def run(job: Job, via: str = "auto") -> dict[str, Outcome]:
    """``stream``, collected: every host's outcome, in the order of ``job.hosts``."""
    return collected(stream(job, via), job.hosts)
