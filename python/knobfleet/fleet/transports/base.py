"""What every transport shares, and nothing else (standard library only: the CLI imports it before the slow
imports to start probes early).

A transport runs one of the roles' own module functions on many hosts and hands back one ``Outcome`` per host.
It declares what it is, never by its name:

* ``reads``: the connection variables (``ansible_*``) it reads from a host's vars, the field names of its typed
  record of them (``keys``; ``host_view`` reads a host's into it, defaults included); the host view
  (``fleet.hostvars``) keeps the union of every transport's; a host that sets one it cannot honour is
  ``ineligible`` for it;
* ``caps``: its ``Capabilities`` (does it answer without starting ansible-playbook, does it stream, can
  ``--via auto`` choose it, is it the fallback that reaches every host Ansible reaches, and the extra vars a
  playbook run through it needs).

Signature of a transport (``Transport`` below), the one way it appears in the code and docs::

    ineligible(hv: Target) -> str | None
    warm_up(key: str, source: bytes, forks: int | None = None) -> None;  stop_warm() -> None
    run(job: Job) -> {host: Outcome}
    stream(job: Job) -> Iterator[Outcome]      (when caps.streams)

The registry holds one instance of each transport for the process; what a transport keeps between calls (the
ssh transport's processes started ahead) is that instance's state.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, TypeVar

K = TypeVar("K", bound="HostKeys")
DEFAULT_FORKS = 32  # hosts at once when neither --forks, KNOBFLEET_FORKS nor ansible.cfg's forks says


class Target(Protocol):
    """What a transport needs to reach a host: ``fleet.hostvars.HostVars`` and ``fleet.readhost.ReadHost`` both
    are one."""

    @property
    def host(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def connection(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class ModuleCall:
    """One module function to run on every host: ``role/library/module.py``'s ``function(args[host])``; the
    playbook that runs the same module through Ansible, and the key of the module's result there."""

    role: str
    module: str
    function: str
    playbook: str
    result_key: str
    args: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    timeout_s: float = 60.0
    # Options of every host's call kept out of any argv and cached file (the fleet's secret-marker key): the ssh
    # and local transports send them on stdin; through Ansible the task reads them from the run's 0600 vars file.
    private: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # Keep one interpreter per host across calls of this module (``drift --watch``): transports that can, do
    # (ssh, on hosts whose probe cache holds the entry); the others run each call as usual.
    persist: bool = False

    def source(self) -> bytes:
        from knobfleet import paths

        return paths.module_source(self.role, self.module).read_bytes()


class Job(NamedTuple):
    """One module call on some hosts, as a transport takes it: ``call`` on every one of ``hosts`` of
    ``inventory``, at most ``forks`` at once (None: ``default_forks()``); ``on_event``: the Ansible run's events,
    for a transport that runs one. A NamedTuple (``_replace``): it loads with every one-shot read."""

    hosts: Sequence[Target]
    call: ModuleCall
    inventory: Path
    on_event: Callable[[dict[str, Any]], None] | None = None
    forks: int | None = None

    def limit(self) -> int:
        """How many hosts at once."""
        return self.forks if self.forks is not None else default_forks()


@dataclass(frozen=True)
class HostFailure:
    """Why a host gave no document: it could not be reached, or the module failed there."""

    kind: Literal["unreachable", "error"]
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class Outcome:
    """One host's answer: ``doc`` when the function ran, else ``error``."""

    host: str
    doc: Any = None
    error: HostFailure | None = None
    missing_python: bool = False
    cache: str = ""  # what the host's probe cache did (ssh fast path): hit, stored, replaced <why>, nocache <why>


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do, declared (the registry and the use cases decide on these, never on a name)."""

    quick: bool = False  # answers a module call without starting ansible-playbook: apply's pre-check uses it
    streams: bool = False  # hands each host's outcome over as it arrives (has ``stream``)
    warms_up: bool = False  # can start the calls an earlier run saved, before the slow imports
    auto: bool = False  # ``--via auto`` may choose it (tried in registry order) when it reaches every host
    fallback: bool = False  # reaches every host Ansible reaches: auto's last resort, and the retry of a host
    #                         whose python the quick transport did not find
    play_vars: Mapping[str, Any] = field(default_factory=dict)  # extra vars of a playbook run through it


class Transport(Protocol):
    name: ClassVar[str]  # what --via calls it, for people; code decides on ``caps``
    reads: ClassVar[frozenset[str]]  # the connection variables it reads from a host's vars
    caps: ClassVar[Capabilities]

    def ineligible(self, hv: Target) -> str | None:
        """Why this transport cannot reach ``hv`` exactly as Ansible would (None: it can)."""

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        """Start work saved for ``key`` by an earlier run, before the slow imports (may do nothing)."""

    def stop_warm(self) -> None:
        """Stop what ``warm_up`` started and nobody collected (may do nothing)."""

    def run(self, job: Job) -> dict[str, Outcome]:
        """``job.call`` on every host, at most ``job.limit()`` at once, each bounded by ``call.timeout_s``; an
        outcome per host, never an exception for one host's failure."""


