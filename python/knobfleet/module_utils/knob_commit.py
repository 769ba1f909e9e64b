"""The host transaction's ``stage`` and ``commit``: the rendered serve script and unit staged and validated, then,
when they differ from what is installed, stored as a new generation and installed all or nothing (files, drop-ins
moved away, ``current``, the ledger); when only the running engine differs, the restart it needs. Part of the
host transaction (knob_txn); standard library only, imported by the roles' modules as
``ansible.module_utils.knob_commit``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

from .knob_fs import Install, UnsafePath, private_dir, read_stat, same_content
from .knob_guards import check_unit_name, foreign_dropins
from .knob_live import evaluate, expected_from_files
from .knob_observe import observe
from .knob_redact import redact_script, redact_unit, shown_digest
from .knob_rules import actions
from .knob_store import (
    SCRIPT_MODE,
    UNIT_MODE,
    live_name,
    now,
    read,
    remove_generation,
    store_generation,
    write_atomic,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Sequence
    from typing import Any

    from knobfleet.module_utils.knob_store import Module, Store


# --- stage ---------------------------------------------------------------------------------------------------


def validate_staged(module: Module, kind: str, path: str, script_path: str) -> None:
    """Fail the task when a freshly staged file does not validate; nothing is installed then."""
    argv = ["bash", "-n", path] if kind == "script" else ["systemd-analyze", "verify", "--man=no", path]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return
    # The serve script is installed after validation: "not executable" about that path alone is expected
    # when the script is missing on the host (it is about to be installed). Any other complaint fails.
    expected = "Command %s is not executable" % script_path
    lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    if kind == "script":
        module.fail_json(
            msg="bash -n rejected the staged script: %s" % (lines or ["exit %d" % proc.returncode])[0],
            rc=proc.returncode,
            stderr=proc.stderr,
        )
    problems = [ln for ln in lines if expected not in ln]
    if problems:
        module.fail_json(
            msg="systemd-analyze verify rejected the staged unit: %s" % problems[0],
            rc=proc.returncode,
            stderr=proc.stderr,
        )


def stage(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    unit_name = os.path.basename(p["unit_path"])
    items = (
        ("script", p["script_content"], os.path.join(store.staging, "serve.sh"), p["script_path"], SCRIPT_MODE),
        ("unit", p["unit_content"], os.path.join(store.staging, unit_name), p["unit_path"], UNIT_MODE),
    )
    result: dict[str, Any] = {"changed": False, "staged": []}
    diffs = []
    for kind, content, staged, installed, mode in items:
        data = content.encode("utf-8")
        against = installed if module.check_mode else staged
        hidden = None
        try:  # bounded, non-blocking, single-link regular files only: never ship another file's content
            old = read_stat(against, single_link=True)[0]
        except FileNotFoundError:
            old = None
        except UnsafePath as exc:
            old, hidden = None, "(%s: %s %s; not shown)\n" % (installed, exc.filename, exc.strerror)
        if old == data:
            continue  # staged files that did not change were validated when they were written
        result["changed"] = True
        result["staged"].append(kind)
        hide = redact_script if kind == "script" else redact_unit  # secret values leave the host only as markers
        key = p.get("secret_key", "")
        before = hidden or hide("" if old is None else old.decode("utf-8", "replace"), p["secret"], key)
        content = hide(content, p["secret"], key)
        diffs.append({"before_header": installed, "after_header": installed, "before": before, "after": content})
        if not module.check_mode:
            write_atomic(staged, data, mode)
            validate_staged(module, kind, staged, p["script_path"])
    if module._diff and diffs:
        result["diff"] = diffs
    return result


# --- commit --------------------------------------------------------------------------------------------------


def live_actions(p: dict[str, Any], script: bytes, unit: bytes) -> tuple[list[str], list[str]]:
    """What the live-state rule (module_utils knob_live) says the running engine needs when its files are
    already right: [] (nothing), or e.g. ["daemon-reload", "restart"], and the finding kinds behind it."""
    doc = observed(p)
    expected = expected_from_files(
        p["script_path"],
        script.decode("utf-8", "replace"),
        p["unit_path"],
        unit.decode("utf-8", "replace"),
        lambda b: hashlib.sha256(b).hexdigest(),
        p["secret"],
        p.get("secret_key", ""),
    )
    findings = evaluate(doc, expected, p["engine"] or {}, run_id=p["run_id"])
    # A stopped engine is started by the readiness step, and foreign drop-ins were settled by begin (refused)
    # or above (removed into a new generation): neither is a reason to restart here.
    findings = [f for f in findings if f["kind"] not in ("service_inactive", "dropin_present")]
    return actions(findings, p["foreign_dropins"], True), sorted({f["kind"] for f in findings})


def observed(p: dict[str, Any]) -> dict[str, Any]:
    """The probe document of this service now (knob_observe.observe), for the module's parameters ``p``: what
    ``commit`` (the live actions) and ``verify`` read of the running engine."""
    doc: dict[str, Any] = observe(
        {
            "service": os.path.basename(p["unit_path"]).rsplit(".service", 1)[0],
            "script_path": p["script_path"],
            "unit_path": p["unit_path"],
            "state_dir": p["state_dir"],
            "health_url": p["health_url"] or "",
            "info_url": p["info_url"] or "",
            "http_timeout_s": 2.0,
            "secret": p["secret"],
            "secret_key": p.get("secret_key", ""),
        }
    )
    return doc


def commit(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    if p["action"] == "commit":  # on its own; install checked it in begin, before anything changed
        check_unit_name(module, store, p)
    script_name = os.path.basename(p["script_path"])
    unit_name = os.path.basename(p["unit_path"])
    staged_script = os.path.join(store.staging, "serve.sh")
    staged_unit = os.path.join(store.staging, unit_name)
    try:
        script, unit = read(staged_script), read(staged_unit)
    except FileNotFoundError:
        module.fail_json(msg="staged files missing in %s; the stage action must run first" % store.staging)
    want = {"script": hashlib.sha256(script).hexdigest(), "unit": hashlib.sha256(unit).hexdigest()}
    # What is installed is compared, never read whole: an oversized file, a FIFO or a device there differs; so
    # does a right file with another mode or owner (a chmod by hand is drift, repaired by a new generation).
    mode, gid = script_access(module, p, script)
    files_differ = not (
        same_content(p["script_path"], script, (mode, 0, gid)) and same_content(p["unit_path"], unit, (UNIT_MODE, 0, 0))
    )
    current = store.current()
    profile = p["profile"] or {}
    current_hash = None
    if current is not None:
        try:
            current_hash = store.meta(current).get("hash")
        except (OSError, ValueError):
            current_hash = None
    remove = foreign_dropins(p) if p["foreign_dropins"] == "remove" else []
    result = {
        "changed": False,
        "previous": current,
        "generation": current,
        "files_changed": files_differ,
        "script_sha256": want["script"],
        "unit_sha256": want["unit"],
        "dropins_removed": remove,
    }
    staged_text = read(staged_script).decode("utf-8", "replace")  # the digest of a script holding a secret is keyed
    result["script_sha256"] = shown_digest(
        want["script"], redact_script(staged_text, p["secret"]) != staged_text, p.get("secret_key", "")
    )
    if not files_differ and current_hash == profile.get("hash") and not remove:
        return restart_only(module, store, p, result, script, unit)
    if module.check_mode:
        result["changed"] = True
        return result
    number = store.next_number()
    meta = new_meta(p, number, current, want, (mode, gid), remove)
    try:
        store_generation(store, number, [(script_name, script, SCRIPT_MODE), (unit_name, unit, UNIT_MODE)], meta)
    except OSError as exc:
        module.fail_json(
            msg="cannot store generation %04d in %s: %s; free space there (or raise its quota) and "
            "apply again; nothing was installed, generation %s is still live"
            % (number, store.gens, exc.strerror or exc, live_name(current)),
            errno=exc.errno,
        )

    def ledger() -> None:  # once the files are in and current is switched
        entry = {
            "time": now(),
            "event": "apply",
            "generation": number,
            "previous": current,
            "profile": profile.get("name"),
            "version": profile.get("version"),
            "hash": profile.get("hash"),
            "status": "installing",
            "run_id": p["run_id"],
            "operator": p["operator"],
        }
        store.append_ledger(entry)

    installs = [(p["script_path"], script, mode, gid), (p["unit_path"], unit, UNIT_MODE, 0)]
    install_all(module, store, number, current, installs, remove, [lambda: store.switch_current(number, True), ledger])
    result.update(changed=True, generation=number)
    return result


def restart_only(
    module: Module, store: Store, p: dict[str, Any], result: dict[str, Any], script: bytes, unit: bytes
) -> dict[str, Any]:
    """Files and profile already right: what the running engine needs (``live_actions``), no new generation."""
    acts, kinds = live_actions(p, script, unit)
    if acts:
        # Files are right but the running engine is not: restart it (no new generation).
        why = "live state differs from the installed files (%s)" % ", ".join(kinds)
        result.update(changed=True, restart_reason=why, actions=acts)
        if not module.check_mode:
            store.append_ledger(
                {
                    "time": now(),
                    "event": "restart",
                    "generation": result["generation"],
                    "reason": why,
                    "run_id": p["run_id"],
                    "operator": p["operator"],
                }
            )
    return result


def new_meta(
    p: dict[str, Any],
    number: int,
    current: int | None,
    want: dict[str, str],
    access: tuple[int, int],
    remove: list[str],
) -> dict[str, Any]:
    """meta.json of a generation ``commit`` stores: status installing, the profile, each file's path, digest,
    mode and owner, where it came from and what it moved away."""
    profile = p["profile"] or {}
    mode, gid = access

    def stored(path: str, digest: str, mode: int, gid: int) -> dict[str, Any]:
        return {"path": path, "sha256": digest, "name": os.path.basename(path), "mode": mode, "uid": 0, "gid": gid}

    script = stored(p["script_path"], want["script"], mode, gid)
    unit = stored(p["unit_path"], want["unit"], UNIT_MODE, 0)
    return {
        "generation": number,
        "status": "installing",
        "profile": profile.get("name"),
        "version": profile.get("version"),
        "hash": profile.get("hash"),
        "files": {"script": script, "unit": unit},
        "created": now(),
        "updated": now(),
        "operator": p["operator"],
        "run_id": p["run_id"],
        "previous": current,
        "reason": "",
        "engine": (p["engine"] or {}).get("name"),
        "ready_url": p["health_url"] or "",
        "dropins_removed": remove,
    }


def script_access(module: Module, p: dict[str, Any], script: bytes) -> tuple[int, int]:
    """Mode and group of the installed serve script: 0755 root:root, or — when it holds a secret — readable by
    root and the service user only (0750 root:<the user's group>, 0700 when the engine runs as root)."""
    text = script.decode("utf-8", "replace")
    if redact_script(text, p["secret"]) == text:
        return SCRIPT_MODE, 0
    user = p["service_user"] or "root"
    if user == "root":
        return 0o700, 0
    try:
        import pwd

        return 0o750, pwd.getpwnam(user).pw_gid
    except KeyError:
        module.fail_json(
            msg="the serve script holds a secret and must be readable by the service user %r, "
            "which does not exist on this host; create it or fix knob_serve_user" % user
        )


def install_all(
    module: Module,
    store: Store,
    number: int,
    current: int | None,
    files: list[tuple[str, bytes, int, int]],
    remove: list[str],
    then: Sequence[Callable[[], None]] = (),
) -> None:
    """Install every file of generation ``number`` (and run ``then``: switch current, write the ledger) or none:
    on any failure — an OSError at any step, a full disk at any byte — the files get their previous contents,
    modes and owners back (knob_fs hard links, no copy), removed drop-ins come back, ``current`` points where it
    did, the new generation is deleted, and the one-line error says so."""
    inst = Install()
    try:
        if remove:
            backup = os.path.join(store.gen_dir(number), "dropins")
            os.close(private_dir(backup))
            for path in remove:
                write_atomic(os.path.join(backup, os.path.basename(path)), read(path), 0o600)
                inst.remove(path)
        for dest, data, mode, gid in files:
            inst.put(dest, data, mode, 0, gid)
        for step in then:
            step()
    except BaseException as exc:
        back, stuck = inst.undo()
        undos: tuple[Callable[[], None], ...] = (
            lambda: store.unswitch(number, current),
            lambda: remove_generation(store, number),
        )
        for undo in undos:
            try:
                undo()
            except (OSError, ValueError):
                pass
        if not isinstance(exc, (OSError, ValueError)):
            raise
        what = getattr(exc, "filename", None) or "a file"
        put = (" %s put back as it was;" % ", ".join(back)) if back else ""
        lost = (
            " could not put back %s (restore generation %s by hand);" % (", ".join(stuck), live_name(current))
            if stuck
            else ""
        )
        module.fail_json(
            msg="cannot install generation %04d (%s: %s);%s%s generation %04d removed; generation %s "
            "is still live"
            % (number, what, getattr(exc, "strerror", None) or exc, put, lost, number, live_name(current)),
            errno=getattr(exc, "errno", None),
            rolled_back=True,
        )
    inst.done()
    try:
        store.drop_previous()
    except OSError:
        pass
