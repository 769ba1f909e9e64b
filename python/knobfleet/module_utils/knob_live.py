"""The one live-state rule: (expected state, probe document) -> findings, each with a severity and the action
that repairs it; and (findings, policy) -> the actions an apply takes.

``plan``, ``apply`` (its pre-check on the controller, its decision on the host and its post-check), the
verify after a restore, ``drift``, ``verify`` and the shipped testinfra checks all call ``evaluate``.
Pure and standard library only: the controller imports this file as ``knobfleet.module_utils.knob_live``,
the roles' modules as ``ansible.module_utils.knob_live``. Beside it: the one reader of serve scripts (a small
shell lexer, knob_shell), the secret rules (knob_redact: the probe loads those files alone), the rule's table and
apply's decisions (knob_rules: ``Kind``, ``RULES``, ``actions``, ``refusal``, ``restore_ok``) and the checks of
the running engine (knob_running); their callers import them from there. This file holds the expected state,
the checks of the files and the state dir, and ``evaluate``, which runs them all.

Expected state (``expected``): ``{"generation", "profile": {name, version, hash}, "files": {"script"|"unit":
{path, sha256, content}}, "env", "argv"}`` — built from a host's current generation (drift) or from what
the controller rendered (plan/apply). Engine rules (``engine``), from the engine's catalog:
``{"env_prefixes": [...], "ignore_env": [...], "info_env": [key, index, ...] | None}``.
"""

from __future__ import annotations

from typing import Any

from .knob_redact import redact_script, redact_unit, shown_digest  # the secrets: one file the probe can load alone
from .knob_rules import Kind, finding
from .knob_running import (
    check_container,
    check_engine_args,
    check_engine_env,
    check_env,
    check_service,
    check_stale,
    main_pid,
    same_command,
)
from .knob_runtime import split_run_line
from .knob_shell import script_env_argv

# --- expected state ----------------------------------------------------------------------------------------


def expected_from_generation(doc: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """What the host's current generation says should be live: (expected, None); (None, None) when knobfleet
    never applied anything here; (None, why) when the generation cannot be read."""
    gens = doc.get("generations") or {}
    current = gens.get("current")
    if current is None:
        broken = gens.get("current_error")
        if broken:  # knobfleet did apply here: its state was edited by hand, which is not "never applied"
            return None, (  # what rollback and apply accept: they refuse a `current` that is no such link
                "%s (edited by hand?); remove it on the host, then `knobfleet rollback --to N` or apply again" % broken
            )
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
        "script_known": bool(script),
        **engine_line(argv),
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
        "script_known": True,
        **engine_line(argv),
    }


def engine_line(argv: list[str]) -> dict[str, Any]:
    """The exec line's engine command (``argv``: what the engine's process must run), and under a container
    runtime the run line's parts (``container``: ``knob_runtime.split_run_line``): the engine is the container's
    command, not the ``docker``/``podman`` client the script execs."""
    run = split_run_line(argv)
    if run is None:
        return {"argv": argv}
    return {"argv": run["engine"], "container": run}


# --- the rule ---------------------------------------------------------------------------------------------


def _diff(expected: str, actual: str, path: str) -> str:
    import difflib  # here, not at the top: the probe's hot path never diffs

    return "".join(
        difflib.unified_diff(
            expected.splitlines(True), actual.splitlines(True), "%s (expected)" % path, "%s (on host)" % path
        )
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
    check_service(doc, out)
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
    check_container(doc, expected, out)
    procs: list[dict[str, Any]] = doc.get("processes") or []
    pid = main_pid(doc)
    main = next((p for p in procs if p.get("pid") == pid), None)
    if main is not None:
        check_stale(doc, main, out)
    if expected.get("script_known") and procs:
        check_env(procs, pid, expected.get("env") or {}, engine, out)
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
            check_engine_env(doc, main, engine, out)
            if same_command(main.get("cmdline") or [], argv):  # started right: did the engine take it?
                check_engine_args(doc, main, argv, engine, out)
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
