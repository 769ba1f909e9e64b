"""The rollout's view of engine groups (``knob_engine_groups``; pure ``groups.py`` and ``live/groups.py``):
a group's ranks are one restart unit.

- Before anything changes: a ``--limit`` that leaves out some ranks of a group is refused; so is a group whose
  ranks would come up mismatched (their rendered env, flags or model, or the engine versions the pre-check read,
  differ beyond the per-rank allow-list); a rank the pre-check refuses refuses its whole group.
- A group is left alone only when every rank is in sync; otherwise every rank goes through the same play (the
  role's barrier: none restarts unless every rank installed, and all restart when one changed).
- After the play: the cross-rank rule on the ready ranks' probes (the followers' health proves nothing; rank 0's
  report of who joined does); one failed rank fails the group, and every rank goes back to its previous
  generation together.

Pure: the caller hands in outcomes, rendered state and probe documents."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from knobfleet.groups import EngineGroup, units
from knobfleet.live import groups as rule
from knobfleet.live.verify import findings_of
from knobfleet.ops.outcome import HostOutcome

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars
    from knobfleet.render import Rendered


def of(hosts: list[HostVars]) -> dict[str, EngineGroup]:
    """The engine groups of ``hosts`` by name, in inventory order."""
    out: dict[str, EngineGroup] = {}
    for hv in hosts:
        if hv.group is not None:
            out.setdefault(hv.group.name, hv.group)
    return out


def restart_units(hosts: list[str], groups: Mapping[str, EngineGroup]) -> list[tuple[str, ...]]:
    """``hosts`` in restart units (raises ``GroupError`` when they hold only some ranks of a group)."""
    return list(units(hosts, list(groups.values())).units)


def role_vars(groups: Mapping[str, EngineGroup], engine: str, only: Collection[str] | None = None) -> dict[str, Any]:
    """``knob_serve_groups`` for the role: each rank's group name, hosts and per-rank flags (of the ranks in
    ``only``, when given: the hosts this apply rendered)."""
    from knobfleet.engines.adapter import engine as adapter
    from knobfleet.groups import rank_flags
    from knobfleet.render import rank_spec

    return {
        m.host: {"name": g.name, "hosts": g.hosts, "args": rank_flags(g, m.host, rank_spec(g, adapter(engine)))}
        for g in groups.values()
        for m in g.members
        if only is None or m.host in only
    }


def rendered_mismatch(
    group: EngineGroup,
    rendered: Mapping[str, Rendered],
    engine: Mapping[str, Any],
    versions: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """The cross-rank findings of ``group`` as rendered for this apply (and the engine versions installed, when
    the pre-check read them): a group that would come up mismatched."""
    versions = versions or {}
    states = {
        h: rule.from_rendered(r.env_shown, r.argv_shown, engine, versions.get(h))
        for h, r in rendered.items()
        if h in group.hosts
    }
    return rule.check(group, states)


def refusal_text(group: EngineGroup, found: list[dict[str, Any]]) -> str:
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    fix = (
        "install the same engine version on every rank"
        if found[0].get("name") == "engine version"
        else "make the ranks' host vars agree (only the per-rank allow-list, may_differ, may differ)"
    )
    return (
        f"engine group {group.name} would come up mismatched: {found[0]['message']}{more}; {fix}; no rank was touched"
    )


def merge_decided(
    decided: dict[str, HostOutcome], groups: Mapping[str, EngineGroup], refused: Mapping[str, str]
) -> dict[str, HostOutcome]:
    """The pre-check's decisions, made per group: ``refused`` (group -> why) and a rank the pre-check refused
    refuse every rank; a group is decided in sync only when every rank is; otherwise none of its ranks is
    decided (all go through the play)."""
    out = dict(decided)
    for g in groups.values():
        ranks = g.hosts
        why = refused.get(g.name)
        first = next((out[h] for h in ranks if h in out and out[h].status == "refused"), None)
        if why is None and first is not None:
            why = f"engine group {g.name}: {first.host} is refused ({first.message}); no rank of the group is touched"
        if why is not None:
            for h in ranks:
                if h in out and out[h].status == "refused" and out[h] is first:
                    continue
                prev = out.get(h)
                gen = prev.generation if prev is not None else None
                out[h] = HostOutcome(h, "refused", 0, gen, gen, message=why, findings=prev.findings if prev else [])
            continue
        if not all(h in out and out[h].status in ("unchanged", "in-sync") for h in ranks):
            for h in ranks:
                if h in out and out[h].status in ("unchanged", "in-sync"):
                    del out[h]  # restarts with the rest of its group
    return out


def after_play(
    outcomes: Mapping[str, HostOutcome],
    docs: Mapping[str, Any],
    groups: Mapping[str, EngineGroup],
    engine: Mapping[str, Any],
) -> None:
    """The cross-rank rule on the ranks' ready probes, and one failed rank failing its whole group: every rank
    that went through the play is marked for the restore (its previous generation, or the same one restarted)."""
    for g in groups.values():
        ranks = [h for h in g.hosts if h in outcomes]
        if not ranks:
            continue
        states = {h: rule.from_probe(docs[h], engine) for h in ranks if isinstance(docs.get(h), dict)}
        if not any(outcomes[h].status == "failed" for h in ranks) and len(states) == len(ranks):
            for f in rule.check(g, rule.with_reports(g, states)):
                o = outcomes[f["host"]]
                o.findings = [*o.findings, *findings_of([f])]
                if o.status != "failed":
                    o.status, o.message = "failed", str(f["message"])
        failed = [outcomes[h] for h in ranks if outcomes[h].status == "failed"]
        if not failed:
            continue
        cause = f"engine group {g.name}: {failed[0].host} failed ({failed[0].message}); every rank goes back"
        for h in ranks:
            o = outcomes[h]
            if o.status not in ("failed", "refused"):
                o.status, o.message = "failed", cause
            if o.status == "failed" and o.generation is not None:
                o.committed = True  # restarted with its group, or installed: the restore puts every rank back
