#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: generations, lock and ledger of one knobfleet-managed service on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_generation
short_description: Lock, adopt, store, install, restore and verify knobfleet generations of a service
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
  - C(verify) observes the host (files, unit, every process of the unit with its /proc environ and cmdline)
    and checks it against the current generation with knobfleet's live-state rule; fails naming what differs.
  - C(install) is C(begin), C(stage) and C(commit) in one call (no C(commit) in check mode); C(finish) is
    C(mark) (when O(generation) is given) and C(release). Their results come back under C(steps), one per
    step; a failure names the step (C(failed_step)) with the results of the steps before it.
  - Standard library only on the host; part of the C(knobfleet.serving) collection, used by its
    C(knob_serve) role.
version_added: "0.1.0"
author: knobfleet
options:
  action:
    description: What to do (see above).
    type: str
    required: true
    choices: [begin, stage, commit, mark, release, restore, verify, install, finish]
  after:
    description: For C(verify), what came before. After a C(restore), findings that may predate the change
      (a drop-in put back) do not fail the check.
    type: str
    default: apply
    choices: [apply, restore]
  state_dir:
    description: The service's state folder (generations, ledger, lock), root-only.
    type: path
    required: true
  script_path:
    description: Where the serve script is installed.
    type: path
  unit_path:
    description: Where the systemd unit is installed.
    type: path
  script_content:
    description: The rendered serve script (C(stage)). Never logged.
    type: str
  unit_content:
    description: The rendered systemd unit (C(stage)).
    type: str
  run_id:
    description: The controller's run id; owns the lock.
    type: str
    required: true
  operator:
    description: Who applies; recorded in meta.json and the ledger.
    type: str
    default: unknown
  controller:
    description: Controller host and PID holding the lock.
    type: str
    default: ""
  profile:
    description: The profile's C(name), C(version) and C(hash) (C(commit)).
    type: dict
  generation:
    description: The generation to mark or restore (C(restore) defaults to the previous good one).
    type: int
  status:
    description: Status for C(mark).
    type: str
    choices: [good, failed, rolled-back]
  reason:
    description: Why (recorded with a status or a restore).
    type: str
    default: ""
  break_lock:
    description: Break a lock left by a killed applier (its generation is marked interrupted).
    type: bool
    default: false
  keep:
    description: Good generations to keep when marking one good (older ones are pruned).
    type: int
    default: 10
  leave_status:
    description: Status given to the generation a restore leaves (empty keeps it).
    type: str
    default: rolled-back
    choices: [failed, rolled-back, ""]
  event:
    description: Ledger event of a restore; C(restore) also uninstalls when the target held no files.
    type: str
    default: rollback
    choices: [rollback, restore]
  engine:
    description: The engine part of the live-state rule (C(knob_serve_engine)).
    type: dict
  foreign_dropins:
    description: A drop-in knobfleet did not write; C(fail) refuses, C(remove) moves it into the generation.
    type: str
    default: ignore
    choices: [fail, remove, ignore]
  secret:
    description: Secret env names or patterns; their values are shown and stored only as hashes.
    type: list
    elements: str
    default: []
  secret_key:
    description: The fleet's key for secret markers (knobfleet passes its own); empty shows secrets as C(<secret>).
    type: str
    default: ""
  service_user:
    description: The engine's user; may read a script holding a secret.
    type: str
    default: root
  health_url:
    description: The engine's health URL (recorded; used by C(verify)).
    type: str
    default: ""
  info_url:
    description: The engine's info URL, where it reports its env.
    type: str
    default: ""
notes:
  - Supports check mode (C(stage) returns diffs; C(commit) and C(restore) report what they would do).
"""

EXAMPLES = r"""
- name: Take the host lock and adopt pre-knobfleet files as generation 0
  knobfleet.serving.knob_generation:
    action: begin
    state_dir: /var/lib/knobfleet/sglang-decode
    script_path: /opt/serving/serve_decode.sh
    unit_path: /etc/systemd/system/sglang-decode.service
    run_id: manual

