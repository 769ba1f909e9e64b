"""What the ssh transport (ssh.py) hands each host's call (sshcalls.py): ``FunctionRun``, one module function to
run over ssh on many hosts, and ``Started``, the head start's processes by host. Types only here, so that neither
of those files imports the other for them.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from knobfleet.fleet.transports import probecache
    from knobfleet.fleet.transports.sshsession import Sessions

Started = dict[str, tuple[list[str], "subprocess.Popen[bytes]"]]


@dataclasses.dataclass(frozen=True)
class FunctionRun:
    """One module function to run over ssh: ``func(args[host])`` of the module ``source`` (its bundle), through
    the control sockets in ``control_dir``, each host bounded by ``timeout_s`` from its own start, at most
    ``forks`` at once. ``plan_key``/``started``: the head start (processes an earlier run saved the argv of and
    ``warm_up`` started). ``defaults``: ansible.cfg's ssh settings. ``cache_roots``/``known``: each host's probe
    cache and what it is known to hold (probecache). ``sessions``: the pool that keeps one interpreter per host
    (``sshsession.Sessions``, the transport's; None: none kept)."""

    control_dir: Path
    source: bytes
    module_name: str
    func: str
    args: Mapping[str, dict[str, Any]]
    timeout_s: float = 60.0
    plan_key: str | None = None
    started: Started | None = None
    defaults: Mapping[str, str] | None = None
    forks: int | None = None
    cache_roots: Mapping[str, str] | None = None
    known: probecache.Known | None = None
    sessions: Sessions | None = None
