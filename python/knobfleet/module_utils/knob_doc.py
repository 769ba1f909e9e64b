"""The probe document's shape (schema_version 1), declared once: what ``knob_observe.observe`` returns on a host and
what the live-state rule (``knob_live``), the controller's verdicts and reports, history, and the shipped testinfra
checks read. Typing only: nothing here runs on a host, and nothing imports it at run time there.

``tests/unit/module_utils/test_knob_doc.py`` holds every recorded probe and a fresh one to these declarations, so
a field added to the probe without its declaration (or declared and never sent) fails there.
"""

from __future__ import annotations

from typing import Any, TypedDict


class _FileRequired(TypedDict):
    path: str
    exists: bool


class FileInfo(_FileRequired, total=False):
    """A file as the probe read it (``knob_observe.file_info``): absent, unreadable (``error``), or its metadata
    and, when small enough, its content (secret values already hashed)."""

    error: str
    sha256: str | None
    mode: str  # "0755"
    owner: str
    group: str
    uid: int  # compared with the generation's recorded owner (file_access_changed)
    gid: int
    mtime: float
    size: int
    truncated: bool
    content: str
    content_omitted: bool


class _ProcessRequired(TypedDict):
    """One process of the unit's cgroup, from /proc (``knob_observe.process``); ``env`` secret values hashed."""

    pid: int
    ppid: int
    comm: str
    env: dict[str, str]
    cmdline: list[str]
    start_ticks: int
    start_epoch: float


class Process(_ProcessRequired, total=False):
    state: str  # /proc/PID/stat's state (R, S, T stopped, Z zombie, ...); older probes lack it


class _GenerationRequired(TypedDict):
    generation: int
    files: list[str]


class GenerationEntry(_GenerationRequired, total=False):
    meta: dict[str, Any]  # the generation's meta.json (profile, version, hash, engine, status, run, who, files)


# Functional form: a field named ``list`` would shadow the builtin in a class body.
class _GenerationsRequired(TypedDict):
    exists: bool
    current: int | None
    list: list[GenerationEntry]
    errors: list[str]
    lock: dict[str, Any] | None


class Generations(_GenerationsRequired, total=False):
    """The state dir: the current generation, every generation, the ledger's tail, the lock's holder."""

    current_files: dict[str, FileInfo]
    ledger: list[dict[str, Any]]
    current_error: str  # ``current`` is there but names no generation (a hand edit): never "never applied"


class ProbeFiles(TypedDict):
    script: FileInfo
    unit: FileInfo


class Liveness(TypedDict):
    """The one-token completion ``verify`` sends where the health check does not generate."""

    url: str
    status: int | None
    timeout_s: float
    seconds: float


class _ProbeDocRequired(TypedDict):
    """One host's probe document."""

    schema_version: int
    service: str
    unit: str
    time: float
    files: ProbeFiles
    dropins: list[FileInfo]
    unit_props: dict[str, str]
    processes: list[Process]
    generations: Generations
    health: int | None
    health_url: str
    server_info: Any  # the engine's own info document (secret values hashed), or None
    probe_s: float


class RuntimeView(TypedDict, total=False):
    """A container host's engine as its runtime names it (knob_runtime.container_view): the runtime, the container's
    name and host PID (0: not running), its image ID and name, its restart policy, when it started, the unit's
    main process (the client), and ``error`` when the runtime could not be asked."""

    kind: str
    name: str
    client_pid: int
    found: bool
    pid: int
    running: bool
    image_id: str
    image: str
    restart: str | None
    started: str
    error: str


class ProbeDoc(_ProbeDocRequired, total=False):
    """One host's probe document (``liveness``: verify only; ``engine_package``: the engine package's version from
    its launcher's environment, knob_pkgmeta.engine_package: package, version, path, launcher, from, or error;
    ``runtime``: a container host's engine, knob_runtime.container_view; ``package_unit``: the unit a package ships
    under the serve unit's name, which apply refuses to take the place of, knob_pkgmeta.shadowed_unit)."""

    liveness: Liveness
    engine_package: dict[str, Any]
    runtime: RuntimeView
    package_unit: str
