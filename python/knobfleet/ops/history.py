"""Use cases: history (generations and ledger per host, from the hosts themselves) and rollback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.fleet.hosts import Hosts, door
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, operator
from knobfleet.module_utils.knob_doc import ProbeDoc
from knobfleet.ops import interrupts
from knobfleet.ops.restores import NOT_TOUCHED, restore_routed
from knobfleet.ops.transaction import RestoreFailed, RestoreOutcome, RestoreTarget, manual_steps


@dataclass
class Generation:
    number: int
    profile: str | None
    version: int | None
    hash: str | None
    status: str | None
    created: str | None
    updated: str | None
    operator: str | None
    reason: str
    current: bool
    files_ok: bool

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class HostHistory:
    host: str
    current: int | None
    generations: list[Generation] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    unreachable: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "current": self.current,
            "generations": [g.as_json() for g in self.generations],
            "errors": self.errors,
            "ledger": self.ledger,
            "unreachable": self.unreachable,
        }


def scrub(value: Any, secret: Any = (), key: str = "") -> Any:
    """Free text from a host's ledger and meta.json with secret assignments and flags hidden (knob_redact.redact_text):
    what knobfleet writes now is redacted where it is made; lines an older knobfleet wrote may not be."""
    from knobfleet.module_utils.knob_redact import redact_text

    if isinstance(value, str):
        return redact_text(value, secret, key)
    if isinstance(value, dict):
        return {k: scrub(v, secret, key) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secret, key) for v in value]
    return value


def from_probe(host: str, doc: ProbeDoc, secret: Any = (), key: str = "") -> HostHistory:
    """Pure: the generations and ledger a probe document holds (free text scrubbed of secrets, ``scrub``)."""
    gens = doc.get("generations") or {}
    current = gens.get("current")
    ledger = [scrub(e, secret, key) for e in gens.get("ledger") or []]
    out = HostHistory(host, current, errors=[scrub(e, secret, key) for e in gens.get("errors") or []], ledger=ledger)
    for entry in gens.get("list") or []:
        meta = entry.get("meta") or {}
        names = {f.get("name") for f in (meta.get("files") or {}).values()}
        out.generations.append(
            Generation(
                number=entry["generation"],
                profile=meta.get("profile"),
                version=meta.get("version"),
                hash=meta.get("hash"),
                status=meta.get("status") if meta else "unreadable",
                created=meta.get("created"),
                updated=meta.get("updated"),
                operator=meta.get("operator"),
                reason=scrub(str(meta.get("reason") or ""), secret, key),
                current=entry["generation"] == current,
                files_ok=names <= set(entry.get("files") or []),
            )
        )
    return out


def history(
    hosts: list[HostVars], inventory: Path | Hosts, on_event: Callable[[Event], None] | None = None
) -> list[HostHistory]:
    from knobfleet.fleet.fleetkey import fleet_key

    outcomes = door(inventory).probe(hosts, on_event)
    out = []
    for hv in hosts:
        o = outcomes[hv.host]
        out.append(
            from_probe(hv.host, o.doc, hv.secrets(), fleet_key())
            if o.error is None
            else HostHistory(hv.host, None, unreachable=str(o.error))
        )
    return out


def rollback(
    hosts: list[HostVars],
    inventory: Path | Hosts,
    to: int | None,
    *,
    break_lock: bool = False,
    on_event: Callable[[Event], None] | None = None,
) -> list[RestoreOutcome]:
    """Switch hosts to generation ``to`` (default: each host's previous good one), restart, wait, verify.
    A host whose target generation is missing or damaged is refused with nothing changed."""
    from knobfleet.ops import ranks

    groups = ranks.of(hosts)
    if groups:  # an engine group goes back as a unit: a --limit with only some of its ranks changes nothing
        ranks.restart_units([hv.host for hv in hosts], groups)
    reason = f"rollback requested by {operator()}" + (f" (--to {to})" if to is not None else "")
    targets = {hv.host: RestoreTarget(to, reason, "rolled-back", "rollback") for hv in hosts}
    with interrupts.deferred():  # a signal is acted on between hosts, never between a drain and its re-add
        return _rollback_outcomes(restore_routed(hosts, inventory, targets, break_lock, on_event), hosts)


def _rollback_outcomes(outcomes: list[RestoreOutcome], hosts: list[HostVars]) -> list[RestoreOutcome]:
    """The rollback's end (inside its deferred section): a restore that failed is RestoreFailed with the manual
    steps; a signal that arrived is Interrupted with what each host runs; else the outcomes."""
    signalled = interrupts.pending()
    broken = [o for o in outcomes if not o.ok and o.generation is not None]
    if broken:
        by_name = {hv.host: hv for hv in hosts}
        lines = [
            f"{o.host}: rollback to generation {o.generation:04d} installed its files but the engine did not "
            f"come back: {o.message}"
            for o in broken
            if o.generation is not None
        ]
        lines.append("Bring it back by hand:")
        lines += [manual_steps(by_name[o.host], o.generation) for o in broken]
        raise RestoreFailed("\n".join(lines), outcomes)
    if signalled:
        done = sum(o.ok for o in outcomes)
        left = sum(o.message == NOT_TOUCHED for o in outcomes)
        raise interrupts.Interrupted(
            f"knobfleet: interrupted: {done} host(s) rolled back, {left} not touched (run rollback again for them)",
            outcomes,
        )
    return outcomes
