"""The host transaction's refusals before anything changes: paths that overlap, a unit name the host's packages
ship, a serve script in a directory others can write to, a ledger that is not a regular file, a foreign drop-in,
and files generation 0 cannot adopt. Each one fails the module call (``fail_json`` with ``refused=True`` and the
one-line reason) or returns what begin records. Part of the host transaction (knob_store, knob_txn); standard
library only, imported by the roles' modules as ``ansible.module_utils.knob_guards``.
"""

from __future__ import annotations

import hashlib
import os
import stat

from .knob_fs import UnsafePath, kind_of, read_stat, writable_by_others
from .knob_observe import dropins
from .knob_pkgmeta import shadowed_unit
from .knob_rules import refusal
from .knob_shell import script_env_argv

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any

    from knobfleet.module_utils.knob_store import Module, Store

RESERVED_NAMES = ("meta.json", "dropins")  # names a generation dir uses for itself


def foreign_dropins(p: dict[str, Any]) -> list[str]:
    """Drop-ins of the unit on disk (loaded or not) that knobfleet did not write."""
    unit = os.path.basename(p["unit_path"])
    return [d["path"] for d in dropins(unit) if d.get("exists")]


def check_dropins(module: Module, p: dict[str, Any]) -> list[str]:
    """Refuse the host before anything changes when a foreign drop-in is present under policy fail; under
    remove, only drop-ins in the admin's directory can be moved away."""
    found = foreign_dropins(p)
    if not found or p["foreign_dropins"] == "ignore":
        return found
    if p["foreign_dropins"] == "fail":
        module.fail_json(msg=refusal([{"kind": "dropin_present", "path": found[0]}]), refused=True, dropins=found)
    admin = os.path.join(os.path.dirname(p["unit_path"]), os.path.basename(p["unit_path"]) + ".d")
    other = [d for d in found if os.path.dirname(d) != admin]
    if other:
        module.fail_json(
            msg="drop-in %s is not in %s, so knobfleet will not remove it; remove or mask it by hand"
            % (other[0], admin),
            refused=True,
            dropins=found,
        )
    return found


def inside(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_paths(module: Module, p: dict[str, Any]) -> None:
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


def check_unit_name(module: Module, store: Store, p: dict[str, Any]) -> None:
    """Refuse, before anything changes, to install a serve unit under a name the host's packages ship (ssh,
    nginx, ...): knobfleet's unit would take the place of the host's own service. A hand-written unit in the
    admin's directory (/etc/systemd/system) that no package ships is still adopted as generation 0. When the unit
    directory is itself a package directory, the file there is accepted only once knobfleet manages it."""
    unit = p["unit_path"]
    found = shadowed_unit(unit, bool(store.numbers()))  # a package directory's file knobfleet manages is its own
    if found is None:
        return
    service = os.path.basename(unit).rsplit(".service", 1)[0]
    earlier = ""
    if store.numbers() and os.path.lexists(unit) and os.path.realpath(found) != os.path.realpath(unit):
        earlier = " (an earlier apply installed %s: remove it and run systemctl daemon-reload)" % unit
    module.fail_json(
        msg="knob_serve_service %s names a unit the host's packages ship (%s): installing %s would "
        "take the place of the host's own service and restart it; set knob_serve_service to a name "
        "of the engine's own%s; nothing was changed" % (service, found, unit, earlier),
        refused=True,
        package_unit=found,
    )


def check_script_dir(module: Module, p: dict[str, Any]) -> str | None:
    """A script root runs must sit in directories only root can change, else any user who can write there
    runs code as root. Refused unless ``allow_writable_script_dir`` (host var
    knob_serve_allow_writable_script_dir), which turns it into a warning."""
    if (p.get("service_user") or "root") != "root":
        return None
    found = writable_by_others(p["script_path"])
    if found is None:
        return None
    text = "%s, the directory of the serve script %s that root runs, is %s: any such user can run code as root" % (
        found[0],
        p["script_path"],
        found[1],
    )
    if not p.get("allow_writable_script_dir"):
        module.fail_json(
            msg="%s; make it root-only (chown root; chmod go-w) or set "
            "knob_serve_allow_writable_script_dir: true; nothing was changed" % text,
            refused=True,
        )
    module.warn(text)
    return text


def adopt_files(
    module: Module, p: dict[str, Any]
) -> tuple[tuple[list[tuple[str, bytes, int]], dict[str, Any]] | None, str | None]:
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
            return None, (
                "cannot adopt %s: %s %s; knobfleet manages single-link regular files only: replace it "
                "with a regular file (or remove it) and apply again; nothing was changed" % (path, what, exc.strerror)
            )
        files.append((os.path.basename(path), data, 0o600))
        present[key] = {
            "path": path,
            "sha256": hashlib.sha256(data).hexdigest(),
            "name": os.path.basename(path),
            "mode": st.st_mode & 0o7777,
            "uid": st.st_uid,
            "gid": st.st_gid,
        }
    return (files, present), None


def check_ledger(module: Module, store: Store) -> None:
    """The ledger must be a regular file (or absent): anything else is refused before the lock is taken."""
    try:
        st = os.lstat(store.ledger)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        module.fail_json(
            msg="%s is %s; knobfleet appends its audit trail to a regular file only: move it away "
            "and apply again; nothing was changed"
            % (store.ledger, "hard-linked" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)),
            refused=True,
        )


