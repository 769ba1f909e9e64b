"""Transport ``ansible``: the module runs as a task of its playbook through ansible-runner (runner.py), with
each host's arguments passed as unsafe extra vars ``<module>_args: {host: args}``. Reaches every host Ansible
reaches (any connection plugin, passwords, become, bastions), at the cost of starting ``ansible-playbook``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from knobfleet.fleet.transports.base import (
    Capabilities,
    HostFailure,
    ModuleCall,
    NoWarmUp,
    Outcome,
    Target,
    default_forks,
)


class AnsibleTransport(NoWarmUp):
    name: ClassVar[str] = "ansible"
    reads: ClassVar[frozenset[str]] = frozenset()  # none itself: Ansible reads every connection variable
    caps: ClassVar[Capabilities] = Capabilities(auto=True, fallback=True)

    def run(
        self,
        hosts: Sequence[Target],
        call: ModuleCall,
        inventory: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        forks: int | None = None,
    ) -> dict[str, Outcome]:
        from knobfleet.fleet.runner import RunRequest, run_playbook

        result = run_playbook(
            RunRequest(
                playbook=call.playbook,
                inventory=inventory,
                limit=",".join(hv.host for hv in hosts),
                unsafe_vars={f"{call.module}_args": {hv.host: call.args[hv.host] for hv in hosts}},
                forks=min(max(len(hosts), 1), forks if forks is not None else default_forks()),
                on_event=on_event,
            )
        )
        out: dict[str, Outcome] = {}
        for hv in hosts:
            hr = result.host(hv.host)
            doc = hr.results.get(call.function, {}).get(call.result_key)
            if hr.unreachable:
                out[hv.host] = Outcome(hv.host, error=HostFailure("unreachable", hr.first_failure(with_task=False)))
            elif not hr.success or not isinstance(doc, dict):
                out[hv.host] = Outcome(hv.host, error=HostFailure("error", hr.first_failure()))
            else:
                out[hv.host] = Outcome(hv.host, doc=doc)
        return out