class NoWarmUp:
    """What a transport without warm-up work inherits (pytest-testinfra's base-backend habit): the no-op
    ``warm_up``/``stop_warm`` and an ``ineligible`` that refuses no host. It declares its ``name``, ``reads``,
    ``caps`` and ``run``."""

    def ineligible(self, hv: Target) -> str | None:
        return None

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        return None

    def stop_warm(self) -> None:
        return None


class Streaming(Transport, Protocol):
    def stream(self, job: Job) -> Iterator[Outcome]: ...


def collected(outcomes: Iterable[Outcome], hosts: Sequence[Target]) -> dict[str, Outcome]:
    """Every host's outcome of ``outcomes`` (as they arrived), in the order of ``hosts``."""
    got = {o.host: o for o in outcomes}
    return {hv.host: got[hv.host] for hv in hosts}


class RunsItsStream:
    """What a streaming transport inherits: its ``run`` is its ``stream``, collected in the order of ``hosts``."""

    def run(self: Streaming, job: Job) -> dict[str, Outcome]:
        return collected(self.stream(job), job.hosts)


def default_forks() -> int:
    """How many hosts a transport works on at once: ``KNOBFLEET_FORKS``, else ansible.cfg's (or ANSIBLE_FORKS')
    ``forks`` as Ansible reads it, else 32."""
    from knobfleet.errors import UsageError

    env = os.environ.get("KNOBFLEET_FORKS", "").strip()
    if env:
        return check_forks(env, "KNOBFLEET_FORKS")
    from knobfleet import paths
    from knobfleet.fleet import ansible_cfg

    value = ansible_cfg.user_settings(paths.project_root()).get("forks", "").strip()
    if not value:
        return DEFAULT_FORKS
    try:
        return check_forks(value, "forks")
    except UsageError as exc:
        raise UsageError(f"{exc} (set in {ansible_cfg.config_file(paths.project_root()) or 'ANSIBLE_FORKS'})") from None


def check_forks(value: str | int, where: str = "--forks") -> int:
    from knobfleet.errors import UsageError

    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{where}={value}: expected a whole number of hosts at once, 1 or more")
    return n


def merged(hv: Target, defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """A host's connection vars over ansible.cfg's defaults (host vars win)."""
    return {**(defaults or {}), **hv.connection}


DEFAULT_PYTHON = "/usr/bin/python3"


class HostKeys:
    """A typed record of the host keys a transport reads: each annotated class attribute is one ``ansible_*`` key,
    its value the default the transport takes when the host leaves it unset (a subclass adds keys). ``keys`` lists
    them, ``host_view`` fills one from a host's vars. Read-only. A plain class, not a dataclass: the records load
    with every one-shot read, and a dataclass costs ~0.5 ms to create there (docs/PERFORMANCE.md)."""

    def __init__(self, **found: str | None) -> None:
        unknown = sorted(set(found) - keys(type(self)))
        if unknown:
            raise TypeError(f"{type(self).__name__} reads no {', '.join(unknown)}")
        self.__dict__.update(found)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in sorted(vars(self).items()))})"


class Reach(HostKeys):
    """The host keys a transport that starts the module itself reads (local, ssh: each record extends this one),
    with Ansible's defaults: how the host is reached, and which python runs the module there."""

    ansible_connection: str = "ssh"
    ansible_become: str = ""
    ansible_host: str = ""
    ansible_ssh_host: str = ""
    ansible_port: str = ""
    ansible_ssh_port: str = ""
    ansible_python_interpreter: str = ""

    @property
    def python(self) -> str:
        interp = self.ansible_python_interpreter
        return DEFAULT_PYTHON if not interp or interp.startswith("auto") else interp

    @property
    def port(self) -> str:
        return self.ansible_port or self.ansible_ssh_port

    @property
    def becomes(self) -> bool:
        return self.ansible_become.lower() in ("true", "yes", "1")

    def address(self, hv: Target) -> str:
        return self.ansible_host or self.ansible_ssh_host or hv.address or hv.host


