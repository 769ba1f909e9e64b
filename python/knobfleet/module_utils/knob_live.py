"""The one live-state rule: (expected state, probe document) -> findings, each with a severity and the action
that repairs it; and (findings, policy) -> the actions an apply takes.

``plan``, ``apply`` (its pre-check on the controller, its decision on the host and its post-check), the
verify after a restore, ``drift``, ``verify`` and the shipped testinfra checks all call ``evaluate``.
Pure and standard library only: the controller imports this file as ``knobfleet.module_utils.knob_live``,
the roles' modules as ``ansible.module_utils.knob_live``. The one reader of serve scripts (a small shell lexer)
and the secret rules live in knob_redact (the probe loads that file alone) and are re-exported here.

Expected state (``expected``): ``{"generation", "profile": {name, version, hash}, "files": {"script"|"unit":
{path, sha256, content}}, "env", "argv"}`` — built from a host's current generation (drift) or from what
the controller rendered (plan/apply). Engine rules (``engine``), from the engine's catalog:
``{"env_prefixes": [...], "ignore_env": [...], "info_env": [key, index, ...] | None}``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

if __name__.startswith("knobfleet."):  # on the controller (whose read path never imports ansible)
    from knobfleet.module_utils.knob_argv import read as read_argv
    from knobfleet.module_utils.knob_redact import (  # the lexer and the secrets: one file the probe can load alone
        MARKER_PREFIX,
        SECRET_PARTS,
        SECRET_WORDS,
        UNIT_VALUE_KEYS,
        is_marker,
        is_secret,
        is_secret_flag,
        redact_argv,
        redact_env,
        redact_script,
        redact_text,
        redact_tree,
        redact_unit,
        redact_value,
        script_env_argv,
        secret_name,
        secret_values,
        shell_spans,
        shell_statements,
        shown_digest,
    )
else:  # on a host: shipped next to this file by Ansible (or the SSH fast path)
    from ansible.module_utils.knob_argv import read as read_argv  # type: ignore[no-redef]
    from ansible.module_utils.knob_redact import (  # type: ignore[no-redef]
        MARKER_PREFIX,
        SECRET_PARTS,
        SECRET_WORDS,
        UNIT_VALUE_KEYS,
        is_marker,
        is_secret,
        is_secret_flag,
        redact_argv,
        redact_env,
        redact_script,
        redact_text,
        redact_tree,
        redact_unit,
        redact_value,
        script_env_argv,
        secret_name,
        secret_values,
        shell_spans,
        shell_statements,
        shown_digest,
    )

STALE_TOLERANCE_S = 1.0


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
}
# /proc/PID/stat field 3 of a process that serves nothing: stopped (SIGSTOP), stopped by a tracer, a zombie
STOPPED_STATES = {"T": "stopped", "t": "stopped by a tracer", "Z": "a zombie"}
DROPIN_POLICIES = ("fail", "remove")


# --- expected state ----------------------------------------------------------------------------------------


def expected_from_generation(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """What the host's current generation says should be live: (expected, None); (None, None) when knobfleet
    never applied anything here; (None, why) when the generation cannot be read."""
    gens = doc.get("generations") or {}
    current = gens.get("current")
    if current is None:
        broken = gens.get("current_error")
        if broken:  # knobfleet did apply here: its state was edited by hand, which is not "never applied"
            return None, "%s (edited by hand?); `knobfleet rollback --to N` points it at a generation again" % broken
        return None, None
    entries = {e.get("generation"): e for e in gens.get("list") or [] if isinstance(e, dict)}
    meta = (entries.get(current) or {}).get("meta")
    if not isinstance(meta, dict):
        why = "; ".join(gens.get("errors") or ["not found"])
        return None, "generation %04d: meta.json missing or unreadable (%s)" % (current, why)
    stored = gens.get("current_files") or {}
    files: dict[str, Any] = {}
    for key in ("script", "unit"):
        want = (meta.get("files") or {}).get(key)
        if isinstance(want, dict) and want.get("path"):
            copy = stored.get(want.get("name", "")) or {}
            files[key] = {"path": want["path"], "sha256": want.get("sha256"), "content": copy.get("content")}
            if all(isinstance(want.get(k), int) for k in ("mode", "uid", "gid")):  # recorded since 0.x: compared
                files[key]["access"] = [want["mode"], want["uid"], want["gid"]]
    script = (files.get("script") or {}).get("content") or ""
    env, argv = script_env_argv(script) if script else ({}, [])
    profile = {k: meta.get(k) for k in ("profile", "version", "hash")}
    return {
        "generation": current,
        "profile": {"name": profile["profile"], "version": profile["version"], "hash": profile["hash"]},
        "files": files,
        "env": env,
        "argv": argv,
        "script_known": bool(script),
    }, None


def expected_from_files(
    script_path: str, script: str, unit_path: str, unit: str, sha: Any, secret: Any = (), key: str = ""
) -> dict[str, Any]:
    """What should be live once ``script`` and ``unit`` are installed (``sha``: a sha256 function). Secret
    values are compared by their markers (keyed with ``key``), as the host reports them."""
    shown, unit_shown = redact_script(script, secret, key), redact_unit(unit, secret, key)
    env, argv = script_env_argv(shown)
    script_sha = shown_digest(sha(script.encode("utf-8")), shown != script, key)
    unit_sha = shown_digest(sha(unit.encode("utf-8")), unit_shown != unit, key)
    return {
        "generation": None,
        "profile": None,
        "files": {
            "script": {"path": script_path, "sha256": script_sha, "content": shown},
            "unit": {"path": unit_path, "sha256": unit_sha, "content": unit_shown},
        },
        "env": env,
        "argv": argv,
        "script_known": True,
    }


# --- the rule ----------------------------------------------------------------------------------------------


def finding(kind: Kind, message: str, **fields: Any) -> dict[str, Any]:
    rule = RULES[kind]
    out: dict[str, Any] = {"kind": kind.value, "severity": rule.severity, "action": rule.action.value}
    out["message"] = message
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def _diff(expected: str, actual: str, path: str) -> str:
    import difflib  # here, not at the top: the probe's hot path never diffs

    return "".join(
        difflib.unified_diff(
            expected.splitlines(True), actual.splitlines(True), "%s (expected)" % path, "%s (on host)" % path
        )
    )


def main_pid(doc: dict[str, Any]) -> int:
    try:
        return int((doc.get("unit_props") or {}).get("MainPID") or 0)
    except ValueError:
        return 0


def _service(doc: dict[str, Any], out: list[dict[str, Any]]) -> None:
    props = doc.get("unit_props") or {}
    active = props.get("ActiveState")
    if active != "active":
        out.append(
            finding(
                Kind.SERVICE_INACTIVE,
                "%s is %s/%s" % (doc.get("unit"), active, props.get("SubState")),
                expected="active",
                actual=active,
            )
        )
    elif doc.get("health") != 200:
        out.append(
            finding(
                Kind.NOT_READY,
                "%s answered %s" % (doc.get("health_url"), doc.get("health") or "nothing"),
                expected=200,
                actual=doc.get("health"),
            )
        )
    live = doc.get("liveness")
    if active == "active" and doc.get("health") == 200 and isinstance(live, dict) and live.get("status") != 200:
        out.append(
            finding(
                Kind.NOT_READY,
                "%s answers its health check, but a one-token completion at %s %s"
                % (
                    doc.get("unit"),
                    live.get("url"),
                    "answered %s" % live["status"]
                    if live.get("status")
                    else "did not finish within %s s" % live.get("timeout_s"),
                ),
                expected=200,
                actual=live.get("status"),
                source="liveness",
            )
        )
    for proc in doc.get("processes") or []:
        state = proc.get("state")
        if state in STOPPED_STATES:
            out.append(
                finding(
                    Kind.PROCESS_STOPPED,
                    "pid %s (%s) is %s (state %s): the engine hangs until it is restarted"
                    % (proc.get("pid"), proc.get("comm", ""), STOPPED_STATES[state], state),
                    pid=proc.get("pid"),
                    name=proc.get("comm"),
                    expected="running",
                    actual=state,
                )
            )
    if props.get("NeedDaemonReload") == "yes":
        out.append(
            finding(
                Kind.DAEMON_RELOAD_NEEDED,
                "unit file changed on disk but systemd was not reloaded",
                path=props.get("FragmentPath"),
            )
        )
    loaded = (props.get("DropInPaths") or "").split()
    for path in loaded:
        out.append(finding(Kind.DROPIN_PRESENT, "drop-in %s changes the unit" % path, path=path))
    for d in doc.get("dropins") or []:  # on disk, not yet loaded: the next daemon-reload or restart loads it
        if d.get("exists") and d.get("path") not in loaded:
            out.append(
                finding(Kind.DROPIN_PRESENT, "drop-in %s changes the unit once loaded" % d["path"], path=d["path"])
            )


def _files(doc: dict[str, Any], expected: dict[str, Any], out: list[dict[str, Any]]) -> None:
    files = doc.get("files") or {}
    where = "generation %04d" % expected["generation"] if expected.get("generation") is not None else "the profile"
    for key in ("script", "unit"):
        want = (expected.get("files") or {}).get(key)
        have = files.get(key) or {}
        if not want:
            continue
        if not have.get("exists"):
            out.append(finding(Kind.FILE_MISSING, "%s is missing" % want["path"], path=want["path"]))
        elif have.get("error") or have.get("sha256") != want.get("sha256"):
            out.append(
                finding(
                    Kind.FILE_CHANGED,
                    "%s differs from %s%s"
                    % (want["path"], where, " (%s)" % have["error"] if have.get("error") else ""),
                    path=want["path"],
                    expected=want.get("sha256"),
                    actual=have.get("sha256"),
                    diff=_diff(want.get("content") or "", have.get("content") or "", want["path"])
                    if want.get("content") is not None and have.get("content") is not None
                    else None,
                )
            )
        elif want.get("access") and _access(have) not in (None, tuple(want["access"])):
            mode, uid, gid = want["access"]
            got = _access(have)
            assert got is not None
            out.append(
                finding(
                    Kind.FILE_ACCESS_CHANGED,
                    "%s is mode %04o owner %d:%d; %s installed it mode %04o owner %d:%d (a chmod or chown by hand?)"
                    % (want["path"], got[0], got[1], got[2], where, mode, uid, gid),
                    path=want["path"],
                    expected="%04o %d:%d" % (mode, uid, gid),
                    actual="%04o %d:%d" % got,
                )
            )


def _access(have: dict[str, Any]) -> tuple[int, int, int] | None:
    """(mode, uid, gid) of a probed file, None when the probe did not report them (an older probe)."""
    try:
        return int(str(have["mode"]), 8), int(have["uid"]), int(have["gid"])
    except (KeyError, TypeError, ValueError):
        return None


def _stale(doc: dict[str, Any], main: dict[str, Any], out: list[dict[str, Any]]) -> None:
    files = doc.get("files") or {}
    for key in ("script", "unit"):
        have = files.get(key) or {}
        if have.get("exists") and have.get("mtime", 0) > main["start_epoch"] + STALE_TOLERANCE_S:
            out.append(
                finding(
                    Kind.STALE_PROCESS,
                    "pid %d started before %s was last changed; it runs the old contents until restarted"
                    % (main["pid"], have["path"]),
                    path=have["path"],
                    pid=main["pid"],
                )
            )


def _renamed(proc: dict[str, Any], main: int, expected: dict[str, str]) -> bool:
    """A worker that renamed itself (setproctitle overwrites environ and argv on Linux): its environ shows
    none of the profile's variables and its cmdline is one title word. Checked through the main process."""
    if proc["pid"] == main or not expected:
        return False
    env = proc.get("env") or {}
    cmd = [c for c in proc.get("cmdline") or [] if c]  # a title written over argv leaves empty strings behind
    return not any(name in env for name in expected) and len(cmd) <= 1