- name: Go back to generation 3
  knobfleet.serving.knob_generation:
    action: restore
    state_dir: /var/lib/knobfleet/sglang-decode
    unit_path: /etc/systemd/system/sglang-decode.service
    generation: 3
    reason: rollback requested
    run_id: manual

- name: Check that the live engine runs the current generation
  knobfleet.serving.knob_generation:
    action: verify
    state_dir: /var/lib/knobfleet/sglang-decode
    script_path: /opt/serving/serve_decode.sh
    unit_path: /etc/systemd/system/sglang-decode.service
    run_id: manual
"""

RETURN = r"""
step:
  description: The action that ran; knobfleet keys results by it.
  returned: always
  type: str
  sample: commit
generation:
  description: The current generation after the action.
  returned: success
  type: int
  sample: 4
previous:
  description: The generation that was current before.
  returned: success
  type: int
  sample: 3
findings:
  description: What the live-state rule found (C(verify)), each with kind, severity, action and message.
  returned: when action is verify
  type: list
  elements: dict
verified:
  description: True when C(verify) found nothing blocking.
  returned: when action is verify
  type: bool
steps:
  description: For C(install) and C(finish), each step's own result (begin, stage, commit; mark, release).
  returned: when action is install or finish
  type: dict
failed_step:
  description: For C(install) and C(finish), the step that failed.
  returned: on failure of install or finish
  type: str
"""

import datetime
import hashlib
import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.knob_fs import UnsafePath, open_dir, private_dir
from ansible.module_utils.knob_fs import exists as fs_exists
from ansible.module_utils.knob_fs import read as fs_read
from ansible.module_utils.knob_fs import sha256 as fs_sha256
from ansible.module_utils.knob_fs import unlink as fs_unlink
from ansible.module_utils.knob_fs import write as fs_write
from ansible.module_utils.knob_live import (
    actions,
    evaluate,
    expected_from_files,
    expected_from_generation,
    redact_script,
    redact_unit,
    refusal,
    shown_digest,
    restore_ok,
)
from ansible.module_utils.knob_observe import dropins, observe

SCRIPT_MODE = 0o755
UNIT_MODE = 0o644


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sha256(path):
    """sha256 of the regular file at path (None when absent); a symlink anywhere in the path is refused."""
    return fs_sha256(path)


def write_atomic(path, data, mode, gid=0):
    """Write bytes to path atomically, root-owned (group ``gid``), never following a symlink (module_utils
    knob_fs: random O_EXCL temp name, fchown/fchmod on the descriptor, rename relative to the directory)."""
    fs_write(path, data, mode, 0, gid, create_dirs=0o755)


def read(path):
    return fs_read(path)


def read_json_object(path):
    data = json.loads(read(path).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("%s is not a JSON object" % path)
    return data


class Store(object):
    def __init__(self, state_dir):
        self.dir = state_dir.rstrip("/")
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
        return read_json_object(os.path.join(self.gen_dir(number), "meta.json"))

    def ensure(self):
        """Create the state directory root-only (or tighten one an older knobfleet left 0755); refuse one that
        another user owns or can write to."""
        parent = os.path.dirname(self.dir)
        os.close(open_dir(parent, create_mode=0o755))
        if os.path.isdir(self.dir) and not os.path.islink(self.dir):
            st = os.lstat(self.dir)
            if st.st_uid == 0 and st.st_mode & 0o077:
                os.chmod(self.dir, 0o700)
        os.close(private_dir(self.dir))
        for d in (self.gens, self.staging):
            os.close(private_dir(d))

    def write_meta(self, number, meta):
        write_atomic(os.path.join(self.gen_dir(number), "meta.json"),
                     (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), 0o644)

    def switch_current(self, number):
        tmp = "%s.%d.tmp" % (self.current_link, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.join("generations", "%04d" % number), tmp)
        os.rename(tmp, self.current_link)

    def append_ledger(self, entry):
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        fd = os.open(self.ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def store_generation(store, number, files, meta):
    """Write generations/NNNN atomically: fill a temp dir, then rename it into place."""
    final = store.gen_dir(number)
    tmp = os.path.join(store.gens, ".%04d.tmp" % number)
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        remove_tree(tmp)
    os.mkdir(tmp, 0o700)
    for name, data, mode in files:
        write_atomic(os.path.join(tmp, name), data, mode)
    write_atomic(os.path.join(tmp, "meta.json"), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    os.rename(tmp, final)


def remove_tree(path):
    """Remove a directory knobfleet made (files and one level of subdirectories), never following links."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            remove_tree(full)
        else:
            os.unlink(full)
    os.rmdir(path)