def keys(record: type) -> frozenset[str]:
    """The host keys a record of what a transport reads declares (the transport's ``reads``): its annotated class
    attributes, its bases' included. Worked out once per record."""
    found = _KEYS.get(record)
    if found is None:
        found = _KEYS[record] = frozenset(
            k for c in record.__mro__ if c is not HostKeys for k in vars(c).get("__annotations__", {})
        )
    return found


_KEYS: dict[type, frozenset[str]] = {}


def host_view(record: type[K], hv: Target, defaults: Mapping[str, str] | None = None) -> K:
    """``record`` read from ``hv``'s connection vars over ``defaults`` (ansible.cfg's): each key it declares that
    is set, the record's default for the others."""
    c = merged(hv, defaults)
    return record(**{k: c[k] for k in keys(record) if k in c})


# --- running a module function under the host's python3 -I, whatever carries the bytes there -------------

BOOT = (
    "import json,sys,types\n"
    "b=json.loads(sys.stdin.buffer.read())\n"
    "for n,s in b['utils']:\n"
    " u=types.ModuleType('ansible.module_utils.'+n);u.__package__='ansible.module_utils';sys.modules[u.__name__]=u\n"
    " exec(compile(s,n,'exec'),u.__dict__)\n"
    "m=types.ModuleType({name!r})\n"
    "exec(compile(b['module'],{name!r},'exec'),m.__dict__)\n"
    "a=json.loads({args!r});a.update(b.get('args') or {{}})\n"
    "sys.stdout.write(json.dumps(m.{func}(a)))\n"
)
# a module imports its utils by name (``ansible.module_utils.knob_x``), the utils each other relatively (``.knob_x``)
UTIL_IMPORT = re.compile(rb"(?:ansible\.module_utils\.|from \.)(knob_[a-z_]+)")
# The collection's copies import their utils by FQCN; BOOT registers them under ansible.module_utils.
COLLECTION_UTILS = b"ansible_collections.knobfleet.serving.plugins.module_utils."


def _plain_imports(source: bytes) -> bytes:
    return source.replace(COLLECTION_UTILS, b"ansible.module_utils.")


def bundle(source: bytes, utils_dir: Path, private: Mapping[str, Any] | None = None) -> bytes:
    """What BOOT reads on stdin: the module's source and the knobfleet module_utils it imports, directly or
    through each other, each after the ones it imports. Works with either copy: the repository's
    (``ansible.module_utils.knob_*``) or the collection's (imports by FQCN, rewritten back here). ``private``:
    options of every host's call that must never be in an argv, which ``ps`` shows to every user of both
    machines (the fleet's secret-marker key); BOOT adds them to each host's options."""
    order: list[str] = []
    texts: dict[str, str] = {}
    source = _plain_imports(source)

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in texts or name in seen:
            return
        text = _plain_imports((utils_dir / f"{name}.py").read_bytes()).decode("utf-8")
        for dep in sorted({m.decode() for m in UTIL_IMPORT.findall(text.encode())}):
            visit(dep, (*seen, name))
        texts[name] = text
        order.append(name)

    for name in sorted({m.decode() for m in UTIL_IMPORT.findall(source)}):
        visit(name, ())
    utils = [[n, texts[n]] for n in order]
    body: dict[str, Any] = {"utils": utils, "module": source.decode("utf-8")}
    if private:
        body["args"] = dict(private)
    return json.dumps(body).encode("utf-8")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def interpret(host: str, rc: int, stdout: bytes, stderr: bytes, python: str) -> Outcome:
    """Pure: what one ssh process's exit status and output mean."""
    err = _last_line(stderr.decode("utf-8", "replace"))
    if rc == 255:  # ssh's own status for a connection it could not make
        return Outcome(host, error=HostFailure("unreachable", err or "ssh exited 255"))
    if rc == 127:
        return Outcome(host, error=HostFailure("error", f"{python} not found on the host"), missing_python=True)
    if rc != 0:
        return Outcome(
            host, error=HostFailure("error", f"the module failed on the host (exit {rc}): {err or 'no message'}")
        )
    try:
        return Outcome(host, doc=json.loads(stdout))
    except ValueError:
        return Outcome(host, error=HostFailure("error", f"the module printed no JSON document: {stdout[:200]!r}"))
