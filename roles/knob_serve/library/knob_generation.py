#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: generations, lock and ledger of one knobfleet-managed service on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_generation
short_description: Lock, adopt, store and install knobfleet generations of a service
description:
  - C(begin) refuses the host, changing nothing, when a foreign drop-in is present and C(foreign_dropins)
    is C(fail); takes the per-service lock (failing fast with the holder's name) and, the first time,
    stores the existing script and unit as generation 0 (status adopted).
  - C(stage) writes the rendered script and unit (passed in as text) to the staging directory when they
    differ from what is staged, and validates what it wrote (C(bash -n); C(systemd-analyze verify) under
    the unit's real name). In check mode it writes nothing and compares with the installed files; with
    --diff it returns both diffs.
  - C(commit) compares the staged files with the installed ones; when they differ it stores a new
    generation (files + meta.json), installs both files atomically (temp file in the same directory,
    then rename; root-owned, fixed modes), switches C(current) and appends to the ledger.
  - C(mark) records a generation's status (good, failed, rolled-back) with a reason.
  - C(release) frees the lock held by this run.
  - C(restore) installs generation N (default the previous good one) again after checking its stored
    files against meta.json; refuses, changing nothing, when they are missing or altered.
options:
  action: {type: str, required: true, choices: [begin, stage, commit, mark, release, restore]}
  state_dir: {type: path, required: true}
  script_path: {type: path}
  unit_path: {type: path}
  script_content: {type: str}
  unit_content: {type: str}
  run_id: {type: str, required: true}
  operator: {type: str, default: unknown}
  controller: {type: str, default: ""}
  profile: {type: dict}
  generation: {type: int}
  status: {type: str, choices: [good, failed, rolled-back]}
  reason: {type: str, default: ""}
  break_lock: {type: bool, default: false}
  keep: {type: int, default: 10}
  leave_status: {type: str, default: rolled-back}
  event: {type: str, default: rollback}
  engine: {type: dict, description: The engine part of the live-state rule (knobfleet passes it).}
  foreign_dropins: {type: str, default: ignore, choices: [fail, remove, ignore]}
  health_url: {type: str, default: ""}
  info_url: {type: str, default: ""}
author: knobfleet
"""

RETURN = r"""
step: {description: The action that ran; knobfleet keys results by it., returned: always, type: str}
generation: {description: The current generation after the action., returned: success, type: int}
previous: {description: The generation that was current before., returned: success, type: int}
"""

import datetime
import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.knob_live import actions, evaluate, expected_from_files, refusal
from ansible.module_utils.knob_observe import dropins, observe

SCRIPT_MODE = 0o755
UNIT_MODE = 0o644


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sha256(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None


def write_atomic(path, data, mode):
    """Write bytes to path via a temp file in the same directory and rename; root-owned."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, ".%s.knobfleet-tmp" % os.path.basename(path))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chown(tmp, 0, 0)
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read(path):
    with open(path, "rb") as fh:
        return fh.read()


class Store(object):
    def __init__(self, state_dir):
        self.dir = state_dir
        self.gens = os.path.join(state_dir, "generations")
        self.staging = os.path.join(state_dir, "staging")
        self.lock = os.path.join(state_dir, "lock")
        self.ledger = os.path.join(state_dir, "ledger.jsonl")
        self.current_link = os.path.join(state_dir, "current")

    def numbers(self):
        if not os.path.isdir(self.gens):
            return []
        return sorted(int(n) for n in os.listdir(self.gens) if n.isdigit())

    def gen_dir(self, number):
        return os.path.join(self.gens, "%04d" % number)

    def current(self):
        try:
            return int(os.path.basename(os.readlink(self.current_link)))
        except (OSError, ValueError):
            return None

    def meta(self, number):
        path = os.path.join(self.gen_dir(number), "meta.json")
        with open(path) as fh:
            return json.load(fh)

    def write_meta(self, number, meta):
        write_atomic(os.path.join(self.gen_dir(number), "meta.json"),
                     (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), 0o644)

    def switch_current(self, number):
        tmp = self.current_link + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.join("generations", "%04d" % number), tmp)
        os.rename(tmp, self.current_link)

    def append_ledger(self, entry):
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        fd = os.open(self.ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def store_generation(store, number, files, meta):
    """Write generations/NNNN atomically: fill a temp dir, then rename it into place."""
    final = store.gen_dir(number)
    tmp = os.path.join(store.gens, ".%04d.tmp" % number)
    if os.path.isdir(tmp):
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    os.makedirs(tmp, 0o755)
    for name, data, mode in files:
        write_atomic(os.path.join(tmp, name), data, mode)
    write_atomic(os.path.join(tmp, "meta.json"), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    os.rename(tmp, final)


def lock_holder(store):
    try:
        with open(store.lock) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"run_id": "?", "operator": "?", "since": "?", "controller": "?", "corrupt": True}


def validate_staged(module, kind, path, script_path):
    """Fail the task when a freshly staged file does not validate; nothing is installed then."""
    if kind == "script":
        argv = ["bash", "-n", path]
    else:
        argv = ["systemd-analyze", "verify", "--man=no", path]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return
    # The serve script is installed after validation: "not executable" about that path alone is expected
    # when the script is missing on the host (it is about to be installed). Any other complaint fails.
    expected = "Command %s is not executable" % script_path
    lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    if kind == "script":
        module.fail_json(msg="bash -n rejected the staged script: %s" % (lines or ["exit %d" % proc.returncode])[0],
                         rc=proc.returncode, stderr=proc.stderr)
    problems = [ln for ln in lines if expected not in ln]
    if problems:
        module.fail_json(msg="systemd-analyze verify rejected the staged unit: %s" % problems[0],
                         rc=proc.returncode, stderr=proc.stderr)


def stage(module, store, p):
    unit_name = os.path.basename(p["unit_path"])
    items = (("script", p["script_content"], os.path.join(store.staging, "serve.sh"), p["script_path"], SCRIPT_MODE),
             ("unit", p["unit_content"], os.path.join(store.staging, unit_name), p["unit_path"], UNIT_MODE))
    result = {"changed": False, "staged": []}
    diffs = []
    for kind, content, staged, installed, mode in items:
        data = content.encode("utf-8")
        against = installed if module.check_mode else staged
        try:
            old = read(against)
        except FileNotFoundError:
            old = None
        if old == data:
            continue  # staged files that did not change were validated when they were written
        result["changed"] = True
        result["staged"].append(kind)
        diffs.append({"before_header": installed, "after_header": installed,
                      "before": "" if old is None else old.decode("utf-8", "replace"), "after": content})
        if not module.check_mode:
            write_atomic(staged, data, mode)
            validate_staged(module, kind, staged, p["script_path"])
    if module._diff and diffs:
        result["diff"] = diffs
    return result


def foreign_dropins(p):
    """Drop-ins of the unit on disk (loaded or not) that knobfleet did not write."""
    unit = os.path.basename(p["unit_path"])
    return [d["path"] for d in dropins(unit) if d.get("exists")]


def check_dropins(module, p):
    """Refuse the host before anything changes when a foreign drop-in is present under policy fail; under
    remove, only drop-ins in the admin's directory can be moved away."""
    found = foreign_dropins(p)
    if not found or p["foreign_dropins"] == "ignore":
        return found
    if p["foreign_dropins"] == "fail":
        module.fail_json(msg=refusal([{"kind": "dropin_present", "path": found[0]}]), refused=True,
                         dropins=found)
    admin = os.path.join(os.path.dirname(p["unit_path"]), os.path.basename(p["unit_path"]) + ".d")
    other = [d for d in found if os.path.dirname(d) != admin]
    if other:
        module.fail_json(msg="drop-in %s is not in %s, so knobfleet will not remove it; remove or mask it by "
                             "hand" % (other[0], admin), refused=True, dropins=found)
    return found


def mark_interrupted(store, p, holder):
    """A broken lock's apply never finished: its 'installing' generations become 'interrupted'."""
    marked = []
    for n in store.numbers():
        try:
            meta = store.meta(n)
        except (OSError, ValueError):
            continue
        if meta.get("status") == "installing" and meta.get("run_id") != p["run_id"]:
            meta.update(status="interrupted", updated=now(),
                        reason="apply interrupted (lock of run %s broken by %s)" % (holder.get("run_id"), p["operator"]))
            store.write_meta(n, meta)
            marked.append(n)
    return marked


def begin(module, store, p):
    result = {"changed": False, "adopted": False}
    if p["foreign_dropins"] != "ignore":
        result["dropins"] = check_dropins(module, p)
    holder = lock_holder(store)
    if module.check_mode:
        result["lock"] = holder
        result["generation"] = store.current()
        return result
    for d in (store.dir, store.gens, store.staging):
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
            result["changed"] = True
    if holder and holder.get("run_id") != p["run_id"]:
        if not p["break_lock"]:
            module.fail_json(
                msg="locked by %s (run %s) since %s from %s; if that applier was killed, break the lock "
                    "with --break-lock" % (holder.get("operator"), holder.get("run_id"), holder.get("since"),
                                           holder.get("controller")),
                lock=holder, lock_held=True)
        os.unlink(store.lock)
        result["interrupted"] = mark_interrupted(store, p, holder)
        store.append_ledger({"time": now(), "event": "lock-broken", "holder": holder, "run_id": p["run_id"],
                             "operator": p["operator"], "interrupted": result["interrupted"]})
        result["broke_lock"] = holder
    if not holder or holder.get("run_id") != p["run_id"]:
        entry = {"run_id": p["run_id"], "operator": p["operator"], "since": now(), "controller": p["controller"]}
        try:
            fd = os.open(store.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            other = lock_holder(store) or {}
            module.fail_json(msg="locked by %s (run %s) since %s from %s" % (
                other.get("operator"), other.get("run_id"), other.get("since"), other.get("controller")),
                lock=other, lock_held=True)
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh)
        result["locked"] = True  # bookkeeping, not a change of the host's configuration
    if not store.numbers():
        files, present = [], {}
        for key, path, mode in (("script", p["script_path"], SCRIPT_MODE), ("unit", p["unit_path"], UNIT_MODE)):
            if os.path.isfile(path):
                files.append((os.path.basename(path), read(path), mode))
                present[key] = {"path": path, "sha256": sha256(path), "name": os.path.basename(path)}
        meta = {"generation": 0, "status": "adopted", "profile": None, "version": None, "hash": None,
                "files": present, "created": now(), "updated": now(), "operator": p["operator"],
                "run_id": p["run_id"], "reason": "files found before knobfleet's first apply"}
        store_generation(store, 0, files, meta)
        store.switch_current(0)
        store.append_ledger({"time": now(), "event": "adopt", "generation": 0, "status": "adopted",
                             "files": sorted(present), "run_id": p["run_id"], "operator": p["operator"]})
        result.update(changed=True, adopted=True)
    result["generation"] = store.current()
    return result


def live_actions(p, script, unit):
    """What the live-state rule (module_utils knob_live) says the running engine needs when its files are
    already right: [] (nothing), or e.g. ["daemon-reload", "restart"], and the finding kinds behind it."""
    doc = observe({"service": os.path.basename(p["unit_path"]).rsplit(".service", 1)[0],
                   "script_path": p["script_path"], "unit_path": p["unit_path"], "state_dir": p["state_dir"],
                   "health_url": p["health_url"] or "", "info_url": p["info_url"] or "", "http_timeout_s": 2.0})
    expected = expected_from_files(p["script_path"], script.decode("utf-8", "replace"), p["unit_path"],
                                   unit.decode("utf-8", "replace"), lambda b: hashlib.sha256(b).hexdigest())
    findings = evaluate(doc, expected, p["engine"] or {}, run_id=p["run_id"])
    # A stopped engine is started by the readiness step, and foreign drop-ins were settled by begin (refused)
    # or above (removed into a new generation): neither is a reason to restart here.
    findings = [f for f in findings if f["kind"] not in ("service_inactive", "dropin_present")]
    return actions(findings, p["foreign_dropins"], True), sorted({f["kind"] for f in findings})


def commit(module, store, p):
    script_name = os.path.basename(p["script_path"])
    unit_name = os.path.basename(p["unit_path"])
    staged_script = os.path.join(store.staging, "serve.sh")
    staged_unit = os.path.join(store.staging, unit_name)
    want = {"script": sha256(staged_script), "unit": sha256(staged_unit)}
    if None in want.values():
        module.fail_json(msg="staged files missing in %s; the stage action must run first" % store.staging)
    have = {"script": sha256(p["script_path"]), "unit": sha256(p["unit_path"])}
    current = store.current()
    profile = p["profile"] or {}
    current_hash = None
    if current is not None:
        try:
            current_hash = store.meta(current).get("hash")
        except (OSError, ValueError):
            current_hash = None
    files_differ = want != have
    remove = foreign_dropins(p) if p["foreign_dropins"] == "remove" else []
    result = {"changed": False, "previous": current, "generation": current, "files_changed": files_differ,
              "script_sha256": want["script"], "unit_sha256": want["unit"], "dropins_removed": remove}
    if not files_differ and current_hash == profile.get("hash") and not remove:
        acts, kinds = live_actions(p, read(staged_script), read(staged_unit))
        if acts:
            # Files are right but the running engine is not: restart it (no new generation).
            why = "live state differs from the installed files (%s)" % ", ".join(kinds)
            result.update(changed=True, restart_reason=why, actions=acts)
            if not module.check_mode:
                store.append_ledger({"time": now(), "event": "restart", "generation": current, "reason": why,
                                     "run_id": p["run_id"], "operator": p["operator"]})
        return result
    if module.check_mode:
        result["changed"] = True
        return result
    number = (max(store.numbers()) + 1) if store.numbers() else 1
    meta = {
        "generation": number, "status": "installing", "profile": profile.get("name"),
        "version": profile.get("version"), "hash": profile.get("hash"),
        "files": {"script": {"path": p["script_path"], "sha256": want["script"], "name": script_name},
                  "unit": {"path": p["unit_path"], "sha256": want["unit"], "name": unit_name}},
        "created": now(), "updated": now(), "operator": p["operator"], "run_id": p["run_id"],
        "previous": current, "reason": "", "engine": (p["engine"] or {}).get("name"),
        "ready_url": p["health_url"] or "", "dropins_removed": remove,
    }
    try:
        store_generation(store, number, [(script_name, read(staged_script), SCRIPT_MODE),
                                         (unit_name, read(staged_unit), UNIT_MODE)], meta)
    except OSError as exc:
        leftover = os.path.join(store.gens, ".%04d.tmp" % number)
        if os.path.isdir(leftover):
            for name in os.listdir(leftover):
                os.unlink(os.path.join(leftover, name))
            os.rmdir(leftover)
        module.fail_json(msg="cannot store generation %04d in %s: %s; free space there (or raise its quota) and "
                         "apply again; nothing was installed, generation %s is still live"
                         % (number, store.gens, exc.strerror, "none" if current is None else "%04d" % current),
                         errno=exc.errno)
    if remove:
        backup = os.path.join(store.gen_dir(number), "dropins")
        os.makedirs(backup, 0o700)
        for path in remove:
            write_atomic(os.path.join(backup, os.path.basename(path)), read(path), 0o644)
            os.unlink(path)
    for src, dest, mode in ((staged_script, p["script_path"], SCRIPT_MODE), (staged_unit, p["unit_path"], UNIT_MODE)):
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o755)
        write_atomic(dest, read(src), mode)
    store.switch_current(number)
    store.append_ledger({"time": now(), "event": "apply", "generation": number, "previous": current,
                         "profile": profile.get("name"), "version": profile.get("version"),
                         "hash": profile.get("hash"), "status": "installing", "run_id": p["run_id"],
                         "operator": p["operator"]})
    result.update(changed=True, generation=number)
    return result


def mark(module, store, p):
    number = p["generation"]
    try:
        meta = store.meta(number)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="cannot read %s/meta.json: %s" % (store.gen_dir(number), exc))
    if module.check_mode:
        return {"changed": meta.get("status") != p["status"], "generation": number}
    meta.update(status=p["status"], updated=now())
    if p["reason"]:
        meta["reason"] = p["reason"]
    store.write_meta(number, meta)
    store.append_ledger({"time": now(), "event": "mark", "generation": number, "status": p["status"],
                         "reason": p["reason"], "run_id": p["run_id"], "operator": p["operator"]})
    pruned = prune(store, p["keep"]) if p["status"] == "good" else []
    return {"changed": True, "generation": number, "status": p["status"], "pruned": pruned}


