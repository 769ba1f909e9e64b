"""``lab up``'s options, checked before anything changes: how many hosts, their groups, which run real engines."""

from __future__ import annotations

from knobfleet.errors import LabError
from knobfleet.lab.hostfiles import LabHost

MAX_HOSTS = 64


def hosts_to_boot(
    count: int, vllm: tuple[str, ...], router: bool | str, group_size: int, sglang: tuple[str, ...], slot: int = 0
) -> list[LabHost]:
    """lab1..labN, once ``up``'s options are checked: 1..MAX_HOSTS hosts, groups that divide them (and no real
    engine or router with groups), ``--vllm`` and ``--sglang`` naming hosts among them, never the same one."""
    if not 1 <= count <= MAX_HOSTS:
        raise LabError(f"lab up: -n {count}: choose 1..{MAX_HOSTS} hosts")
    if group_size and (group_size < 2 or count % group_size):
        raise LabError(f"lab up: --groups {group_size}: a group size of 2 or more that divides -n {count}")
    if group_size and (vllm or router or sglang):
        raise LabError(
            "lab up: --groups runs the stand-in as multi-node engines; it does not combine with --vllm, "
            "--sglang or --router"
        )
    hosts = [LabHost(i, slot) for i in range(1, count + 1)]
    for opt, names in (("--vllm", vllm), ("--sglang", sglang)):
        unknown = sorted(set(names) - {h.name for h in hosts})
        if unknown:
            raise LabError(f"lab up: {opt} {','.join(unknown)}: not among lab1..lab{count}")
    both = sorted(set(vllm) & set(sglang))
    if both:
        raise LabError(f"lab up: {','.join(both)} named by both --vllm and --sglang; a host runs one engine")
    return hosts
