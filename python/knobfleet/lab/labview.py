"""The lab as the modules carved out of ``nspawn.Lab`` see it (labroot, labruntime, labinventory, labservices,
labspeed, monitoring): ``LabView``, the part of ``Lab`` they use, and ``HostStatus``, one host's line of
``lab status``. Types only, so that none of them imports nspawn (not even for a type) while nspawn imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from knobfleet import labid
    from knobfleet.lab.hostfiles import LabHost


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    state: str  # running | stopped | broken
    pid: int | None


class LabView(Protocol):
    """What the carved-out modules use of a lab (``nspawn.Lab`` is the one): its folder, key and known hosts, the
    engines being installed while it boots, its hosts, and the names and vars its folder records."""

    dir: Path
    key: Path
    known_hosts: Path
    vllm: Any
    vllm_hosts: set[str]
    sglang: Any
    sglang_hosts: set[str]
    router_model: str | None

    @property
    def identity(self) -> labid.Identity: ...

    def named(self, name: str) -> LabHost: ...

    def host_dir(self, host: LabHost) -> Path: ...

    def pid_file(self, host: LabHost) -> Path: ...

    def pid(self, host: LabHost) -> int | None: ...

    def known(self) -> list[LabHost]: ...

    def status(self) -> list[HostStatus]: ...

    def ssh_argv(self, host: LabHost, command: list[str] | None = None) -> list[str]: ...

    def ssh_vars(self) -> str: ...

    def router_kind(self) -> str: ...

    def router_model_dir(self) -> str | None: ...

    def worker_urls(self, hosts: list[LabHost]) -> list[str]: ...

    def group_size(self) -> int: ...

    def groups_vars(self, count: int) -> str: ...

    def vllm_host_names(self) -> set[str]: ...

    def vllm_group_vars(self) -> str: ...

    def sglang_host_names(self) -> set[str]: ...

    def sglang_group_vars(self) -> str: ...