def statuses(store):
    out = {}
    for n in store.numbers():
        try:
            out[n] = store.meta(n).get("status")
        except (OSError, ValueError):
            out[n] = None
    return out


def previous_good(store, before):
    """Newest generation older than ``before`` that was good (or adopted)."""
    st = statuses(store)
    for n in sorted(st, reverse=True):
        if n < before and st[n] in ("good", "adopted"):
            return n
    return None


def prune(store, keep):
    """Keep the last ``keep`` good generations, generation 0, current and the previous good one;
    failed and rolled-back generations older than the oldest kept good one go too. Never the only way back."""
    if not keep or keep < 1:
        return []
    st = statuses(store)
    current = store.current()
    good = [n for n in sorted(st) if st[n] == "good"]
    protect = {0, current, previous_good(store, current if current is not None else 1 << 30)}
    protect.update(good[-keep:])
    oldest_kept = min([n for n in good[-keep:]] or [0])
    removed = []
    for n in sorted(st):
        if n in protect or n >= oldest_kept:
            continue
        path = store.gen_dir(n)
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
        removed.append(n)
    if removed:
        store.append_ledger({"time": now(), "event": "prune", "generations": removed, "keep": keep})
    return removed


def restore(module, store, p):
    """Install generation N (default: the previous good one) again: verify its stored files, install them
    atomically, switch current, record why. Changes nothing when the target is unusable."""
    current = store.current()
    target = p["generation"]
    if target is None:
        target = previous_good(store, current if current is not None else 1 << 30)
        if target is None:
            module.fail_json(msg="no earlier good generation to go back to (current %s); nothing changed" % current)
    gen_dir = store.gen_dir(target)
    try:
        meta = store.meta(target)
    except FileNotFoundError:
        have = ", ".join("%04d" % n for n in store.numbers()) or "none"
        module.fail_json(msg="generation %04d does not exist on this host (have: %s); nothing changed" % (target, have))
    except (OSError, ValueError) as exc:
        module.fail_json(msg="%s/meta.json is unreadable (%s); fix or delete that generation, then pick another "
                         "with --to N; nothing changed" % (gen_dir, exc))
    files = meta.get("files") or {}
    if not files:
        module.fail_json(msg="generation %04d holds no files (nothing was installed before knobfleet); "
                         "nothing changed" % target)
    plan = []
    for key, mode in (("script", SCRIPT_MODE), ("unit", UNIT_MODE)):
        f = files.get(key)
        if not f:
            continue
        src = os.path.join(gen_dir, f["name"])
        digest = sha256(src)
        if digest is None:
            module.fail_json(msg="generation %04d: %s was deleted; refusing to roll back to it; nothing changed"
                             % (target, src))
        if digest != f.get("sha256"):
            module.fail_json(msg="generation %04d: %s does not match its recorded sha256; refusing; nothing changed"
                             % (target, src))
        plan.append((src, f["path"], mode))
    if module.check_mode:
        return {"changed": target != current, "generation": target, "previous": current}
    for src, dest, mode in plan:
        write_atomic(dest, read(src), mode)
    put_back = []
    if current is not None and target < current:
        put_back = restore_dropins(store, current)
    store.switch_current(target)
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
    store.append_ledger({"time": now(), "event": p["event"], "generation": target, "previous": current,
                         "profile": meta.get("profile"), "version": meta.get("version"), "hash": meta.get("hash"),
                         "reason": p["reason"], "run_id": p["run_id"], "operator": p["operator"]})
    return {"changed": True, "generation": target, "previous": current, "profile": meta.get("profile"),
            "version": meta.get("version"), "hash": meta.get("hash"), "ready_url": meta.get("ready_url") or "",
            "dropins_restored": put_back}


