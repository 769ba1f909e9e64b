"""Readers of a host's state for one knobfleet-managed service: files, unit properties, the processes of
the unit's cgroup (knob_procfs), generations, lock, ledger, health and the engine's info endpoint (knob_http).
Standard library only; ``observe`` returns the probe document (schema_version 1) that the live-state rule
(knob_live) reads."""

from __future__ import annotations

import errno
import grp
import os
import pwd
import select
import stat
import time

from .knob_fs import (
    DIR_FLAGS,
    MAX_READ,
    entries,
    kind_of,
    open_dir,
    read_bounded,
    read_bounded_at,
    split,
)
from .knob_http import http_get, liveness
from .knob_lean import loads, sha256
from .knob_pkgmeta import engine_package, shadowed_unit
from .knob_procfs import unit_processes
from .knob_redact import (
    redact_argv,
    redact_env,
    redact_script,
    redact_tree,
    redact_unit,
    shown_digest,
)
from .knob_sdbus import PRIVATE, unit_properties

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` would cost every probe ~5 ms
    from typing import Any

# No json, hashlib or socket here (knob_lean's twins), and the secret rules come from knob_redact, not knob_live:
# the probe imports this file on every host for every drift, and those imports were a third of its host CPU. The
# engine's HTTP endpoints (knob_http) and the unit's processes in /proc (knob_procfs) are files of their own, and
# their callers import them from there.

MAX_CONTENT = 1024 * 1024  # text of a managed file kept in the document: all of it up to the read bound, so
# verify never skips the env and argv checks of a large script (a larger one is truncated: a file_changed)
PROPS = (  # in the order systemctl prints them (systemd's own: the Service interface's, then the Unit's)
    "Restart",
    "MainPID",
    "Result",
    "NRestarts",
    "ExecMainStartTimestamp",
    "ExecMainStartTimestampMonotonic",
    "ExecMainStatus",
    "ControlGroup",
    "ActiveState",
    "SubState",
    "FragmentPath",
    "DropInPaths",
    "UnitFileState",
    "NeedDaemonReload",
)
DROPIN_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system")


def file_info(path: str, dfd: int | None = None, name: str | None = None) -> dict[str, Any]:
    """What a managed file is: sha256, mode, owner, group, mtime, size, and its text when small. Nothing of a
    file's content is read, hashed or shipped unless it is a single-link regular file: a symlink (in the path
    too), FIFO, device or hard link (it may be another file's content) is reported as an ``error``."""
    try:
        if dfd is None:
            data, cut, st = read_bounded(path, single_link=False)  # a hard link is reported below, with its mode
        else:
            data, cut, st = read_bounded_at(dfd, name or os.path.basename(path), single_link=False)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    except OSError as exc:
        try:
            lst = os.stat(name or path, dir_fd=dfd, follow_symlinks=False) if dfd is not None else os.lstat(path)
            kind = "symlink" if stat.S_ISLNK(lst.st_mode) else "special file"
        except OSError:
            kind = "symlink"  # a symlinked directory on the way
        return {"path": path, "exists": True, "error": "%s: %s" % (kind, exc.strerror or exc)}
    if st.st_nlink > 1:
        return {
            "path": path,
            "exists": True,
            "error": "hard-linked: %d links, content not read" % st.st_nlink,
            "mode": "%04o" % (st.st_mode & 0o7777),
        }
    owner, group = _name_of(_USERS, pwd.getpwuid, st.st_uid), _name_of(_GROUPS, grp.getgrgid, st.st_gid)
    info: dict[str, Any] = {
        "path": path,
        "exists": True,
        "sha256": sha256(data).hexdigest() if not cut else None,
        "mode": "%04o" % (st.st_mode & 0o7777),
        "owner": owner,
        "group": group,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mtime": st.st_mtime,
        "size": st.st_size,
    }
    if cut:
        info["truncated"] = True
    elif len(data) <= MAX_CONTENT:
        info["content"] = data.decode("utf-8", "replace")
    else:
        info["content_omitted"] = True
    return info


_USERS: dict[int, str] = {}
_GROUPS: dict[int, str] = {}


def _name_of(known: dict[int, str], lookup: Any, ident: int) -> str:
    """A user's or group's name by ``lookup`` (its id as text when it has none), looked up once per probe: each
    lookup reads the passwd or group database again."""
    got = known.get(ident)
    if got is None:
        try:
            got = str(lookup(ident)[0])  # pw_name, gr_name
        except KeyError:
            got = str(ident)
        known[ident] = got
    return got


def parse_props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def run_output(argv: list[str], timeout: float) -> str:
    """The stdout of ``argv`` (found on PATH; stdin /dev/null, stderr dropped), bounded by ``timeout`` seconds
    (then killed: OSError). One fork, without importing subprocess (the probe's hot path: issue 29)."""
    rfd, wfd = os.pipe()
    try:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            actions = [
                (os.POSIX_SPAWN_DUP2, null, 0),
                (os.POSIX_SPAWN_DUP2, wfd, 1),
                (os.POSIX_SPAWN_DUP2, null, 2),
                (os.POSIX_SPAWN_CLOSE, rfd),
            ]
            pid = os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=actions)
        finally:
            os.close(null)
    except BaseException:
        os.close(rfd)
        os.close(wfd)
        raise
    os.close(wfd)
    chunks, deadline, killed = [], time.monotonic() + timeout, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                os.kill(pid, 9)
                killed = True
                break
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        os.waitpid(pid, 0)
    if killed:
        raise OSError(errno.ETIMEDOUT, "Command '%s' timed out after %g seconds" % (argv, timeout))
    return b"".join(chunks).decode("utf-8", "replace")


def unit_props(unit: str, private: str = PRIVATE) -> dict[str, str]:
    """The unit's ``PROPS`` as ``systemctl show`` prints them: asked of systemd over its private socket when this
    is root (knob_sdbus: no fork, ~0.6 ms instead of ~7), else, or whenever that reader is unsure of an answer,
    from ``systemctl show`` itself. Same dict either way."""
    if os.geteuid() == 0 and os.path.exists(private):
        try:
            got: dict[str, str] = unit_properties(unit, PROPS, 5.0, private)
            return got
        except Exception:  # any doubt: systemctl answers, as before
            pass
    try:
        out = run_output(["systemctl", "show", unit, "--property=" + ",".join(PROPS)], 10)
    except OSError as exc:
        return {"error": str(exc)}
    return parse_props(out)


def read_json(path: str, limit: int = MAX_READ) -> Any:
    data, cut, _st = read_bounded(path, limit)
    if cut:
        raise ValueError("larger than %d bytes" % limit)
    return loads(data.decode("utf-8"))


def _open_dir_at(dfd: int | None, name: str) -> int:
    return os.open(name, DIR_FLAGS, dir_fd=dfd)


def generations(state_dir: str) -> dict[str, Any]:
    """The generations, ``current``, the lock and the ledger tail, read the way the module writes them: every
    directory through a descriptor opened without following a symlink, every walk by ``os.scandir`` on that
    descriptor (a symlinked generation is reported, never entered), every file bounded and non-blocking."""
    out: dict[str, Any] = {"exists": False, "current": None, "list": [], "errors": [], "lock": None}
    gens = os.path.join(state_dir, "generations")
    try:
        sfd = open_dir(state_dir)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            out["errors"].append("%s: %s" % (state_dir, exc.strerror or exc))
        out["ledger"] = []
        return out
    try:
        out["exists"] = True
        try:
            target = os.readlink("current", dir_fd=sfd)
        except FileNotFoundError:
            target = None
        except OSError as exc:  # EINVAL: there, but not a symlink (a hand-made file or folder)
            target = None
            out["current_error"] = "current is not a link to a generation (%s)" % (exc.strerror or exc)
        if target is not None:
            name = os.path.basename(target.rstrip("/"))
            if target.startswith("generations/") and name.isdigit() and "/" not in target[len("generations/") :]:
                out["current"] = int(name)
            else:
                out["current_error"] = "current points to %r, not to a generation" % target[:120]
        try:
            gfd: int | None = _open_dir_at(sfd, "generations")
        except FileNotFoundError:
            gfd = None
        except OSError as exc:
            out["errors"].append("%s: %s" % (gens, exc.strerror or exc))
            gfd = None
        if gfd is not None:
            try:
                _list_generations(gfd, gens, out)
            finally:
                os.close(gfd)
        out["ledger"] = ledger_tail_at(sfd, "ledger.jsonl")
        try:
            lock = _read_json_at(sfd, "lock", 64 * 1024)
            out["lock"] = lock if isinstance(lock, dict) else {"corrupt": "not a JSON object"}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            out["lock"] = {"corrupt": str(exc)}
    finally:
        os.close(sfd)
    return out


def _list_generations(gfd: int, gens: str, out: dict[str, Any]) -> None:
    cur = out["current"]
    for name, is_dir in entries(gfd):
        if not name.isdigit() or not name.isascii():
            continue
        where = os.path.join(gens, name)
        if not is_dir:
            out["errors"].append("%s: not a directory (a symlink or a file); not a generation" % where)
            continue
        try:
            dfd = _open_dir_at(gfd, name)
        except OSError as exc:
            out["errors"].append("%s: %s" % (where, exc.strerror or exc))
            continue
        try:
            listing = entries(dfd)
            entry: dict[str, Any] = {"generation": int(name), "files": [n for n, _ in listing]}
            try:
                meta = _read_json_at(dfd, "meta.json")
                if not isinstance(meta, dict):
                    raise ValueError("not a JSON object")
                entry["meta"] = meta
            except (OSError, ValueError) as exc:
                out["errors"].append("%s/meta.json: %s" % (where, exc))
            out["list"].append(entry)
            if cur is not None and int(name) == cur:
                out["current_files"] = {
                    n: file_info(os.path.join(where, n), dfd, n) for n, d in listing if n != "meta.json" and not d
                }
        finally:
            os.close(dfd)
    if cur is not None:
        out.setdefault("current_files", {})


def _read_json_at(dfd: int, name: str, limit: int = MAX_READ) -> Any:
    data, cut, _st = read_bounded_at(dfd, name, limit)
    if cut:
        raise ValueError("larger than %d bytes" % limit)
    return loads(data.decode("utf-8"))


def ledger_tail(path: str, max_bytes: int = 128 * 1024) -> list[dict[str, Any]]:
    """``ledger_tail_at`` of an absolute path."""
    parent, name = split(path)
    try:
        dfd = open_dir(parent)
    except OSError:
        return []
    try:
        return ledger_tail_at(dfd, name, max_bytes)
    finally:
        os.close(dfd)


def ledger_tail_at(dfd: int, name: str, max_bytes: int = 128 * 1024) -> list[dict[str, Any]]:
    """The newest ledger entries (bounded), oldest first; unreadable lines are reported, not hidden. The ledger
    is opened ``O_NONBLOCK`` and must be a regular file: a FIFO there is one ``unreadable`` entry, never a wait."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [{"event": "unreadable", "raw": "ledger: %s" % (exc.strerror or exc)}]
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return [{"event": "unreadable", "raw": "ledger is %s, not a regular file" % kind_of(st.st_mode)}]
        if st.st_nlink > 1:  # it may be another file's content (a root-only one): shown by nobody
            return [{"event": "unreadable", "raw": "ledger has %d hard links, not read" % st.st_nlink}]
        size = st.st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, max_bytes, start)
    except OSError as exc:
        return [{"event": "unreadable", "raw": "ledger: %s" % (exc.strerror or exc)}]
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]
    out: list[dict[str, Any]] = []
    for line in lines:
        if line.strip():
            try:
                entry = loads(line)
                out.append(entry if isinstance(entry, dict) else {"event": "unreadable", "raw": str(entry)[:200]})
            except ValueError:
                out.append({"event": "unreadable", "raw": line[:200].decode("utf-8", "replace")})
    return out


def dropins(unit: str) -> list[dict[str, Any]]:
    out = []
    for base in DROPIN_DIRS:  # what glob("BASE/UNIT.d/*.conf") lists (hidden names excluded), without importing it
        where = "%s/%s.d" % (base, unit)
        try:
            names = os.listdir(where)
        except OSError:
            continue
        for name in sorted(n for n in names if n.endswith(".conf") and not n.startswith(".")):
            out.append(file_info("%s/%s" % (where, name)))
    return out


def redact(doc: dict[str, Any], secret: Any, key: str = "") -> dict[str, Any]:
    """Secret values never leave the host (module_utils/knob_live, the one notion of a secret): each process's
    secret env vars and secret flags of its command line, the engine's report, the serve script (installed and
    stored: every secret assignment and flag, whole), the unit and drop-ins (Environment=, Exec*=,
    SetCredential=) become markers, keyed with the fleet's ``key``; the digest of a file that holds one, and of
    the current generation's record of it, becomes a keyed digest (knob_redact.shown_digest)."""
    for proc in doc.get("processes") or []:
        proc["env"] = redact_env(proc.get("env") or {}, secret, key)
        proc["cmdline"] = redact_argv(proc.get("cmdline") or [], secret, key)
    doc["server_info"] = redact_tree(doc.get("server_info"), secret, key)
    files = doc.get("files") or {}
    stored = ((doc.get("generations") or {}).get("current_files") or {}).items()
    units = [files.get("unit") or {}, *(doc.get("dropins") or [])]
    units += [f for name, f in stored if name.endswith((".service", ".conf"))]
    scripts = [files.get("script") or {}] + [f for name, f in stored if not name.endswith((".service", ".conf"))]
    for hide, group in ((redact_script, scripts), (redact_unit, units)):
        for f in group:
            if isinstance(f.get("content"), str):
                shown = hide(f["content"], secret, key)
                f["sha256"] = shown_digest(f.get("sha256"), shown != f["content"], key)
                f["content"] = shown
    gens = doc.get("generations") or {}
    held = {name for name, f in stored if str(f.get("sha256", "")).startswith("hmac:")}
    for entry in gens.get("list") or []:
        meta = entry.get("meta") if isinstance(entry, dict) else None
        if isinstance(meta, dict) and entry.get("generation") == gens.get("current"):
            for f in (meta.get("files") or {}).values():
                if isinstance(f, dict):
                    f["sha256"] = shown_digest(f.get("sha256"), f.get("name") in held, key)
    return doc


def engine_version(path: str) -> str | None:
    """The engine's version from its package's version file (first line, 128 bytes at most), read like every
    host file (no symlink, no FIFO or device); None when it cannot be read. The ranks of one engine group must
    run the same version (live/groups.py)."""
    try:
        data, _, _ = read_bounded(path, 128)
    except OSError:
        return None
    line = data.decode("utf-8", "replace").splitlines()[0].strip() if data.strip() else ""
    return line or None


def observe(p: dict[str, Any]) -> dict[str, Any]:
    """The probe document for the options ``p`` (service, script_path, unit_path, state_dir, health_url,
    info_url, http_timeout_s, secret, secret_key). Read-only and bounded in time; secret values are hashed."""
    started = time.time()
    _USERS.clear()  # names are looked up once per document, never kept across a session's calls
    _GROUPS.clear()
    unit = p["service"] + ".service"
    props = unit_props(unit)
    procs = unit_processes(props.get("ControlGroup", ""))
    timeout = float(p.get("http_timeout_s") or 2.0)
    files = {"script": file_info(p["script_path"]), "unit": file_info(p["unit_path"])}
    from .knob_runtime import container_view

    runtime = container_view(files, props, timeout)
    if runtime is not None:  # the engine is the container's process tree, not the unit's (the client's)
        procs = runtime.pop("processes")
    health, _ = http_get(p.get("health_url") or "", timeout)
    info_status, info_raw = http_get(p.get("info_url") or "", timeout)
    server_info = None
    if info_status == 200 and info_raw:
        try:
            server_info = loads(info_raw)
        except ValueError:
            server_info = None
    doc = {
        "schema_version": 1,
        "service": p["service"],
        "unit": unit,
        "time": started,
        "files": files,
        "dropins": dropins(unit),
        "unit_props": props,
        "processes": procs,
        "generations": generations(p["state_dir"]),
        "health": health,
        "health_url": p.get("health_url") or "",
        "server_info": server_info,
    }
    if runtime is not None:
        doc["runtime"] = runtime
    shadowed = shadowed_unit(p["unit_path"], bool(doc["generations"].get("list")))
    if shadowed is not None:  # apply refuses this host, so plan says so (the key is there only then)
        doc["package_unit"] = shadowed
    if p.get("version_file"):  # only when asked: a probe without it keeps its document as it was
        doc["engine_version"] = engine_version(p["version_file"])
    try:  # before the secrets are hashed: it reads the script's exec line
        doc["engine_package"] = engine_package(doc, p)
    except Exception as exc:  # one field's bug must not cost the host its whole document
        doc["engine_package"] = {"error": "not read: %s" % exc}
    if p.get("liveness_url") and props.get("ActiveState") == "active" and health == 200:
        doc["liveness"] = liveness(p["liveness_url"], float(p.get("liveness_timeout_s") or 10.0))
    doc["probe_s"] = round(time.time() - started, 3)
    return redact(doc, p.get("secret") or (), p.get("secret_key") or "")
