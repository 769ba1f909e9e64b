"""Pure: engine groups — one engine spread over several hosts (multi-node tensor parallel), or prefill/decode
pools behind a router — declared in the inventory and checked before anything runs.

The inventory declares groups once, in group vars (``knob_engine_groups``)::

    knob_engine_groups:
      dsv4-a:                       # multi-node TP: ranks 0..N-1, rank 0 serves the API
        members: {gpu1: 0, gpu2: 1}
        dist_port: 5000             # rank 0's rendezvous port (default 5000)
      dsv4-pd:                      # a prefill/decode pair behind a router
        kind: pd
        members: {gpu3: prefill, gpu4: decode}

knobfleet renders the per-rank flags itself (``rank_flags``): SGLang's ``--nnodes/--node-rank/--dist-init-addr``
(the address is rank 0's), vLLM's ``--nnodes/--node-rank/--master-addr/--master-port`` with ``--headless`` on
followers. What may legitimately differ between ranks is an allow-list (``may_differ``): the node rank, the host's
own address, NIC names and visible devices. Everything else must be identical; ``live.groups`` checks that on the
observed state.

Every problem in a declaration is one line naming the group and the fix, at plan time, before any host changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from knobfleet.errors import InventoryError

ROLES = ("prefill", "decode")
DEFAULT_DIST_PORT = 5000
# Env vars that may differ between the ranks of one engine by design.
MAY_DIFFER_ENV = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "CUDA_VISIBLE_DEVICES",
    "HOSTNAME",
)
# Flags knobfleet renders per rank, and the host's own listen address: never compared across ranks.
PER_RANK_FLAGS = ("node-rank", "headless", "host")


class GroupError(InventoryError):
    """An engine group that cannot run as declared."""


@dataclass(frozen=True)
class Member:
    host: str
    address: str
    rank: int  # 0..N-1 (pd groups: order of declaration within the role)
    role: str = "rank"  # rank | prefill | decode


@dataclass(frozen=True)
class EngineGroup:
    name: str
    kind: str  # tp | pd
    members: tuple[Member, ...]
    dist_port: int = DEFAULT_DIST_PORT
    may_differ: tuple[str, ...] = MAY_DIFFER_ENV

    @property
    def head(self) -> Member:
        return next(m for m in self.members if m.rank == 0 and m.role in ("rank", "prefill"))

    @property
    def hosts(self) -> list[str]:
        return [m.host for m in self.members]

    def member(self, host: str) -> Member:
        return next(m for m in self.members if m.host == host)


def from_json(data: Mapping[str, Any]) -> EngineGroup:
    """An ``EngineGroup`` back from ``dataclasses.asdict`` (the read path's cache keeps groups as plain JSON)."""
    members = tuple(Member(str(m["host"]), str(m["address"]), int(m["rank"]), str(m["role"])) for m in data["members"])
    return EngineGroup(str(data["name"]), str(data["kind"]), members, int(data["dist_port"]), tuple(data["may_differ"]))


def _where(name: str) -> str:
    return f"knob_engine_groups.{name}"


def parse(declared: Any, addresses: Mapping[str, str]) -> list[EngineGroup]:
    """The groups of ``knob_engine_groups`` over the inventory's hosts (host -> address)."""
    if declared in (None, {}):
        return []
    if not isinstance(declared, Mapping):
        raise GroupError("knob_engine_groups: must be a mapping of group name to {members: …}")
    groups: list[EngineGroup] = []
    owner: dict[str, str] = {}
    for name, spec in declared.items():
        where = _where(str(name))
        if not isinstance(spec, Mapping) or not isinstance(spec.get("members"), Mapping) or not spec["members"]:
            raise GroupError(f"{where}: members: give each host its rank, e.g. members: {{gpu1: 0, gpu2: 1}}")
        unknown = sorted(set(spec) - {"kind", "members", "dist_port", "dist_init_addr", "may_differ"})
        if unknown:
            raise GroupError(f"{where}.{unknown[0]}: unknown key; known: kind, members, dist_port, dist_init_addr")
        kind = spec.get("kind", "tp")
        if kind not in ("tp", "pd"):
            raise GroupError(f"{where}.kind: {kind!r}: tp (one engine over several hosts) or pd (prefill/decode)")
        port = spec.get("dist_port", DEFAULT_DIST_PORT)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise GroupError(f"{where}.dist_port: {port!r}: a port number 1-65535")
        members: list[Member] = []
        for host, slot in spec["members"].items():
            host = str(host)
            if host not in addresses:
                raise GroupError(f"{where}.members.{host}: not a host of this inventory")
            if host in owner:
                raise GroupError(f"{host}: in two engine groups ({owner[host]}, {name}); a host runs one engine")
            owner[host] = str(name)
            members.append(_member(where, kind, host, slot, addresses[host]))
        members = _checked(where, kind, members)
        group = EngineGroup(str(name), kind, tuple(members), port, _may_differ(where, spec.get("may_differ")))
        explicit = spec.get("dist_init_addr")
        if explicit is not None and explicit not in {m.address for m in members}:
            raise GroupError(
                f"{where}.dist_init_addr: {explicit!r} is not the address of one of the group's hosts "
                f"({', '.join(m.address for m in members)}); leave it out and knobfleet uses rank 0's"
            )
        if explicit is not None and explicit != group.head.address:
            raise GroupError(
                f"{where}.dist_init_addr: {explicit} is {_owner_of(members, explicit)}'s, not rank 0's "
                f"({group.head.host}, {group.head.address}); the rendezvous runs on rank 0"
            )
        groups.append(group)
    return groups


def _owner_of(members: Sequence[Member], address: str) -> str:
    return next(m.host for m in members if m.address == address)


def _member(where: str, kind: str, host: str, slot: Any, address: str) -> Member:
    if kind == "tp":
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise GroupError(f"{where}.members.{host}: {slot!r}: a rank 0, 1, 2 …")
        return Member(host, address, slot)
    if slot not in ROLES:
        raise GroupError(f"{where}.members.{host}: {slot!r}: prefill or decode")
    return Member(host, address, -1, str(slot))


def _checked(where: str, kind: str, members: list[Member]) -> list[Member]:
    if kind == "pd":
        out = []
        for role in ROLES:
            same = [m for m in members if m.role == role]
            if not same:
                raise GroupError(f"{where}: no {role} host; a prefill/decode group needs both")
            out += [Member(m.host, m.address, i, role) for i, m in enumerate(same)]
        return out
    by_rank: dict[int, str] = {}
    for m in members:
        if m.rank in by_rank:
            raise GroupError(f"{where}: {by_rank[m.rank]} and {m.host} both claim rank {m.rank}")
        by_rank[m.rank] = m.host
    missing = sorted(set(range(len(members))) - set(by_rank))
    if missing:
        raise GroupError(
            f"{where}: rank {missing[0]} is missing (ranks {', '.join(map(str, sorted(by_rank)))} declared); "
            f"a {len(members)}-host group has ranks 0..{len(members) - 1}"
        )
    return sorted(members, key=lambda m: m.rank)


def _may_differ(where: str, extra: Any) -> tuple[str, ...]:
    if extra is None:
        return MAY_DIFFER_ENV
    if not isinstance(extra, Sequence) or isinstance(extra, str) or not all(isinstance(x, str) for x in extra):
        raise GroupError(f"{where}.may_differ: a list of env var names")
    return tuple(dict.fromkeys((*MAY_DIFFER_ENV, *extra)))


RankSpec = tuple[Mapping[str, "str | bool"], Mapping[str, "str | bool"]]


def rank_flags(group: EngineGroup, host: str, spec: RankSpec) -> dict[str, str | bool]:
    """The launch flags knobfleet renders for ``host``'s rank (empty for prefill/decode groups: their servers
    are independent engines that a router pairs), from the engine's ``spec`` (catalog ``serve.ranks``: every rank's
    flags, then followers' own), templates filled in: {nnodes}, {rank}, {head}, {port}."""
    if group.kind != "tp":
        return {}
    m = group.member(host)
    fill = {"{nnodes}": str(len(group.members)), "{rank}": str(m.rank), "{head}": group.head.address,
            "{port}": str(group.dist_port)}  # fmt: skip
    every, followers = spec
    out: dict[str, str | bool] = {}
    for flag, value in [*every.items(), *(followers.items() if m.rank > 0 else ())]:
        if isinstance(value, str):
            for key, filled in fill.items():
                value = value.replace(key, filled)
        out[flag] = value
    return out


@dataclass(frozen=True)
class Plan:
    """What ``--serial`` counts: units that restart together (a group, or a host alone)."""

    units: tuple[tuple[str, ...], ...]
    names: tuple[str, ...] = field(default=())


def units(hosts: Sequence[str], groups: Sequence[EngineGroup]) -> Plan:
    """Hosts in restart units, in inventory order: a group's hosts form one unit (at its first host's place)."""
    of = {h: g for g in groups for h in g.hosts}
    seen: set[str] = set()
    out: list[tuple[str, ...]] = []
    names: list[str] = []
    for h in hosts:
        g = of.get(h)
        if g is None:
            out.append((h,))
            names.append(h)
        elif g.name not in seen:
            seen.add(g.name)
            missing = [x for x in g.hosts if x not in hosts]
            if missing:
                raise GroupError(
                    f"group {g.name}: --limit leaves out {', '.join(missing)}; a group restarts as a unit: limit to "
                    f"all of {', '.join(g.hosts)} or none"
                )
            out.append(tuple(g.hosts))
            names.append(g.name)
    return Plan(tuple(out), tuple(names))