def lock_holder(store):
    try:
        return read_json_object(store.lock)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"run_id": "?", "operator": "?", "since": "?", "controller": "?", "corrupt": str(exc)}


def break_lock(store, p):
    """Break a held lock atomically: rename it aside (only one breaker's rename can succeed; a second one
    finds nothing and must then win the O_EXCL create like anyone else)."""
    aside = "%s.broken-%s" % (store.lock, p["run_id"])
    try:
        os.rename(store.lock, aside)
    except FileNotFoundError:
        return False
    os.unlink(aside)
    return True


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
        before = "" if old is None else old.decode("utf-8", "replace")
        hide = redact_script if kind == "script" else redact_unit  # secret values leave the host only as markers
        before, content = hide(before, p["secret"], p.get("secret_key", "")), hide(content, p["secret"],
                                                                                  p.get("secret_key", ""))
        diffs.append({"before_header": installed, "after_header": installed, "before": before, "after": content})
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
    store.ensure()
    if holder and holder.get("run_id") != p["run_id"]:
        if not p["break_lock"]:
            module.fail_json(
                msg="locked by %s (run %s) since %s from %s; if that applier was killed, break the lock "
                    "with --break-lock" % (holder.get("operator"), holder.get("run_id"), holder.get("since"),
                                           holder.get("controller")),
                lock=holder, lock_held=True)
        break_lock(store, p)
        result["interrupted"] = mark_interrupted(store, p, holder)
        store.append_ledger({"time": now(), "event": "lock-broken", "holder": holder, "run_id": p["run_id"],
                             "operator": p["operator"], "interrupted": result["interrupted"]})
        result["broke_lock"] = holder
    if not holder or holder.get("run_id") != p["run_id"]:
        entry = {"run_id": p["run_id"], "operator": p["operator"], "since": now(), "controller": p["controller"]}
        try:
            fd = os.open(store.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
            try:
                data = read(path)
            except FileNotFoundError:
                continue
            except UnsafePath as exc:
                release(module, store, p)  # this run took the lock above; it must not outlive the refusal
                module.fail_json(msg="cannot adopt %s: %s; knobfleet manages regular files only: replace it with "
                                     "a regular file (or remove it) and apply again; nothing was changed"
                                     % (path, exc.strerror))
            files.append((os.path.basename(path), data, 0o600))
            present[key] = {"path": path, "sha256": hashlib.sha256(data).hexdigest(),
                            "name": os.path.basename(path)}
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
                   "health_url": p["health_url"] or "", "info_url": p["info_url"] or "", "http_timeout_s": 2.0,
                   "secret": p["secret"], "secret_key": p.get("secret_key", "")})
    expected = expected_from_files(p["script_path"], script.decode("utf-8", "replace"), p["unit_path"],
                                   unit.decode("utf-8", "replace"), lambda b: hashlib.sha256(b).hexdigest(),
                                   p["secret"], p.get("secret_key", ""))
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
    staged_text = read(staged_script).decode("utf-8", "replace")  # the digest of a script holding a secret is keyed
    result["script_sha256"] = shown_digest(want["script"], redact_script(staged_text, p["secret"]) != staged_text,
                                           p.get("secret_key", ""))
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
    mode, gid = script_access(module, p, read(staged_script))
    meta["files"]["script"].update(mode=mode, gid=gid)
    store.write_meta(number, meta)
    install_all(module, store, number, current, [
        (staged_script, p["script_path"], mode, gid),
        (staged_unit, p["unit_path"], UNIT_MODE, 0)], remove)
    store.switch_current(number)
    store.append_ledger({"time": now(), "event": "apply", "generation": number, "previous": current,
                         "profile": profile.get("name"), "version": profile.get("version"),
                         "hash": profile.get("hash"), "status": "installing", "run_id": p["run_id"],
                         "operator": p["operator"]})
    result.update(changed=True, generation=number)
    return result


