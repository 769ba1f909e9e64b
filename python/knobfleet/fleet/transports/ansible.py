"""Transport ``ansible``: the module runs as a task of its playbook through ansible-runner (runner.py), with
each host's arguments passed as unsafe extra vars ``<module>_args: {host: args}``. Reaches every host Ansible
reaches (any connection plugin, passwords, become, bastions), at the cost of starting ``ansible-playbook``."""

from __future__ import annotations

from typing import ClassVar

from knobfleet.fleet.transports.base import Capabilities, HostFailure, Job, NoWarmUp, Outcome


class AnsibleTransport(NoWarmUp):
    name: ClassVar[str] = "ansible"
    reads: ClassVar[frozenset[str]] = frozenset()  # none itself: Ansible reads every connection variable
    caps: ClassVar[Capabilities] = Capabilities(auto=True, fallback=True)

    def run(self, job: Job) -> dict[str, Outcome]:
        from knobfleet.fleet.runner import RunRequest, run_playbook

        hosts, call = job.hosts, job.call
        result = run_playbook(
            RunRequest(
                playbook=call.playbook,
                inventory=job.inventory,
                hosts=tuple(hv.host for hv in hosts),
                unsafe_vars={f"{call.module}_args": {hv.host: call.args[hv.host] for hv in hosts}},
                forks=min(max(len(hosts), 1), job.limit()),
                on_event=job.on_event,
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
