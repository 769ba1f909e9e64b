"""The live-state rule's table: every kind of finding with its severity, the action that repairs it and whether a
restored generation still verifies with it; one finding's shape (``finding``); and what apply does about a host's
findings under its policies (``actions``, ``refusal``, ``restore_ok``). Pure and standard library only. Split out of
knob_live; callers import these names from here: the controller as ``knobfleet.module_utils.knob_rules``, the roles'
modules as ``ansible.module_utils.knob_rules``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple


class Kind(str, Enum):
    FILE_CHANGED = "file_changed"
    FILE_MISSING = "file_missing"
    FILE_ACCESS_CHANGED = "file_access_changed"
    DROPIN_PRESENT = "dropin_present"
    DAEMON_RELOAD_NEEDED = "daemon_reload_needed"
    STALE_PROCESS = "stale_process"
    ENV_MISMATCH = "env_mismatch"
    ENV_MISSING = "env_missing"
    ENV_UNEXPECTED = "env_unexpected"
    ARGV_MISMATCH = "argv_mismatch"
    SERVICE_INACTIVE = "service_inactive"
    PROFILE_MISMATCH = "profile_mismatch"
    UNMANAGED = "unmanaged"
    NOT_READY = "not_ready"
    INTERRUPTED_APPLY = "interrupted_apply"
    # The current generation is marked failed: its apply failed and the restore never ran (the controller died).
    FAILED_GENERATION = "failed_generation"
    PROCESS_STOPPED = "process_stopped"
    # The ranks of one engine group (knob_engine_groups; live/groups.py): found across hosts, never on one alone.
    GROUP_MISMATCH = "group_mismatch"
    GROUP_RANK_DOWN = "group_rank_down"
    # Read from the host's router (knob_router_url), not from the host: drift and verify only.
    OUT_OF_ROUTER = "out_of_router"
    # The host's version file against the engine version its declared profile pins (profile engine_version).
    ENGINE_VERSION_MISMATCH = "engine_version_mismatch"
    # Container runtimes (knob_runtime): the running container against the generation's run line.
    IMAGE_MISMATCH = "image_mismatch"
    CONTAINER_OUTSIDE_UNIT = "container_outside_unit"
    RESTART_POLICY = "restart_policy"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Action(str, Enum):
    INSTALL = "install"  # store a new generation and install its files
    REMOVE_DROPIN = "remove-dropin"  # move a foreign drop-in into the new generation's backup
    DAEMON_RELOAD = "daemon-reload"
    RESTART = "restart"
    START = "start"
    BREAK_LOCK = "break-lock"  # clear a killed apply's lock (asked for with --break-lock), marking it interrupted
    REFUSE = "refuse"  # change nothing on this host and say why
    NONE = "none"  # reported; apply of the profile repairs nothing here

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Rule(NamedTuple):
    severity: str  # error | warning
    action: Action
    restore_ok: bool  # a restored generation still verifies with this finding (it predates the change)
    meaning: str


RULES: dict[Kind, Rule] = {
    Kind.FILE_CHANGED: Rule("error", Action.INSTALL, False, "a managed file differs from the generation"),
    Kind.FILE_MISSING: Rule("error", Action.INSTALL, False, "a managed file is gone"),
    Kind.FILE_ACCESS_CHANGED: Rule(
        "error", Action.INSTALL, False, "a managed file has the right content but another mode or owner"
    ),
    Kind.DROPIN_PRESENT: Rule("warning", Action.REFUSE, True, "a drop-in knobfleet did not write changes the unit"),
    Kind.DAEMON_RELOAD_NEEDED: Rule("warning", Action.DAEMON_RELOAD, False, "systemd runs an older unit file"),
    Kind.STALE_PROCESS: Rule("error", Action.RESTART, False, "the engine started before its files changed"),
    Kind.ENV_MISMATCH: Rule("error", Action.RESTART, False, "a live env var differs from the profile"),
    Kind.ENV_MISSING: Rule("error", Action.RESTART, False, "a profile env var is not live"),
    Kind.ENV_UNEXPECTED: Rule("warning", Action.RESTART, True, "an engine env var is live but not in the profile"),
    Kind.ARGV_MISMATCH: Rule("error", Action.RESTART, False, "the live command line differs from the profile"),
    Kind.SERVICE_INACTIVE: Rule("error", Action.START, False, "the engine is not running"),
    Kind.PROFILE_MISMATCH: Rule("warning", Action.INSTALL, True, "the host runs another profile than declared"),
    Kind.UNMANAGED: Rule("warning", Action.INSTALL, False, "knobfleet never applied a generation here"),
    Kind.NOT_READY: Rule("error", Action.RESTART, False, "the engine runs but does not answer its health check"),
    Kind.INTERRUPTED_APPLY: Rule("error", Action.REFUSE, False, "an apply was killed half-way (lock left held)"),
    Kind.FAILED_GENERATION: Rule(
        "error",
        Action.NONE,
        False,
        "the host runs a generation knobfleet marked failed: the restore after its failed apply never ran; "
        "`knobfleet rollback` puts the previous good one back",
    ),
    Kind.PROCESS_STOPPED: Rule(
        "error", Action.RESTART, False, "a process of the engine is stopped or a zombie: the engine hangs"
    ),
    Kind.GROUP_MISMATCH: Rule(
        "error",
        Action.NONE,
        False,
        "a knob, flag, model or engine version differs between the ranks of one engine group (a collective hangs or "
        "computes differently); the rank's own findings, or its host vars, say what to fix",
    ),
    Kind.GROUP_RANK_DOWN: Rule(
        "error",
        Action.RESTART,
        False,
        "a rank of an engine group is not running or not joined (its health proves nothing)",
    ),
    Kind.OUT_OF_ROUTER: Rule(
        "error",
        Action.NONE,
        False,
        "the host's router does not list its worker (a rollout took it out and did not put it back): it serves no "
        "traffic; `knobfleet router readd --limit HOST` puts it back",
    ),
    Kind.ENGINE_VERSION_MISMATCH: Rule(
        "error",
        Action.RESTART,
        False,
        "the engine version the host reports (knob_serve_version_file) is not the one its profile pins: the install "
        "behind the pinned launcher was changed, or the version file belongs to another install",
    ),
    Kind.IMAGE_MISMATCH: Rule(
        "error",
        Action.RESTART,
        False,
        "the running container's image is not the one its generation's run line names (a container run or "
        "restarted by hand from another image): a restart runs the generation's image again",
    ),
    Kind.CONTAINER_OUTSIDE_UNIT: Rule(
        "error",
        Action.RESTART,
        False,
        "a container with the unit's name runs, but not under the unit (started by hand): the unit's restart "
        "replaces it with the generation's",
    ),
    Kind.RESTART_POLICY: Rule(
        "warning",
        Action.INSTALL,
        True,
        "the run line asks the container runtime to restart the container (--restart), which fights systemd's own "
        "Restart=: apply writes a line without it",
    ),
}
# /proc/PID/stat field 3 of a process that serves nothing: stopped (SIGSTOP), stopped by a tracer, a zombie
STOPPED_STATES = {"T": "stopped", "t": "stopped by a tracer", "Z": "a zombie"}
DROPIN_POLICIES = ("fail", "remove")


def finding(kind: Kind, message: str, **fields: Any) -> dict[str, Any]:
    rule = RULES[kind]
    out: dict[str, Any] = {"kind": kind.value, "severity": rule.severity, "action": rule.action.value}
    out["message"] = message
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


# --- what apply does about them ----------------------------------------------------------------------------

ORDER = (Action.BREAK_LOCK, Action.INSTALL, Action.REMOVE_DROPIN, Action.DAEMON_RELOAD, Action.RESTART, Action.START)


def actions(findings: list[dict[str, Any]], dropin_policy: str = "fail", break_lock: bool = False) -> list[str]:
    """The actions that repair ``findings``, in the order apply performs them; ``["refuse"]`` when the host must
    be left alone (a foreign drop-in under policy ``fail``, an interrupted apply without ``break_lock``).
    Empty: the host is in sync and apply does nothing."""
    wanted: set[Action] = set()
    for f in findings:
        kind = Kind(f["kind"])
        act = RULES[kind].action
        if kind is Kind.DROPIN_PRESENT:
            act = Action.REMOVE_DROPIN if dropin_policy == "remove" else Action.REFUSE
        elif kind is Kind.INTERRUPTED_APPLY and break_lock:
            wanted.add(Action.BREAK_LOCK)
            continue
        if act is Action.REFUSE:
            return [Action.REFUSE.value]
        if act is not Action.NONE:
            wanted.add(act)
    if wanted & {Action.INSTALL, Action.REMOVE_DROPIN}:
        wanted |= {Action.DAEMON_RELOAD, Action.RESTART}
    if Action.DAEMON_RELOAD in wanted:
        wanted.add(Action.RESTART)
    running = not any(f["kind"] == Kind.SERVICE_INACTIVE.value for f in findings)
    if Action.RESTART in wanted and not running:
        wanted.discard(Action.RESTART)
        wanted.add(Action.START)
    if Action.START in wanted and Action.RESTART in wanted:
        wanted.discard(Action.START)
    return [a.value for a in ORDER if a in wanted]


def refusal(findings: list[dict[str, Any]], dropin_policy: str = "fail", break_lock: bool = False) -> str | None:
    """The one-line reason a host is refused (None when it is not)."""
    for f in findings:
        if f["kind"] == Kind.DROPIN_PRESENT.value and dropin_policy != "remove":
            return (
                "foreign drop-in %s changes the unit; remove it, or set knob_serve_foreign_dropins: remove "
                "(--foreign-dropins remove) to move it into the new generation's backup" % f.get("path")
            )
        if f["kind"] == Kind.INTERRUPTED_APPLY.value and not break_lock:
            return str(f["message"])
    return None


def restore_ok(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that make a restored generation fail its verification (the rest predate the change)."""
    return [f for f in findings if not RULES[Kind(f["kind"])].restore_ok]
