"""The probe: one call of the knob_probe module per host (roles/knob_probe), through any transport. Its
options come from the host's vars and engine, the same for every transport."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from knobfleet.fleet import transports
from knobfleet.fleet.transports.base import Job, ModuleCall, Outcome, Target

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars


class ProbeTarget(Target, Protocol):
    """A host whose probe options are already computed (``fleet.readhost.ReadHost`` is one)."""

    @property
    def probe(self) -> dict[str, Any]: ...


PROBE_TIMEOUT_S = 60.0  # the same bound as the role's task
HTTP_TIMEOUT_S = 2.0
LIVENESS_TIMEOUT_S = 10.0  # verify's one-token completion (fleet/probe.py; module_utils/knob_observe.liveness)


def probe_args(hv: HostVars) -> dict[str, Any]:
    """The knob_probe module's options for ``hv``."""
    engine = hv.adapter()
    return {
        "service": hv.service,
        "script_path": hv.script_path,
        "unit_path": hv.unit_path,
        "state_dir": hv.service_state_dir,
        "health_url": hv.health_url,
        "info_url": hv.base_url + engine.info_path if engine.info_path else "",
        "http_timeout_s": HTTP_TIMEOUT_S,
        "secret": hv.secrets(),
        # verify only (ops/drift.stream blanks it for drift): where /health does not generate
        "liveness_url": hv.base_url + engine.liveness_path if engine.liveness_path else "",
        "liveness_timeout_s": LIVENESS_TIMEOUT_S,
        **({"version_file": hv.version_file} if hv.version_file else {}),
        # the engine package's version from its launcher's environment (knob_pkgmeta.engine_package): this host's
        # launcher, for a host whose engine is not running and has no serve script, and the catalog's names
        "launcher": list(hv.launcher or engine.launcher),
        "packages": list(engine.packages),
    }


def call(
    hosts: Sequence[HostVars] = (), args: Mapping[str, dict[str, Any]] | None = None, persist: bool = False
) -> ModuleCall:
    from knobfleet.fleet.fleetkey import fleet_key

    return ModuleCall(
        role="knob_probe",
        module="knob_probe",
        function="probe",
        playbook="probe.yml",
        result_key="probe",
        args=args if args is not None else {hv.host: probe_args(hv) for hv in hosts},
        timeout_s=PROBE_TIMEOUT_S,
        private={"secret_key": fleet_key()},  # the hosts make the controller's markers (fleet/fleetkey.py)
        persist=persist,
    )


def warm_up(inventory: Path, limit: str | None, via: str, forks: int | None = None) -> None:
    """Start the probes of the last run over the same inventory (ssh transport; cheap, read-only)."""
    from knobfleet.fleet.inventory import fingerprint

    if inventory.exists():
        transports.warm_up(call(), lambda: fingerprint(inventory, limit), via, forks)


def stream(
    hosts: Sequence[ProbeTarget],
    inventory: Path,
    via: str = "auto",
    on_event: Callable[[dict[str, Any]], None] | None = None,
    forks: int | None = None,
    persist: bool = False,
) -> Iterator[Outcome]:
    """Each host's probe outcome as it arrives, at most ``forks`` hosts at once (the read path's view of the
    hosts: their probe options are already computed). ``persist``: each host's interpreter is kept for the next
    probe (``drift --watch``)."""
    if not hosts:
        return iter(())
    probe_call = call(args={h.host: h.probe for h in hosts}, persist=persist)
    return transports.stream(Job(hosts, probe_call, inventory, on_event, forks), via)


def probe(
    hosts: Sequence[HostVars],
    inventory: Path,
    via: str = "auto",
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Outcome]:
    """Each host's probe document (``Outcome.doc``) or why there is none (``Outcome.error``)."""
    if not hosts:
        return {}
    return transports.run(Job(hosts, call(hosts), inventory, on_event), via)
