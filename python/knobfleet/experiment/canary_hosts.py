"""Pure: which hosts a canary runs on, and the advisory text (``knobfleet canary``).

``split`` picks an equal canary and baseline subset in inventory order, refusing in one line a host behind no
router or an engine whose catalog names no metrics, before anything changes; ``advice`` is what ``--advisory`` says
the judge would do, with the exact command that does it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from knobfleet.errors import UsageError
from knobfleet.experiment.canary import Verdict
from knobfleet.experiment.canary_windows import engine_name, engine_series
from knobfleet.fleet.hostvars import HostVars
from knobfleet.profiles.model import Profile


class Sizing(Protocol):
    """How many canaries (``CanaryOptions``): a count, else a fraction of the hosts."""

    @property
    def hosts(self) -> int | None: ...

    @property
    def fraction(self) -> float | None: ...


def split(hosts: Sequence[HostVars], opts: Sizing) -> tuple[list[HostVars], list[HostVars], list[HostVars]]:
    """Pure: (canaries, baseline, rest) — an equal canary and baseline subset, in inventory order."""
    unrouted = [hv.host for hv in hosts if not hv.router_url]
    if unrouted:
        raise UsageError(
            f"canary: {', '.join(unrouted[:3])} {'is' if len(unrouted) == 1 else 'are'} behind no router "
            "(knob_router_url): a canary is judged on live traffic through the router"
        )
    for engine in sorted({engine_name(hv) for hv in hosts}):
        engine_series(engine)  # an engine whose catalog names no metrics: one line before anything changes
    n = opts.hosts if opts.hosts is not None else max(1, math.floor(len(hosts) * (opts.fraction or 0.25)))
    if n < 1 or 2 * n > len(hosts):
        raise UsageError(
            f"canary: {n} canary host(s) need as many baseline hosts; {len(hosts)} selected (use --hosts N with "
            f"2N <= {len(hosts)})"
        )
    return list(hosts[:n]), list(hosts[n : 2 * n]), list(hosts[2 * n :])


def advice(profile: Profile, verdict: Verdict, running: list[HostVars], others: list[HostVars], who: str) -> str:
    """Advisory mode: what the judge would do, and the exact command that does it (``running``: the hosts on the
    profile now: the canaries, or after a crossover's swap the baseline)."""
    names = ",".join(h.host for h in running)
    stay = f"advisory: {who} ({names}) left on {profile.ref}"
    if verdict.verdict == "promote":
        rest = ",".join(h.host for h in others)
        cmd = f"apply-profile {profile.name} --yes" + (f" --limit {rest}" if rest else "")
        back = f"knobfleet rollback --limit {names} --yes"
        return f"{stay}; the judge would promote: `{cmd}`; to roll back instead: `{back}`"
    return (
        f"{stay}; the judge would roll back ({verdict.verdict}): `knobfleet rollback --limit {names} --yes`; "
        f"to promote instead: `apply-profile {profile.name} --yes`"
    )
