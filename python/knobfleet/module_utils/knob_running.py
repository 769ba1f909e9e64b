"""The live-state rule's checks of the running engine: the unit's state and health, each process's state, a
process started before its files changed, every process's environ against the profile, and the engine's own report
of the env and arguments it runs with. Pure and standard library only; ``knob_live.evaluate`` calls them in order.
Split out of knob_live; callers import these names from here: the controller as
``knobfleet.module_utils.knob_running``, the roles' modules as ``ansible.module_utils.knob_running``.
"""

from __future__ import annotations

from typing import Any

from .knob_argv import read as read_argv
from .knob_redact import is_marker
from .knob_rules import STOPPED_STATES, Kind, finding

STALE_TOLERANCE_S = 1.0


def main_pid(doc: dict[str, Any]) -> int:
    """The engine's main process: the unit's MainPID, or under a container runtime the container's process as the
    runtime names it (the unit's main process is then the ``docker``/``podman`` client)."""
    runtime = doc.get("runtime")
    if isinstance(runtime, dict) and runtime.get("kind") not in (None, "systemd"):
        pid = runtime.get("pid")
        return pid if isinstance(pid, int) and pid > 0 else 0
    try:
        return int((doc.get("unit_props") or {}).get("MainPID") or 0)
    except ValueError:
        return 0


def check_service(doc: dict[str, Any], out: list[dict[str, Any]]) -> None:
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


def check_stale(doc: dict[str, Any], main: dict[str, Any], out: list[dict[str, Any]]) -> None:
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


def check_env(
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


def check_engine_env(
    doc: dict[str, Any], main: dict[str, Any], engine: dict[str, Any], out: list[dict[str, Any]]
) -> None:
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


def check_engine_args(
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


def same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a process's command line is the exec line ``argv``. A launcher that is a script (vLLM's
    ``…/bin/vllm``) runs through its ``#!`` interpreter, which the kernel puts in front: ``python3 …/bin/vllm
    serve …`` is the exec line ``…/bin/vllm serve …`` (at most two interpreter words)."""
    if cmdline == argv:
        return True
    return any(len(cmdline) == len(argv) + k and cmdline[k:] == argv for k in (1, 2))


def check_container(doc: dict[str, Any], expected: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """Pure: the container the generation's run line names against the runtime's view of it (``doc["runtime"]``):
    its image, whether it runs under the unit, and a ``--restart`` policy that would fight systemd's."""
    run = expected.get("container")
    seen = doc.get("runtime")
    if not isinstance(run, dict):
        return
    if run.get("restart") not in (None, "no"):
        out.append(
            finding(
                Kind.RESTART_POLICY,
                "the run line has --restart=%s: the container runtime and systemd would both restart the engine"
                % run["restart"],
                name="--restart",
                expected="no",
                actual=run["restart"],
            )
        )
    if not isinstance(seen, dict) or not seen.get("found"):
        return
    props = doc.get("unit_props") or {}
    if seen.get("running") and props.get("ActiveState") != "active":
        out.append(
            finding(
                Kind.CONTAINER_OUTSIDE_UNIT,
                "container %s runs (pid %s) while %s is %s: it was started outside the unit"
                % (seen.get("name"), seen.get("pid"), doc.get("unit"), props.get("ActiveState")),
                pid=seen.get("pid"),
                name=seen.get("name"),
            )
        )
    want = str(run.get("image") or "")
    have = str(seen.get("image_id") or "")
    if seen.get("running") and want.startswith("sha256:") and have and have != want:
        out.append(
            finding(
                Kind.IMAGE_MISMATCH,
                "container %s runs image %s (%s), the generation's run line names %s"
                % (seen.get("name"), have[:19], seen.get("image") or "?", want[:19]),
                name="image",
                expected=want,
                actual=have,
                pid=seen.get("pid"),
            )
        )