def restore_dropins(store, leaving):
    """Drop-ins that generation ``leaving`` moved away (policy remove) go back where they were."""
    try:
        meta = store.meta(leaving)
    except (OSError, ValueError):
        return []
    out = []
    for path in meta.get("dropins_removed") or []:
        src = os.path.join(store.gen_dir(leaving), "dropins", os.path.basename(path))
        if os.path.isfile(src) and not os.path.lexists(path):
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                os.makedirs(parent, 0o755)
            write_atomic(path, read(src), 0o644)
            out.append(path)
    return out


def release(module, store, p):
    holder = lock_holder(store)
    if module.check_mode or not holder or holder.get("run_id") != p["run_id"]:
        return {"changed": False}
    os.unlink(store.lock)
    return {"changed": False, "released": True}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["begin", "stage", "commit", "mark", "release", "restore"]),
            state_dir=dict(type="path", required=True),
            script_path=dict(type="path"),
            unit_path=dict(type="path"),
            script_content=dict(type="str"),
            unit_content=dict(type="str"),
            run_id=dict(type="str", required=True),
            operator=dict(type="str", default="unknown"),
            controller=dict(type="str", default=""),
            profile=dict(type="dict"),
            generation=dict(type="int"),
            status=dict(type="str", choices=["good", "failed", "rolled-back"]),
            reason=dict(type="str", default=""),
            break_lock=dict(type="bool", default=False),
            keep=dict(type="int", default=10),
            leave_status=dict(type="str", default="rolled-back", choices=["failed", "rolled-back", ""]),
            event=dict(type="str", default="rollback", choices=["rollback", "restore"]),
            engine=dict(type="dict"),
            foreign_dropins=dict(type="str", default="ignore", choices=["fail", "remove", "ignore"]),
            health_url=dict(type="str", default=""),
            info_url=dict(type="str", default=""),
        ),
        required_if=[("action", "begin", ["script_path", "unit_path"]),
                     ("action", "stage", ["script_path", "unit_path", "script_content", "unit_content"]),
                     ("action", "commit", ["script_path", "unit_path", "profile"]),
                     ("action", "mark", ["generation", "status"])],
        supports_check_mode=True,
    )
    p = module.params
    fail = module.fail_json
    module.fail_json = lambda **kw: fail(step=p["action"], **kw)  # every result names its step
    store = Store(p["state_dir"])
    handlers = {"begin": begin, "stage": stage, "commit": commit, "mark": mark, "release": release,
                "restore": restore}
    try:
        result = handlers[p["action"]](module, store, p)
    except OSError as exc:
        module.fail_json(msg="%s: %s (%s)" % (p["action"], exc.strerror, exc.filename or p["state_dir"]),
                         errno=exc.errno)
    module.exit_json(step=p["action"], **result)


if __name__ == "__main__":
    main()