def script_access(module, p, script):
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
        module.fail_json(msg="the serve script holds a secret and must be readable by the service user %r, "
                             "which does not exist on this host; create it or fix knob_serve_user" % user)


def install_all(module, store, number, current, files, remove):
    """Install every file of generation ``number`` or none: when one write fails, the files already written
    get their previous contents back (or are removed if there were none), removed drop-ins are put back, the
    new generation is deleted, and the error says exactly that."""
    done = []  # (path, previous bytes or None, previous mode)
    moved = []
    try:
        if remove:
            backup = os.path.join(store.gen_dir(number), "dropins")
            os.mkdir(backup, 0o700)
            for path in remove:
                data = read(path)
                write_atomic(os.path.join(backup, os.path.basename(path)), data, 0o600)
                fs_unlink(path)
                moved.append((path, data))
        for src, dest, mode, gid in files:
            try:
                before, before_mode = read(dest), os.lstat(dest).st_mode & 0o7777
            except FileNotFoundError:
                before, before_mode = None, mode
            write_atomic(dest, read(src), mode, gid)
            done.append((dest, before, before_mode))
    except OSError as exc:
        undone = []
        for dest, before, before_mode in reversed(done):
            try:
                if before is None:
                    fs_unlink(dest)
                else:
                    write_atomic(dest, before, before_mode)
                undone.append(dest)
            except OSError:
                pass
        for path, data in moved:
            try:
                write_atomic(path, data, 0o644)
            except OSError:
                pass
        try:
            remove_tree(store.gen_dir(number))
        except OSError:
            pass
        what = exc.filename or "a file"
        back = (" %s put back as it was;" % ", ".join(undone)) if undone else ""
        module.fail_json(msg="cannot install %s: %s;%s generation %04d removed; generation %s is still live"
                             % (what, exc.strerror or exc, back, number,
                                "none" if current is None else "%04d" % current),
                         errno=exc.errno, rolled_back=True)


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
        if p["event"] != "restore":
            module.fail_json(msg="generation %04d holds no files (nothing was installed before knobfleet); "
                             "nothing changed" % target)
        return uninstall(module, store, p, target, current)
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
        plan.append((src, f["path"], int(f.get("mode") or mode), int(f.get("gid") or 0)))
    if module.check_mode:
        return {"changed": target != current, "generation": target, "previous": current}
    for src, dest, mode, gid in plan:
        write_atomic(dest, read(src), mode, gid)
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


def uninstall(module, store, p, target, current):
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
    store.append_ledger({"time": now(), "event": "uninstall", "generation": target, "previous": current,
                         "removed": removed, "reason": p["reason"], "run_id": p["run_id"],
                         "operator": p["operator"]})
    return {"changed": True, "generation": target, "previous": current, "uninstalled": True, "removed": removed,
            "ready_url": ""}


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


def verify(module, store, p):
    """The live-state rule (module_utils knob_live) on this host now: the current generation's files, unit,
    and every engine process's /proc environ and cmdline. After a restore, findings that may predate the
    change (a drop-in put back, RULES[kind].restore_ok) are reported but do not fail."""
    doc = observe({"service": os.path.basename(p["unit_path"]).rsplit(".service", 1)[0],
                   "script_path": p["script_path"], "unit_path": p["unit_path"], "state_dir": p["state_dir"],
                   "health_url": p["health_url"] or "", "info_url": p["info_url"] or "", "http_timeout_s": 2.0,
                   "secret": p["secret"], "secret_key": p.get("secret_key", "")})
    expected, why = expected_from_generation(doc)
    if why is not None:
        module.fail_json(msg="cannot verify: %s" % why)
    findings = evaluate(doc, expected, p["engine"] or {}, run_id=p["run_id"])
    blocking = restore_ok(findings) if p["after"] == "restore" else findings
    generation = (expected or {}).get("generation")
    if blocking:
        module.fail_json(msg="generation %s does not verify: %s" % (
            "none" if generation is None else "%04d" % generation,
            "; ".join(f["message"] for f in blocking[:3])), findings=findings)
    return {"changed": False, "generation": generation, "verified": True, "findings": findings}


