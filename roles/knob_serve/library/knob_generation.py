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
  - C(install) (in its C(begin), before the lock or any write) and C(commit) refuse a unit whose name the host's
    packages ship (that name, or its template's, under /lib/systemd/system or /usr/lib/systemd/system), since the
    serve unit would take the place of the host's own service. A restore is never refused by it.
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
  allow_writable_script_dir:
    description: Accept (with a warning) a serve script that root runs in a directory a non-root user can
      change; refused otherwise.
    type: bool
    default: false
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
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.knob_fs import (
    DIR_FLAGS,
    Install,
    UnsafePath,
    append_line,
    entries,
    kind_of,
    open_dir,
    private_dir,
    read_stat,
    remove_tree_at,
    same_content,
    writable_by_others,
    write_at,
)
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
GEN_NAME = re.compile(r"[0-9]{4,9}")  # generations/NNNN; anything else there is not a generation
PRUNABLE = ("good", "failed", "rolled-back", "interrupted")  # never unreadable, installing or adopted ones
RESERVED_NAMES = ("meta.json", "dropins")  # names a generation dir uses for itself
# Where the OS's packages install their units (systemd's search path below /etc and /run). A unit of the serve
# unit's name there is the host's own: /etc/systemd/system/NAME.service would shadow it and the restart would
# stop the host's service (an apply naming `ssh` locked everyone out). Tests point this at temp dirs.
PACKAGE_UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system")


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sha256(path):
    """sha256 of the regular file at path (None when absent); a symlink anywhere in the path is refused."""
    return fs_sha256(path)


def write_atomic(path, data, mode, gid=0, uid=0):
    """Write bytes to path atomically, owned ``uid``:``gid``, never following a symlink (module_utils
    knob_fs: random O_EXCL temp name, fchown/fchmod on the descriptor, rename relative to the directory)."""
    fs_write(path, data, mode, uid, gid, create_dirs=0o755)


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

    def listing(self):
        """(name, is a real directory) of every entry of generations/ (none when it is missing); read through a
        descriptor, never following a symlink."""
        try:
            fd = open_dir(self.gens)
        except FileNotFoundError:
            return []
        try:
            return entries(fd)
        finally:
            os.close(fd)

    def numbers(self):
        """The generations: real directories named NNNN. A symlink, file, FIFO or odd name there is none."""
        return sorted(int(n) for n, is_dir in self.listing() if is_dir and GEN_NAME.fullmatch(n)
                      and "%04d" % int(n) == n)

    def next_number(self):
        """One past every number in use by anything in generations/ (a stray file named 0007 included)."""
        taken = [int(m.group(0)) for m in (re.search(r"[0-9]{1,9}", n) for n, _ in self.listing()) if m]
        return max(taken + [0]) + 1

    def gen_dir(self, number):
        return os.path.join(self.gens, "%04d" % number)

    def current(self):
        try:
            target = os.readlink(self.current_link)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink: knobfleet never makes that
                raise UnsafePath(exc.errno, "is not a symlink to generations/NNNN; remove it and apply again",
                                 self.current_link)
            raise
        name = os.path.basename(target)
        if target != os.path.join("generations", name) or not GEN_NAME.fullmatch(name):
            raise UnsafePath(errno.EINVAL, "points at %r, not at generations/NNNN; remove it and apply again"
                             % target[:80], self.current_link)
        return int(name)

    def meta(self, number):
        return read_json_object(os.path.join(self.gen_dir(number), "meta.json"))

    def ensure(self):
        """Create the state directory root-only (or tighten one an older knobfleet left 0755); refuse one that
        another user owns or can write to. Everything through descriptors opened without following links."""
        parent = os.path.dirname(self.dir)
        os.close(open_dir(parent, create_mode=0o755))
        fd = open_dir(self.dir, create_mode=0o700)
        try:
            st = os.fstat(fd)
            if st.st_uid == 0 and st.st_mode & 0o077:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        os.close(private_dir(self.dir))
        for d in (self.gens, self.staging):
            os.close(private_dir(d))

    def write_meta(self, number, meta):
        write_atomic(os.path.join(self.gen_dir(number), "meta.json"), meta_bytes(meta), 0o644)

    def switch_current(self, number, keep_previous=False):
        """Point ``current`` at generation ``number`` atomically. ``keep_previous``: first keep the old link
        under a hard link ``current.prev``, so ``unswitch`` needs no new inode (a full disk cannot stop it)."""
        tmp = "%s.%d.tmp" % (self.current_link, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.join("generations", "%04d" % number), tmp)
        try:
            if keep_previous:
                self.drop_previous()
                try:
                    os.link(self.current_link, self.current_link + ".prev", follow_symlinks=False)
                except FileNotFoundError:
                    pass
            os.rename(tmp, self.current_link)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def drop_previous(self):
        try:
            os.unlink(self.current_link + ".prev")
        except FileNotFoundError:
            pass

    def append_ledger(self, entry):
        """One JSON line, appended without blocking (a FIFO there is refused) and on a fresh line."""
        append_line(self.ledger, (json.dumps(entry, sort_keys=True) + "\n").encode())

    def unswitch(self, number, back_to):
        """Undo switch_current(number, keep_previous=True): ``current`` points at ``back_to`` again (or is
        removed when there was none), by renaming the kept link back."""
        try:
            moved = self.current() == number
        except (OSError, ValueError):
            moved = False
        prev = self.current_link + ".prev"
        if not moved:
            self.drop_previous()
        elif os.path.lexists(prev):
            os.rename(prev, self.current_link)
        elif back_to is None:
            os.unlink(self.current_link)
        else:
            self.switch_current(back_to)


def meta_bytes(meta):
    return (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()


def store_generation(store, number, files, meta):
    """Write generations/NNNN atomically, meta.json included: fill a temp dir, then rename it into place. On any
    failure (a full disk at any byte) the temp dir is removed again and nothing is left behind."""
    name = "%04d" % number
    tmp = ".%s.tmp" % name
    gfd = open_dir(store.gens)
    try:
        try:
            remove_tree_at(gfd, tmp)
        except FileNotFoundError:
            pass
        os.mkdir(tmp, 0o700, dir_fd=gfd)
        try:
            tfd = os.open(tmp, DIR_FLAGS, dir_fd=gfd)
            try:
                for fname, data, mode in files:
                    write_at(tfd, fname, data, mode)
                write_at(tfd, "meta.json", meta_bytes(meta), 0o644)
            finally:
                os.close(tfd)
            os.rename(tmp, name, src_dir_fd=gfd, dst_dir_fd=gfd)
        except BaseException:
            try:
                remove_tree_at(gfd, tmp)
            except OSError:
                pass
            raise
    finally:
        os.close(gfd)


def remove_generation(store, number):
    """Remove generations/NNNN, never following a symlink nor leaving generations/ (knob_fs.remove_tree_at)."""
    gfd = open_dir(store.gens)
    try:
        remove_tree_at(gfd, "%04d" % number)
    finally:
        os.close(gfd)


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
    aside = "%s.broken-%s" % (store.lock, secrets.token_hex(8))  # never a name built from input
    try:
        os.rename(store.lock, aside)
    except FileNotFoundError:
        return False
    try:
        os.unlink(aside)
    except IsADirectoryError:  # whatever sat there, it is out of the lock's way now
        try:
            os.rmdir(aside)
        except OSError:
            pass
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
    """Under this run's lock, no other run can be installing: every generation another run left 'installing'
    (its lock broken, or released by hand) becomes 'interrupted', so it never wedges the host."""
    marked = []
    for n in store.numbers():
        try:
            meta = store.meta(n)
        except (OSError, ValueError):
            continue
        if meta.get("status") == "installing" and meta.get("run_id") != p["run_id"]:
            if holder:
                why = "apply interrupted (lock of run %s broken by %s)" % (holder.get("run_id"), p["operator"])
            else:
                why = "apply of run %s never finished (found 'installing' with no lock held)" % meta.get("run_id")
            meta.update(status="interrupted", updated=now(), reason=why)
            store.write_meta(n, meta)
            marked.append(n)
    return marked


def inside(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_paths(module, p):
    """The serve script, the unit and the state dir are three different things: refuse, changing nothing, a
    script path that is the unit or lies in the state dir (its ledger, lock or generations), or whose name a
    generation dir uses for itself."""
    script, unit, state = p["script_path"], p["unit_path"], p["state_dir"]
    problems = []
    if os.path.normpath(script) == os.path.normpath(unit):
        problems.append("knob_serve_script_path %s is the unit file" % script)
    for key, path in (("knob_serve_script_path", script), ("the unit path", unit)):
        if inside(path, state) or inside(state, path):
            problems.append("%s %s lies in knobfleet's state dir %s (ledger, lock, generations)" % (key, path, state))
    name = os.path.basename(script)
    if name in RESERVED_NAMES or name == os.path.basename(unit):
        problems.append("knob_serve_script_path %s may not be named %s" % (script, name))
    if problems:
        module.fail_json(msg="%s; pick another path; nothing was changed" % problems[0], refused=True)


def package_unit(unit_path):
    """The path at which a package ships a unit of the serve unit's name (or, for an instance NAME@X.service, its
    template NAME@.service), or None. Checked with lstat only: whatever is there is never opened."""
    name = os.path.basename(unit_path)
    names = [name]
    stem, dot, suffix = name.rpartition(".")
    if dot and "@" in stem and not stem.endswith("@"):
        names.append("%s@.%s" % (stem.split("@", 1)[0], suffix))
    for base in PACKAGE_UNIT_DIRS:
        for candidate in names:
            path = os.path.join(base, candidate)
            if os.path.lexists(path):
                return path
    return None


def check_unit_name(module, store, p):
    """Refuse, before anything changes, to install a serve unit under a name the host's packages ship (ssh,
    nginx, ...): knobfleet's unit would take the place of the host's own service. A hand-written unit in the
    admin's directory (/etc/systemd/system) that no package ships is still adopted as generation 0. When the unit
    directory is itself a package directory, the file there is accepted only once knobfleet manages it."""
    found = package_unit(p["unit_path"])
    if found is None:
        return
    unit = p["unit_path"]
    if os.path.realpath(found) == os.path.realpath(unit) and store.numbers():
        return  # knob_serve_unit_dir is a package directory, and this very file is knobfleet's already
    service = os.path.basename(unit).rsplit(".service", 1)[0]
    earlier = ""
    if store.numbers() and os.path.lexists(unit) and os.path.realpath(found) != os.path.realpath(unit):
        earlier = " (an earlier apply installed %s: remove it and run systemctl daemon-reload)" % unit
    module.fail_json(msg="knob_serve_service %s names a unit the host's packages ship (%s): installing %s would "
                         "take the place of the host's own service and restart it; set knob_serve_service to a name "
                         "of the engine's own%s; nothing was changed" % (service, found, unit, earlier),
                     refused=True, package_unit=found)


def check_script_dir(module, p):
    """A script root runs must sit in directories only root can change, else any user who can write there
    runs code as root. Refused unless ``allow_writable_script_dir`` (host var
    knob_serve_allow_writable_script_dir), which turns it into a warning."""
    if (p.get("service_user") or "root") != "root":
        return None
    found = writable_by_others(p["script_path"])
    if found is None:
        return None
    text = ("%s, the directory of the serve script %s that root runs, is %s: any such user can run code as "
            "root" % (found[0], p["script_path"], found[1]))
    if not p.get("allow_writable_script_dir"):
        module.fail_json(msg="%s; make it root-only (chown root; chmod go-w) or set "
                             "knob_serve_allow_writable_script_dir: true; nothing was changed" % text, refused=True)
    module.warn(text)
    return text


def adopt_files(module, p):
    """What generation 0 stores: each managed file present, with mode, owner and group. Refused with one line,
    before a byte of it is read or shipped anywhere: a symlink in its path, and anything but a single-link
    regular file within the size bound (a FIFO, device, socket, directory, oversized file, or a hard link,
    which may be another file's content)."""
    files, present = [], {}
    for key, path in (("script", p["script_path"]), ("unit", p["unit_path"])):
        try:
            data, st = read_stat(path, single_link=True)
        except FileNotFoundError:
            continue
        except UnsafePath as exc:
            what = exc.filename if exc.filename and exc.filename != os.path.basename(path) else path
            return None, ("cannot adopt %s: %s %s; knobfleet manages single-link regular files only: replace it "
                          "with a regular file (or remove it) and apply again; nothing was changed"
                          % (path, what, exc.strerror))
        files.append((os.path.basename(path), data, 0o600))
        present[key] = {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "name": os.path.basename(path),
                        "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid}
    return (files, present), None


def check_ledger(module, store):
    """The ledger must be a regular file (or absent): anything else is refused before the lock is taken."""
    try:
        st = os.lstat(store.ledger)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        module.fail_json(msg="%s is %s; knobfleet appends its audit trail to a regular file only: move it away "
                             "and apply again; nothing was changed"
                             % (store.ledger, "hard-linked" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)),
                         refused=True)


def take_lock(module, store, p):
    entry = json.dumps({"run_id": p["run_id"], "operator": p["operator"], "since": now(),
                        "controller": p["controller"]}).encode()
    try:
        fd = os.open(store.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        other = lock_holder(store) or {}
        module.fail_json(msg="locked by %s (run %s) since %s from %s" % (
            other.get("operator"), other.get("run_id"), other.get("since"), other.get("controller")),
            lock=other, lock_held=True)
    try:
        try:
            view = memoryview(entry)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except BaseException:
        os.unlink(store.lock)  # a half-written lock would hold the host with nobody to release it
        raise


def begin(module, store, p):
    result = {"changed": False, "adopted": False}
    check_paths(module, p)
    if p["action"] == "install":  # a new unit is about to be installed (a restore's begin installs none)
        check_unit_name(module, store, p)
    warned = check_script_dir(module, p)
    if warned:
        result["warning"] = warned
    if p["foreign_dropins"] != "ignore":
        result["dropins"] = check_dropins(module, p)
    holder = lock_holder(store)
    if module.check_mode:
        result["lock"] = holder
        result["generation"] = store.current()
        return result
    store.ensure()
    check_ledger(module, store)
    if holder and holder.get("run_id") != p["run_id"]:
        if not p["break_lock"]:
            module.fail_json(
                msg="locked by %s (run %s) since %s from %s; if that applier was killed, break the lock "
                    "with --break-lock" % (holder.get("operator"), holder.get("run_id"), holder.get("since"),
                                           holder.get("controller")),
                lock=holder, lock_held=True)
        break_lock(store, p)
        result["broke_lock"] = holder
    took = not holder or holder.get("run_id") != p["run_id"]
    if took:
        take_lock(module, store, p)
        result["locked"] = True  # bookkeeping, not a change of the host's configuration
    adopting = False
    try:
        # Under this lock nobody else installs: an 'installing' generation is a dead run's, whether its lock was
        # broken just now or removed by hand.
        result["interrupted"] = mark_interrupted(store, p, result.get("broke_lock"))
        if result.get("broke_lock") or result["interrupted"]:
            store.append_ledger({"time": now(), "event": "lock-broken" if result.get("broke_lock") else "interrupted",
                                 "holder": result.get("broke_lock"), "run_id": p["run_id"],
                                 "operator": p["operator"], "interrupted": result["interrupted"]})
        if not store.numbers():
            adopted, why = adopt_files(module, p)
            if why:
                module.fail_json(msg=why, refused=True)
            files, present = adopted
            meta = {"generation": 0, "status": "adopted", "profile": None, "version": None, "hash": None,
                    "files": present, "created": now(), "updated": now(), "operator": p["operator"],
                    "run_id": p["run_id"], "reason": "files found before knobfleet's first apply"}
            adopting = True
            store_generation(store, 0, files, meta)
            store.switch_current(0)
            store.append_ledger({"time": now(), "event": "adopt", "generation": 0, "status": "adopted",
                                 "files": sorted(present), "run_id": p["run_id"], "operator": p["operator"]})
            result.update(changed=True, adopted=True)
        result["generation"] = store.current()
    except BaseException:
        # Nothing of this begin may outlive its failure: no half adoption, and no lock nobody will release.
        if adopting:
            for undo in (lambda: store.unswitch(0, None), lambda: remove_generation(store, 0)):
                try:
                    undo()
                except (OSError, ValueError):
                    pass
        if took:
            try:
                release(module, store, p)
            except OSError:
                pass
        raise
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
    files_differ = not (same_content(p["script_path"], script, (mode, 0, gid))
                        and same_content(p["unit_path"], unit, (UNIT_MODE, 0, 0)))
    current = store.current()
    profile = p["profile"] or {}
    current_hash = None
    if current is not None:
        try:
            current_hash = store.meta(current).get("hash")
        except (OSError, ValueError):
            current_hash = None
    remove = foreign_dropins(p) if p["foreign_dropins"] == "remove" else []
    result = {"changed": False, "previous": current, "generation": current, "files_changed": files_differ,
              "script_sha256": want["script"], "unit_sha256": want["unit"], "dropins_removed": remove}
    staged_text = read(staged_script).decode("utf-8", "replace")  # the digest of a script holding a secret is keyed
    result["script_sha256"] = shown_digest(want["script"], redact_script(staged_text, p["secret"]) != staged_text,
                                           p.get("secret_key", ""))
    if not files_differ and current_hash == profile.get("hash") and not remove:
        acts, kinds = live_actions(p, script, unit)
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
    number = store.next_number()
    meta = {
        "generation": number, "status": "installing", "profile": profile.get("name"),
        "version": profile.get("version"), "hash": profile.get("hash"),
        "files": {"script": {"path": p["script_path"], "sha256": want["script"], "name": script_name,
                             "mode": mode, "uid": 0, "gid": gid},
                  "unit": {"path": p["unit_path"], "sha256": want["unit"], "name": unit_name, "mode": UNIT_MODE,
                           "uid": 0, "gid": 0}},
        "created": now(), "updated": now(), "operator": p["operator"], "run_id": p["run_id"],
        "previous": current, "reason": "", "engine": (p["engine"] or {}).get("name"),
        "ready_url": p["health_url"] or "", "dropins_removed": remove,
    }
    live = "none" if current is None else "%04d" % current
    try:
        store_generation(store, number, [(script_name, script, SCRIPT_MODE), (unit_name, unit, UNIT_MODE)], meta)
    except OSError as exc:
        module.fail_json(msg="cannot store generation %04d in %s: %s; free space there (or raise its quota) and "
                         "apply again; nothing was installed, generation %s is still live"
                         % (number, store.gens, exc.strerror or exc, live), errno=exc.errno)
    install_all(module, store, number, current, [
        (p["script_path"], script, mode, gid), (p["unit_path"], unit, UNIT_MODE, 0)], remove, [
        lambda: store.switch_current(number, keep_previous=True),
        lambda: store.append_ledger({"time": now(), "event": "apply", "generation": number, "previous": current,
                                     "profile": profile.get("name"), "version": profile.get("version"),
                                     "hash": profile.get("hash"), "status": "installing", "run_id": p["run_id"],
                                     "operator": p["operator"]})])
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


def install_all(module, store, number, current, files, remove, then=()):
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
        for undo in (lambda: store.unswitch(number, current), lambda: remove_generation(store, number)):
            try:
                undo()
            except (OSError, ValueError):
                pass
        if not isinstance(exc, (OSError, ValueError)):
            raise
        what = getattr(exc, "filename", None) or "a file"
        put = (" %s put back as it was;" % ", ".join(back)) if back else ""
        lost = (" could not put back %s (restore generation %s by hand);" % (", ".join(stuck), live_name(current))
                if stuck else "")
        module.fail_json(msg="cannot install generation %04d (%s: %s);%s%s generation %04d removed; generation %s "
                             "is still live" % (number, what, getattr(exc, "strerror", None) or exc, put, lost,
                                                number, live_name(current)),
                         errno=getattr(exc, "errno", None), rolled_back=True)
    inst.done()
    try:
        store.drop_previous()
    except OSError:
        pass


def live_name(current):
    return "none" if current is None else "%04d" % current


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
    try:
        pruned = prune(store, p["keep"]) if p["status"] == "good" else []
    except (OSError, ValueError):
        pruned = []  # cleanup must never fail an apply that worked
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
    """Keep the last ``keep`` good generations, generation 0, current and the previous good one; failed,
    rolled-back and interrupted generations older than the oldest kept good one go too. Never the only way
    back, and never what it cannot read: a generation whose meta.json is unreadable (a FIFO, bad JSON, not an
    object), still installing, or a symlink in generations/ stays. Removal never follows a link or leaves
    generations/ (knob_fs.remove_tree_at); one that fails is left and reported, not fatal."""
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
        if n in protect or n >= oldest_kept or st[n] not in PRUNABLE:
            continue
        try:
            remove_generation(store, n)
        except OSError:
            continue
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
        if not isinstance(f, dict):
            continue
        src = os.path.join(gen_dir, os.path.basename(str(f.get("name"))))
        try:
            data = read(src)
        except FileNotFoundError:
            module.fail_json(msg="generation %04d: %s was deleted; refusing to roll back to it; nothing changed"
                             % (target, src))
        except OSError as exc:
            module.fail_json(msg="generation %04d: %s is unreadable (%s); refusing to roll back to it; nothing "
                                 "changed" % (target, src, exc.strerror or exc))
        if hashlib.sha256(data).hexdigest() != f.get("sha256"):
            module.fail_json(msg="generation %04d: %s does not match its recorded sha256; refusing; nothing changed"
                             % (target, src))
        try:  # the mode, owner and group the file had (adopted files: what was found before knobfleet)
            access = [int(f["mode"]) if f.get("mode") is not None else mode, int(f.get("uid") or 0),
                      int(f.get("gid") or 0)]
        except (TypeError, ValueError):
            module.fail_json(msg="generation %04d: meta.json holds a bad mode/uid/gid for %s; nothing changed"
                             % (target, key))
        plan.append((f["path"], data, access[0] & 0o7777, access[1], access[2]))
    if module.check_mode:
        return {"changed": target != current, "generation": target, "previous": current}
    inst = Install()
    try:
        for dest, data, mode, uid, gid in plan:
            inst.put(dest, data, mode, uid, gid)
        store.switch_current(target, keep_previous=True)
    except BaseException as exc:
        back, stuck = inst.undo()
        try:
            store.unswitch(target, current)
        except (OSError, ValueError):
            pass
        if not isinstance(exc, (OSError, ValueError)):
            raise
        module.fail_json(msg="cannot restore generation %04d (%s: %s); %s; generation %s is still live" % (
            target, getattr(exc, "filename", None) or "a file", getattr(exc, "strerror", None) or exc,
            ("could not put back %s" % ", ".join(stuck)) if stuck else "nothing changed", live_name(current)),
            errno=getattr(exc, "errno", None))
    inst.done()
    try:
        store.drop_previous()
    except OSError:
        pass
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
        try:
            data = read(src)
        except OSError:
            continue
        if not fs_exists(path):
            write_atomic(path, data, 0o644)
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


def describe(step, exc, p):
    """One line for an unexpected error of ``step``: what, where, and that the host was left as it was."""
    if isinstance(exc, OSError):
        what = "%s: %s" % (exc.filename or p["state_dir"], exc.strerror or exc)
    else:
        what = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    return "%s failed: %s; this step's changes were undone" % (step, what)


def composite(names):
    """One module call for steps that always run back to back (each SSH round trip + module start costs ~0.45 s
    on a host; a real engine's restart waits on none of them): ``install`` is begin, stage and commit (no commit
    in check mode), ``finish`` marks the new generation good (when ``generation`` is given) and releases the
    lock. Each step's result is returned under ``steps``; a failing step fails the call with the earlier
    steps' results and ``failed_step``, so the caller knows, e.g., whether the lock was taken."""
    def run(module, store, p):
        steps = {}
        fail = module.fail_json
        current = {"name": names[0], "failing": False}

        def fail_with_steps(**kw):
            current["failing"] = True
            fail(steps=steps, failed_step=current["name"], **kw)

        module.fail_json = fail_with_steps
        try:
            for name in names:
                if (name == "commit" and module.check_mode) or (name == "mark" and p["generation"] is None):
                    continue
                current["name"] = name
                try:
                    steps[name] = HANDLERS[name](module, store, p)
                except Exception as exc:  # an OSError anywhere still names the step and returns the steps
                    if current["failing"]:
                        raise
                    module.fail_json(msg=describe(name, exc, p), errno=getattr(exc, "errno", None))
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
            allow_writable_script_dir=dict(type="bool", default=False),
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
    except (OSError, ValueError) as exc:
        module.fail_json(msg=describe(p["action"], exc, p), errno=getattr(exc, "errno", None))
    module.exit_json(step=p["action"], **result)


if __name__ == "__main__":
    main()