def _env(
    procs: list[dict[str, Any]], main: int, expected: dict[str, str], engine: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    prefixes = tuple(engine.get("env_prefixes") or ())
    ignore = set(engine.get("ignore_env") or ())
    known = set(engine.get("known_env") or ())
    for proc in procs:
        if _renamed(proc, main, expected):
            continue
        env = proc.get("env") or {}
        pid, comm = proc["pid"], proc.get("comm", "")
        for name, value in sorted(expected.items()):
            if name not in env:
                out.append(
                    finding(
                        Kind.ENV_MISSING,
                        "pid %d (%s): %s is not set" % (pid, comm, name),
                        pid=pid,
                        name=name,
                        expected=value,
                    )
                )
            elif env[name] != value:
                out.append(
                    finding(
                        Kind.ENV_MISMATCH,
                        "pid %d (%s): %s=%s, expected %s" % (pid, comm, name, env[name], value),
                        pid=pid,
                        name=name,
                        expected=value,
                        actual=env[name],
                        source="proc",
                    )
                )
        for name in sorted(env):
            if prefixes and name.startswith(prefixes) and name not in expected and name not in ignore:
                if name in known:
                    hint = "; a known knob the profile does not set"
                else:
                    import difflib

                    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
                    hint = "; did you mean %s?" % close[0] if close else "; not a knob the engine's catalog knows"
                out.append(
                    finding(
                        Kind.ENV_UNEXPECTED,
                        "pid %d (%s): %s=%s is set but not in the profile%s" % (pid, comm, name, env[name], hint),
                        pid=pid,
                        name=name,
                        actual=env[name],
                    )
                )


def _engine_env(doc: dict[str, Any], main: dict[str, Any], engine: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """The engine's own report of its env (where its info endpoint has one) against /proc of its main process."""
    path = engine.get("info_env")
    reported: Any = doc.get("server_info")
    if not path or not isinstance(reported, dict):
        return
    for step in path:
        if isinstance(step, int) and isinstance(reported, list) and -len(reported) <= step < len(reported):
            reported = reported[step]
        elif isinstance(step, str) and isinstance(reported, dict):
            reported = reported.get(step)
        else:
            return
    if not isinstance(reported, dict):
        return
    live = main.get("env") or {}
    for name, value in sorted(reported.items()):
        if live.get(name) != value:
            out.append(
                finding(
                    Kind.ENV_MISMATCH,
                    "engine reports %s=%s but /proc/%d/environ has %r" % (name, value, main["pid"], live.get(name)),
                    pid=main["pid"],
                    name=name,
                    expected=live.get(name),
                    actual=value,
                    source="engine",
                )
            )


def _find_key(tree: Any, key: str) -> tuple[bool, Any]:
    """The value under ``key`` at the shallowest depth of a nested JSON report (breadth first)."""
    level = [tree]
    for _ in range(6):
        nxt: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                if key in node:
                    return True, node[key]
                nxt.extend(v for v in node.values() if isinstance(v, dict | list))
            elif isinstance(node, list):
                nxt.extend(v for v in node if isinstance(v, dict | list))
        level = nxt
    return False, None


def _same(expected: str, actual: Any) -> bool:
    if isinstance(actual, bool):
        return expected.lower() in (("true", "1") if actual else ("false", "0"))
    if isinstance(actual, int | float):
        try:
            return float(expected) == float(actual)
        except ValueError:
            return False
    return expected == str(actual)


def flags_of(argv: list[str], spec: dict[str, Any] | None = None) -> dict[str, str]:
    """The flags of an exec argv by canonical name, read with the engine's arity, aliases and abbreviations
    (``spec``: the engine rule's ``argv``); the one reader is module_utils/knob_argv.py."""
    flags: dict[str, str] = read_argv(argv, spec).flags
    return flags


def _engine_args(
    doc: dict[str, Any], main: dict[str, Any], argv: list[str], engine: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    """The engine's own report of the arguments it resolved (SGLang's server info, vLLM's /server_info) against
    the profile's flags: a flag the engine reports with another value did not take effect."""
    if not engine.get("info_args") or not isinstance(doc.get("server_info"), dict):
        return
    skip = set(engine.get("info_args_ignore") or ())
    read = read_argv(argv, engine.get("argv"))
    for name, value in sorted(read.flags.items()):
        if name in skip:
            continue
        if is_marker(value):  # a secret: compared on the command line (engines mask or hash it in their report)
            continue
        found, actual = _find_key(doc["server_info"], name.replace("-", "_"))
        if found and not isinstance(actual, dict | list) and actual is not None and not _same(value, actual):
            spelled = read.spelled.get(name, "--" + name)
            given = value if spelled.startswith("(") else spelled if value == "true" else "%s %s" % (spelled, value)
            out.append(
                finding(
                    Kind.ARGV_MISMATCH,
                    "engine reports %s=%s but pid %d was started with %s"
                    % (name.replace("-", "_"), actual, main["pid"], given),
                    pid=main["pid"],
                    name=name,
                    expected=value,
                    actual=actual,
                    source="engine",
                )
            )


def _interrupted(doc: dict[str, Any], run_id: str | None, out: list[dict[str, Any]]) -> None:
    gens = doc.get("generations") or {}
    lock = gens.get("lock")
    # an unreadable lock is nobody's own, also for a reader without a run (drift, verify, plan)
    if lock is not None and (not isinstance(lock, dict) or lock.get("corrupt") or lock.get("run_id") != run_id):
        holder = lock if isinstance(lock, dict) else {}
        if holder.get("corrupt"):
            text = "the host lock is unreadable (%s)" % holder["corrupt"]
        else:
            text = "lock held by %s (run %s) since %s from %s" % (
                holder.get("operator"),
                holder.get("run_id"),
                holder.get("since"),
                holder.get("controller"),
            )
        out.append(
            finding(
                Kind.INTERRUPTED_APPLY,
                "%s: an apply is running, or was killed; if it is gone, re-run apply with --break-lock" % text,
                name="lock",
                actual=holder.get("run_id") or holder.get("corrupt"),
            )
        )
    for entry in gens.get("list") or []:
        meta = entry.get("meta") if isinstance(entry, dict) else None
        current = isinstance(meta, dict) and entry.get("generation") == gens.get("current")
        if current and meta.get("status") == "failed" and meta.get("run_id") != run_id:  # type: ignore[union-attr]
            out.append(
                finding(
                    Kind.FAILED_GENERATION,
                    "generation %04d, the current one, is marked failed: its apply failed and the restore never ran "
                    "(the controller was stopped first); `knobfleet rollback` puts the previous good generation back"
                    % entry["generation"],
                    name="generation",
                    actual=entry["generation"],
                )
            )
        if isinstance(meta, dict) and meta.get("status") == "installing" and meta.get("run_id") != run_id:
            out.append(
                finding(
                    Kind.INTERRUPTED_APPLY,
                    "generation %04d was left 'installing' by run %s; the next apply with --break-lock marks it "
                    "interrupted" % (entry["generation"], meta.get("run_id")),
                    name="generation",
                    actual=entry["generation"],
                )
            )


def same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a process's command line is the exec line ``argv``. A launcher that is a script (vLLM's
    ``…/bin/vllm``) runs through its ``#!`` interpreter, which the kernel puts in front: ``python3 …/bin/vllm
    serve …`` is the exec line ``…/bin/vllm serve …`` (at most two interpreter words)."""
    if cmdline == argv:
        return True
    return any(len(cmdline) == len(argv) + k and cmdline[k:] == argv for k in (1, 2))


def evaluate(
    doc: dict[str, Any],
    expected: dict[str, Any] | None,
    engine: dict[str, Any] | None = None,
    declared: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> list[dict[str, Any]]:
    """Every difference between ``expected`` and what ``doc`` observed, in a stable order. ``expected`` None:
    the host has no knobfleet generation (one ``unmanaged`` finding). ``declared``: the profile the inventory
    says the host runs. ``run_id``: the applier's own run (its lock and its 'installing' generation are not
    findings while it works)."""
    engine = engine or {}
    out: list[dict[str, Any]] = []
    _service(doc, out)
    if expected is None or not expected.get("managed", True):
        present = [f["path"] for f in (doc.get("files") or {}).values() if f.get("exists")]
        out.append(
            finding(
                Kind.UNMANAGED,
                "files present but never applied by knobfleet: " + ", ".join(present)
                if present
                else "no knobfleet generation and no serve files on this host",
                path=present[0] if present else None,
            )
        )
        if expected is None:
            _interrupted(doc, run_id, out)
            return out
    _files(doc, expected, out)
    procs: list[dict[str, Any]] = doc.get("processes") or []
    pid = main_pid(doc)
    main = next((p for p in procs if p.get("pid") == pid), None)
    if main is not None:
        _stale(doc, main, out)
    if expected.get("script_known") and procs:
        _env(procs, pid, expected.get("env") or {}, engine, out)
        argv = expected.get("argv") or []
        if main is not None and argv and not same_command(main.get("cmdline") or [], argv):
            where = "generation %04d" % expected["generation"] if expected.get("generation") is not None else "profile"
            out.append(
                finding(
                    Kind.ARGV_MISMATCH,
                    "pid %d: command line differs from the %s's exec line" % (pid, where),
                    pid=pid,
                    expected=argv,
                    actual=main.get("cmdline"),
                )
            )
        if main is not None:
            _engine_env(doc, main, engine, out)
            if same_command(main.get("cmdline") or [], argv):  # started right: did the engine take it?
                _engine_args(doc, main, argv, engine, out)
    have = expected.get("profile") or {}
    if (
        declared is not None
        and have
        and (have.get("name"), have.get("version"), have.get("hash"))
        != (
            declared.get("name"),
            declared.get("version"),
            declared.get("hash"),
        )
    ):
        out.append(
            finding(
                Kind.PROFILE_MISMATCH,
                "runs %s@%s, inventory declares %s@%s"
                % (have.get("name"), have.get("version"), declared.get("name"), declared.get("version")),
                name="knob_profile",
                expected="%s@%s %s" % (declared.get("name"), declared.get("version"), declared.get("hash")),
                actual="%s@%s %s" % (have.get("name"), have.get("version"), have.get("hash")),
            )
        )
    _interrupted(doc, run_id, out)
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
