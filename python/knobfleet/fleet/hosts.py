"""``Hosts``: the one door from the use cases to the hosts. The CLI builds one per command from ``--inventory``,
``--via`` and ``--forks`` and hands it to the use case; ``ops/`` reads and changes hosts only through it and never
names a transport. Four ways through:

* ``warm_up(limit)``: start the probes an earlier run saved, before the slow imports (where the transport can);
* ``probe(hosts)`` / ``stream(hosts)``: one knob_probe call per host (every outcome, or each as it arrives);
  ``quick=True`` probes only when a transport answers without ansible-playbook (apply's pre-check), else ``{}``;
* ``play(request, hosts)``: a playbook through ansible-runner, with the extra vars the chosen transport needs
  (``--via local``: ``ansible_connection: local``; a host it cannot reach is refused before the run).

Standard library only at import time (the CLI builds it before pydantic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from knobfleet.fleet import transports
from knobfleet.fleet.transports.base import Job, Outcome, Target, check_forks, default_forks

__all__ = ["Hosts", "door", "fork_count", "via_choices"]

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.fleet.probe import ProbeTarget
    from knobfleet.fleet.runner import RunRequest, RunResult

OnEvent = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Hosts:
    inventory: Path
    via: str = "auto"
    forks: int | None = None  # None: base.default_forks() when a transport needs it
    keep: bool = False  # keep each host's probe interpreter between probes where the transport can (--watch)

    def warm_up(self, limit: str | None) -> None:
        from knobfleet.fleet import probe

        probe.warm_up(self.inventory, limit, self.via, self.forks)

    def quick(self, hosts: Sequence[Target]) -> bool:
        """Whether a probe of ``hosts`` is answered without starting ansible-playbook (as ``via`` allows)."""
        return transports.quick(hosts, self.via) is not None

    def probe(
        self, hosts: Sequence[HostVars], on_event: OnEvent | None = None, *, quick: bool = False
    ) -> dict[str, Outcome]:
        """Each host's probe outcome, in the order of ``hosts``. ``quick``: only through a transport that needs no
        playbook; ``{}`` when there is none for these hosts."""
        from knobfleet.fleet import probe

        if not hosts:
            return {}
        if quick:
            chosen = transports.quick(hosts, self.via)
            if chosen is None:
                return {}
            job = Job(hosts, probe.call(hosts), self.inventory, on_event, self.forks)
            got = {o.host: o for o in transports.stream_with(chosen, job)}
            return {hv.host: got[hv.host] for hv in hosts}
        return probe.probe(hosts, self.inventory, self.via, on_event)

    def stream(self, hosts: Sequence[ProbeTarget], on_event: OnEvent | None = None) -> Iterator[Outcome]:
        """Each host's probe outcome as it arrives, at most ``forks`` hosts at once."""
        from knobfleet.fleet import probe

        return probe.stream(hosts, self.inventory, self.via, on_event, self.forks, persist=self.keep)

    def reaching(self, hosts: Sequence[Target]) -> Hosts:
        """This door, or, when the transport ``via`` names cannot reach every one of ``hosts`` but ``auto`` may
        stand in for it (``--via ssh`` on a host with become), the same door through ``auto``: for a read after a
        change (the restore's verify), which must not fail on how it reaches a host."""
        import dataclasses

        from knobfleet.errors import UsageError

        try:
            transports.choose(hosts, self.via)
        except UsageError:
            if transports.play_vars(self.via):
                raise
            return dataclasses.replace(self, via="auto")
        return self

    def play(self, req: RunRequest, hosts: Sequence[Target] = ()) -> RunResult:
        """``req`` through ansible-runner on this inventory, reaching ``hosts`` the way ``via`` says."""
        import dataclasses

        from knobfleet.fleet.runner import run_playbook

        extra = transports.play_vars(self.via)
        if extra:
            transports.choose(hosts, self.via)  # a host this transport cannot reach: refused before the run
            req = dataclasses.replace(req, trusted_vars={**req.trusted_vars, **extra})
        if req.inventory != self.inventory:
            req = dataclasses.replace(req, inventory=self.inventory)
        return run_playbook(req)


def door(where: Path | str | Hosts, via: str = "auto", forks: int | None = None) -> Hosts:
    """A use case's ``Hosts``: the one it was handed (or anything shaped like it: a test's fake), else the door
    to an inventory (callers from before the door existed pass the inventory's path)."""
    return Hosts(Path(where), via, forks) if isinstance(where, str | PurePath) else where


def via_choices() -> tuple[str, ...]:
    """What a door's ``via`` may name (``--via``'s choices): ``auto``, then each registered transport."""
    return transports.VIA


def fork_count(asked: int | None) -> int:
    """How many hosts a door works on at once: ``asked`` (``--forks``) when given, checked, else the transports'
    default (``KNOBFLEET_FORKS``, else ansible.cfg's ``forks``, else 32)."""
    return check_forks(asked) if asked is not None else default_forks()