def release(module, store, p):
    holder = lock_holder(store)
    if module.check_mode or not holder or holder.get("run_id") != p["run_id"]:
        return {"changed": False}
    os.unlink(store.lock)
    return {"changed": False, "released": True}


def composite(names):
    """One module call for steps that always run back to back (each SSH round trip + module start costs ~0.45 s
    on a host; a real engine's restart waits on none of them): ``install`` is begin, stage and commit (no commit
    in check mode), ``finish`` marks the new generation good (when ``generation`` is given) and releases the
    lock. Each step's result is returned under ``steps``; a failing step fails the call with the earlier
    steps' results and ``failed_step``, so the caller knows, e.g., whether the lock was taken."""
    def run(module, store, p):
        steps = {}
        fail = module.fail_json
        current = {"name": names[0]}
        module.fail_json = lambda **kw: fail(steps=steps, failed_step=current["name"], **kw)
        try:
            for name in names:
                if (name == "commit" and module.check_mode) or (name == "mark" and p["generation"] is None):
                    continue
                current["name"] = name
                steps[name] = HANDLERS[name](module, store, p)
        finally:
            module.fail_json = fail
        out = {"changed": any(r.get("changed") for r in steps.values()), "steps": steps}
        if steps.get("stage", {}).get("diff"):
            out["diff"] = steps["stage"]["diff"]
        return out
    return run


HANDLERS = {"begin": begin, "stage": stage, "commit": commit, "mark": mark, "release": release,
            "restore": restore, "verify": verify}
HANDLERS.update(install=composite(("begin", "stage", "commit")), finish=composite(("mark", "release")))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True,
                        choices=["begin", "stage", "commit", "mark", "release", "restore", "verify", "install",
                                 "finish"]),
            after=dict(type="str", default="apply", choices=["apply", "restore"]),
            state_dir=dict(type="path", required=True),
            script_path=dict(type="path"),
            unit_path=dict(type="path"),
            script_content=dict(type="str", no_log=True),  # may hold secrets: never in logs or artifacts
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
            secret=dict(type="list", elements="str", default=[]),
            secret_key=dict(type="str", default="", no_log=True),
            service_user=dict(type="str", default="root"),
            foreign_dropins=dict(type="str", default="ignore", choices=["fail", "remove", "ignore"]),
            health_url=dict(type="str", default=""),
            info_url=dict(type="str", default=""),
        ),
        required_if=[("action", "begin", ["script_path", "unit_path"]),
                     ("action", "stage", ["script_path", "unit_path", "script_content", "unit_content"]),
                     ("action", "install", ["script_path", "unit_path", "script_content", "unit_content", "profile"]),
                     ("action", "finish", ["status"]),
                     ("action", "commit", ["script_path", "unit_path", "profile"]),
                     ("action", "mark", ["generation", "status"]),
                     ("action", "verify", ["script_path", "unit_path"])],
        supports_check_mode=True,
    )
    p = module.params
    fail = module.fail_json
    module.fail_json = lambda **kw: fail(step=p["action"], **kw)  # every result names its step
    store = Store(p["state_dir"])
    try:
        result = HANDLERS[p["action"]](module, store, p)
    except OSError as exc:
        module.fail_json(msg="%s: %s (%s)" % (p["action"], exc.strerror, exc.filename or p["state_dir"]),
                         errno=exc.errno)
    module.exit_json(step=p["action"], **result)


if __name__ == "__main__":
    main()