INTERPRETERS = ("python", "bash", "sh", "dash", "perl", "node", "ruby")  # their first path argument is code too
# The launcher checks (gone, or changeable by another user) on: unit tests of the transaction, whose serve scripts
# launch fictional engines (/usr/bin/engine), turn them off; tests/unit/roles/test_knob_guards_launcher.py keeps them.
LAUNCHER_CHECKS = True


def exec_path_problem(path: str) -> str | None:
    """Why root must not run the file ``path`` (absolute): a part of it missing, or a file, folder or symlink on
    the way to it (every hop of every symlink followed) that a user other than root can change. None when only root
    can. The rules are ``writable_by_others``' (a sticky bit protects a folder's entries, not the folder's last)."""
    pending = [x for x in path.split("/") if x]
    walked, hops = "/", 0
    try:
        st = os.lstat("/")
    except OSError:
        return None
    while True:
        last = not pending
        if not stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                return "%s is owned by uid %d" % (walked, st.st_uid)
            guarded = stat.S_ISDIR(st.st_mode) and not last and st.st_mode & stat.S_ISVTX
            if st.st_mode & 0o002 and not guarded:
                return "%s is writable by every user (mode %04o)" % (walked, st.st_mode & 0o7777)
            if st.st_mode & 0o020 and st.st_gid != 0 and not guarded:
                return "%s is writable by group %d (mode %04o)" % (walked, st.st_gid, st.st_mode & 0o7777)
        if last:
            return None
        part = pending.pop(0)
        if part in (".", ".."):
            walked = os.path.dirname(walked) if part == ".." else walked
            st = os.lstat(walked)
            continue
        nxt = os.path.join(walked, part)
        try:
            st = os.lstat(nxt)
        except OSError:
            return "%s does not exist" % nxt
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                return "%s is a symlink owned by uid %d" % (nxt, st.st_uid)
            hops += 1
            if hops > 40:
                return "%s: too many levels of symlinks" % path
            target = os.readlink(nxt)
            pending = [x for x in target.split("/") if x] + pending
            if target.startswith("/"):
                walked = "/"
            st = os.lstat(walked)
            continue
        walked = nxt


def launcher_paths(script_text: str) -> list[str]:
    """The files a serve script runs: its exec's program, and the first argument of an interpreter when that is an
    absolute path (``python3 /opt/x/serve.py``)."""
    argv = script_env_argv(script_text)[1]
    if not argv:
        return []
    out = [argv[0]]
    name = os.path.basename(argv[0])
    if len(argv) > 1 and argv[1].startswith("/") and any(name.startswith(i) for i in INTERPRETERS):
        out.append(argv[1])
    return out


