"""What the lab runs besides its hosts: SGLang's router in front of their engines (its kind, the workers it fronts,
starting it) and Prometheus, as ``lab status`` lists them (``Service``). ``nspawn.Lab.services``, ``router_kind``,
``worker_urls`` and ``start_router`` are these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from knobfleet.lab import hostfiles
from knobfleet.lab.hostfiles import LabHost

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView


@dataclass(frozen=True)
class Service:
    """A service the lab runs besides its hosts (the router, Prometheus), for ``lab status``."""

    name: str
    url: str
    state: str  # running | stopped
    pid: int | None = None
    detail: str = ""

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "url": self.url, "state": self.state, "pid": self.pid, "detail": self.detail}


def services(lab: LabView) -> list[Service]:
    """The router (with its metrics URL) and Prometheus, where this lab started them."""
    from knobfleet.lab import monitoring
    from knobfleet.lab.router_lab import LabRouter

    out = []
    router = LabRouter(lab.dir)
    if router.info_file.exists() or router.pid_file.exists():
        info = router.info()
        state = "running" if info.pid else "stopped"
        kind = lab.router_kind()
        out.append(Service(f"router ({kind})", info.url, state, info.pid, f"{len(info.workers)} worker(s)"))
        out.append(Service("router metrics", info.metrics_url, state, info.pid))
    if (monitoring.monitoring_dir(lab.dir) / "run").is_dir():
        up = monitoring.running(lab.dir)
        out.append(Service("prometheus", monitoring.prometheus_url(lab.dir), "running" if up else "stopped"))
    return out


def router_kind(lab: LabView) -> str:
    """The router `lab up --router` started: sglang-router (the default) or smg."""
    try:
        return (lab.dir / "router-kind").read_text().strip() or "sglang-router"
    except OSError:
        return "sglang-router"


def worker_urls(lab: LabView, hosts: list[LabHost]) -> list[str]:
    """The engine URL of each host, as the router fronts it."""
    vllm_hosts = lab.vllm_host_names()
    port = {True: hostfiles.VLLM_PORT, False: hostfiles.SGLANG_PORT}
    return [f"http://{h.address}:{port[h.name in vllm_hosts]}" for h in hosts]


def start_router(lab: LabView, hosts: list[LabHost]) -> None:
    """Start the lab's router in front of ``hosts``' engines."""
    from knobfleet.lab.router_lab import LabRouter

    # real SGLang workers are ready 40-100 s after their host boots (imports dominate on 2 loaded cores)
    slow = bool(lab.sglang_host_names() & {h.name for h in hosts})
    LabRouter(lab.dir).start(lab.worker_urls(hosts), lab.router_kind(), timeout_s=300.0 if slow else 60.0)
