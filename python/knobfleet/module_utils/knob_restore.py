"""The host transaction's way back: ``restore`` installs generation N (default the previous good one) again after
checking its stored files against meta.json, or, for a generation that held no files (a failed first apply),
``uninstall`` takes the engine's files away; drop-ins the generation left moved away come back. Changes nothing when
the target is unusable, and says why in one line. Part of the host transaction (knob_store, knob_txn); standard
library only, imported by the roles' modules as ``ansible.module_utils.knob_restore``.
"""

from __future__ import annotations

import hashlib
import os

from .knob_fs import Install
from .knob_fs import exists as fs_exists
from .knob_fs import unlink as fs_unlink
from .knob_guards import check_launcher
from .knob_store import (
    SCRIPT_MODE,
    UNIT_MODE,
    live_name,
    now,
    previous_good,
    read,
    write_atomic,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any

    from knobfleet.module_utils.knob_store import Module, Store

    Plan = list[tuple[str, bytes, int, int, int]]  # what a restore installs: (path, data, mode, uid, gid) of each file


def restore(module: Module, store: Store, p: dict[str, Any]) -> dict[str, Any]:
    """Install generation N (default: the previous good one) again: verify its stored files, install them
    atomically, switch current, record why. Changes nothing when the target is unusable."""
    current = store.current()
    target, meta = restore_target(module, store, p, current)
    files = meta.get("files") or {}
    if not files:
        if p["event"] != "restore":
            module.fail_json(
                msg="generation %04d holds no files (nothing was installed before knobfleet); nothing changed" % target
            )
        return uninstall(module, store, p, target, current)
    plan = restore_plan(module, store, target, files)
    script = next((data for path, data, *_ in plan if path == (files.get("script") or {}).get("path")), None)
    if script is not None and target != current:  # what it would execute, before anything stops
        check_launcher(module, p, script.decode("utf-8", "replace"), "generation %04d" % target)
    if module.check_mode:
        return {"changed": target != current, "generation": target, "previous": current}
    put_in_place(module, store, target, current, plan)
    put_back = after_restore(store, p, target, current)
    which = {k: meta.get(k) for k in ("profile", "version", "hash")}
    store.append_ledger(ledger_line(p, p["event"], target, current, **which))
    return {
        "changed": True,
        "generation": target,
        "previous": current,
        **which,
        "ready_url": meta.get("ready_url") or "",
        "dropins_restored": put_back,
    }


def ledger_line(p: dict[str, Any], event: str, target: int, current: int | None, **what: Any) -> dict[str, Any]:
    """The ledger's line for a restore or an uninstall: when, what, between which generations, and who asked why."""
    return {"time": now(), "event": event, "generation": target, "previous": current, **what,
            "reason": p["reason"], "run_id": p["run_id"], "operator": p["operator"]}  # fmt: skip


def restore_target(module: Module, store: Store, p: dict[str, Any], current: int | None) -> tuple[int, dict[str, Any]]:
    """The generation to go back to (``generation``, else the previous good one) and its meta.json; refused,
    changing nothing, when there is none or it cannot be read."""
    target = p["generation"]
    if target is None:
        target = previous_good(store, current if current is not None else 1 << 30)
        if target is None:
            module.fail_json(msg="no earlier good generation to go back to (current %s); nothing changed" % current)
    try:
        meta = store.meta(target)
    except FileNotFoundError:
        have = ", ".join("%04d" % n for n in store.numbers()) or "none"
        module.fail_json(msg="generation %04d does not exist on this host (have: %s); nothing changed" % (target, have))
    except (OSError, ValueError) as exc:
        module.fail_json(
            msg="%s/meta.json is unreadable (%s); fix or delete that generation, then pick another "
            "with --to N; nothing changed" % (store.gen_dir(target), exc)
        )
    return target, meta


def restore_plan(module: Module, store: Store, target: int, files: dict[str, Any]) -> Plan:
    """Each stored file of generation ``target`` with the mode, owner and group it had, after checking it against
    meta.json: refused, changing nothing, when one is gone, unreadable, altered or recorded with a bad mode."""
    gen_dir = store.gen_dir(target)
    plan = []
    for key, mode in (("script", SCRIPT_MODE), ("unit", UNIT_MODE)):
        f = files.get(key)
        if not isinstance(f, dict):
            continue
        src = os.path.join(gen_dir, os.path.basename(str(f.get("name"))))
        try:
            data = read(src)
        except FileNotFoundError:
            module.fail_json(
                msg="generation %04d: %s was deleted; refusing to roll back to it; nothing changed" % (target, src)
            )
        except OSError as exc:
            module.fail_json(
                msg="generation %04d: %s is unreadable (%s); refusing to roll back to it; nothing "
                "changed" % (target, src, exc.strerror or exc)
            )
        if hashlib.sha256(data).hexdigest() != f.get("sha256"):
            module.fail_json(
                msg="generation %04d: %s does not match its recorded sha256; refusing; nothing changed" % (target, src)
            )
        try:  # the mode, owner and group the file had (adopted files: what was found before knobfleet)
            access = [
                int(f["mode"]) if f.get("mode") is not None else mode,
                int(f.get("uid") or 0),
                int(f.get("gid") or 0),
            ]
        except (TypeError, ValueError):
            module.fail_json(
                msg="generation %04d: meta.json holds a bad mode/uid/gid for %s; nothing changed" % (target, key)
            )
        plan.append((f["path"], data, access[0] & 0o7777, access[1], access[2]))
    return plan


def put_in_place(module: Module, store: Store, target: int, current: int | None, plan: Plan) -> None:
    """Install the planned files and switch ``current`` to ``target``, all or nothing: on a failure the files get
    their previous contents back and ``current`` points where it did."""
    inst = Install()
    try:
        for dest, data, mode, uid, gid in plan:
            inst.put(dest, data, mode, uid, gid)
        store.switch_current(target, keep_previous=True)
    except BaseException as exc:
        _back, stuck = inst.undo()
        try:
            store.unswitch(target, current)
        except (OSError, ValueError):
            pass
        if not isinstance(exc, (OSError, ValueError)):
            raise
        module.fail_json(
            msg="cannot restore generation %04d (%s: %s); %s; generation %s is still live"
            % (
                target,
                getattr(exc, "filename", None) or "a file",
                getattr(exc, "strerror", None) or exc,
                ("could not put back %s" % ", ".join(stuck)) if stuck else "nothing changed",
                live_name(current),
            ),
            errno=getattr(exc, "errno", None),
        )
    inst.done()
    try:
        store.drop_previous()
    except OSError:
        pass


def after_restore(store: Store, p: dict[str, Any], target: int, current: int | None) -> list[str]:
    """Once ``target`` is live: the drop-ins the generation it leaves moved away come back (going back to an older
    one), and that generation gets ``leave_status`` (a failed one stays failed). Best effort: the restore stands.
    The drop-ins put back."""
    put_back = []
    if current is not None and target < current:
        try:
            put_back = restore_dropins(store, current)
        except OSError:
            put_back = []
    if current is not None and current != target and p["leave_status"]:
        try:
            left = store.meta(current)
            if left.get("status") not in ("failed",) or p["leave_status"] == "failed":
                left.update(status=p["leave_status"], updated=now())
                if p["reason"]:
                    left["reason"] = p["reason"]
                store.write_meta(current, left)
        except (OSError, ValueError):
            pass
    return put_back


def uninstall(module: Module, store: Store, p: dict[str, Any], target: int, current: int | None) -> dict[str, Any]:
    """Back to a host that had no engine files before knobfleet (a failed first apply): stop and disable the
    unit, remove the script and unit knobfleet installed, reload systemd."""
    try:
        left = store.meta(current) if current is not None else {}
    except (OSError, ValueError):
        left = {}
    installed = [f.get("path") for f in (left.get("files") or {}).values() if f.get("path")]
    if module.check_mode:
        return {"changed": bool(installed), "generation": target, "previous": current, "uninstalled": True}
    unit = os.path.basename(p["unit_path"] or "") if p["unit_path"] else None
    unit = unit or next((os.path.basename(x) for x in installed if x.endswith(".service")), None)
    if unit:
        module.run_command(["systemctl", "disable", "--now", unit])
    removed = [x for x in installed if fs_unlink(x)]
    module.run_command(["systemctl", "daemon-reload"])
    store.switch_current(target)
    if current is not None and current != target:
        try:
            meta = store.meta(current)
            meta.update(status=p["leave_status"] or meta.get("status"), updated=now(), reason=p["reason"])
            store.write_meta(current, meta)
        except (OSError, ValueError):
            pass
    store.append_ledger(ledger_line(p, "uninstall", target, current, removed=removed))
    return {
        "changed": True,
        "generation": target,
        "previous": current,
        "uninstalled": True,
        "removed": removed,
        "ready_url": "",
    }


def restore_dropins(store: Store, leaving: int) -> list[str]:
    """Drop-ins that generation ``leaving`` moved away (policy remove) go back where they were."""
    try:
        meta = store.meta(leaving)
    except (OSError, ValueError):
        return []
    out = []
    for path in meta.get("dropins_removed") or []:
        src = os.path.join(store.gen_dir(leaving), "dropins", os.path.basename(path))
        try:
            data = read(src)
        except OSError:
            continue
        if not fs_exists(path):
            write_atomic(path, data, 0o644)
            out.append(path)
    return out