def check_launcher(module: Module, p: dict[str, Any], script_text: str, what: str) -> str | None:
    """Refuse, before anything stops, a serve script (``what``: "the new generation", "generation 0003") whose
    launcher is gone, or that root would run from a file another user can change (the launcher, a folder or a
    symlink on its path). ``allow_writable_script_dir`` turns the second into a warning."""
    if not LAUNCHER_CHECKS:
        return None
    for i, path in enumerate(launcher_paths(script_text)):
        if not path.startswith("/"):
            continue  # found through PATH when the engine starts, as the unit's environment says
        if i == 0 and not os.path.lexists(path):
            module.fail_json(
                msg="%s launches %s, which does not exist on this host (an install removed?); install it or name "
                "another launcher (knob_serve_launcher, knob_serve_launchers); nothing was changed" % (what, path),
                refused=True,
                launcher_missing=path,
            )
        if (p.get("service_user") or "root") != "root" or not os.path.lexists(path):
            continue
        found = exec_path_problem(path)
        if found is None:
            continue
        text = "%s launches %s as root, and %s: any such user can run code as root" % (what, path, found)
        if not p.get("allow_writable_script_dir"):
            module.fail_json(
                msg="%s; make it root-only (chown root; chmod go-w) or set knob_serve_allow_writable_script_dir: "
                "true; nothing was changed" % text,
                refused=True,
            )
        module.warn(text)
        return text
    check_image(module, script_text, what)
    return None


def check_image(module: Module, script_text: str, what: str) -> None:
    """A serve script that runs a container: its image must be on this host already, before anything stops (nothing
    is pulled during a restart: a pull is its own step, with its own error)."""
    from .knob_runtime import image_id, split_run_line

    run = split_run_line(script_env_argv(script_text)[1])
    if run is None:
        return
    found, why = image_id(run["runtime"], run["image"])
    if found is None:
        tool = run["runtime"]
        module.fail_json(
            msg="%s runs image %s, but %s: nothing is pulled during a restart; load it first (`%s load --input FILE`, "
            "or `%s pull REF` as a step of its own), then apply again; nothing was changed"
            % (what, run["image"], why, tool, tool),
            refused=True,
            image_missing=run["image"],
        )
    check_gpu(module, run)


def check_gpu(
    module: Module,
    run: dict[str, Any],
    smi: str = "/usr/bin/nvidia-smi",
    proc: str = "/proc/driver/nvidia/version",
    cdi_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi"),
) -> None:
    """On a GPU host, before anything stops: the image's CUDA version against what the loaded driver supports, the
    user-space driver against the kernel module, and every CDI spec against the loaded driver (knob_gpu). A host
    with neither /proc/driver/nvidia/version nor nvidia-smi is a CPU host: nothing is said."""
    import socket
    import subprocess

    from .knob_gpu import preflight, read_cdi_files, read_text
    from .knob_runtime import image_config

    proc_text = read_text(proc)
    smi_text = None
    if os.path.exists(smi):
        try:
            got = subprocess.run([smi], capture_output=True, timeout=15, check=False)
            smi_text = (got.stdout + got.stderr)[: 1 << 20].decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired) as exc:
            smi_text = "nvidia-smi: %s" % exc
    if not (proc_text or "").strip() and not (smi_text or "").strip():
        return
    config = image_config(run["runtime"], run["image"])
    labels = config.get("Labels") if isinstance(config.get("Labels"), dict) else None
    problems = preflight(
        socket.gethostname(),
        proc_text,
        smi_text,
        config.get("Env") or [],
        labels,
        read_cdi_files(cdi_dirs),
        run["image"],
    )
    if problems:
        module.fail_json(msg=problems[0], refused=True, gpu_preflight=problems)
