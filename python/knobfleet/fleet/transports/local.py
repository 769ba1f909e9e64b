"""Transport ``local``: the machine knobfleet runs on, with no ssh (one box: knobfleet on the GPU server itself).

A module function runs as it does over ssh (``base.BOOT``: the module and its module_utils piped to an
isolated ``python3 -I``), only started here instead of through ssh. A playbook run through it (apply, restore,
rollback) gets ``ansible_connection: local`` as an extra var, so Ansible itself never opens a connection either.

Only hosts that are this machine are eligible: ``ansible_connection: local``, or an ``ansible_host`` (else the
inventory name) of ``localhost``, ``127.0.0.1`` or ``::1`` with no port (another 127.x address may be a
container). ``become`` is refused as on the fast path (the module runs as the user knobfleet runs as: root to
apply).
"""

from __future__ import annotations

import subprocess
from typing import Any, ClassVar

from knobfleet.fleet.transports.base import (
    BOOT,
    Capabilities,
    HostFailure,
    Job,
    NoWarmUp,
    Outcome,
    Reach,
    Target,
    bundle,
    host_view,
    interpret,
    keys,
)

# Only these name this machine for sure: another 127.x address may be a container (the lab's hosts are).
LOCAL_NAMES = ("localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost")


def is_local_address(address: str) -> bool:
    return address in LOCAL_NAMES


def python_of(hv: Target) -> str:
    return host_view(LocalVars, hv).python


def argv(hv: Target, module_name: str, func: str, args: dict[str, Any]) -> list[str]:
    """Pure: the command line that runs ``func(args)`` of the module read on stdin, here."""
    import json

    return [python_of(hv), "-I", "-c", BOOT.format(name=module_name, func=func, args=json.dumps(args, sort_keys=True))]


class LocalVars(Reach):
    """The host keys the local transport reads: how Ansible would reach the host (to tell that it is this
    machine) and which python runs the module; nothing more."""


class LocalTransport(NoWarmUp):
    name: ClassVar[str] = "local"
    reads: ClassVar[frozenset[str]] = keys(LocalVars)
    caps: ClassVar[Capabilities] = Capabilities(quick=True, play_vars={"ansible_connection": "local"})

    def ineligible(self, hv: Target) -> str | None:
        v = host_view(LocalVars, hv)
        conn = v.ansible_connection
        if conn and conn not in ("local", "ansible.builtin.local", "ssh", "smart", "ansible.builtin.ssh"):
            return f"{hv.host}: ansible_connection={conn}"
        if v.becomes:
            return f"{hv.host}: ansible_become"
        if conn in ("local", "ansible.builtin.local"):
            return None
        where = v.address(hv)
        if not is_local_address(where):
            return f"{hv.host}: not this machine ({where})"
        if v.port:  # a forwarded port may lead anywhere
            return f"{hv.host}: ansible_port (set ansible_connection: local for this machine)"
        return None

    def run(self, job: Job) -> dict[str, Outcome]:
        from knobfleet import paths

        call = job.call
        payload = bundle(call.source(), paths.module_utils_dir(), call.private)
        out: dict[str, Outcome] = {}
        for hv in job.hosts:  # one machine: its hosts (services) one after the other, each bounded
            cmd = argv(hv, call.module, call.function, call.args[hv.host])
            try:
                proc = subprocess.run(cmd, input=payload, capture_output=True, timeout=call.timeout_s, check=False)
            except subprocess.TimeoutExpired:
                out[hv.host] = Outcome(hv.host, error=HostFailure("error", f"no answer within {call.timeout_s:g} s"))
                continue
            except OSError as exc:
                out[hv.host] = Outcome(hv.host, error=HostFailure("error", f"cannot run {cmd[0]}: {exc.strerror}"))
                continue
            o = interpret(hv.host, proc.returncode, proc.stdout, proc.stderr, cmd[0])
            out[hv.host] = Outcome(o.host, o.doc, o.error)  # no fallback retry: a missing python is the answer
        return out
