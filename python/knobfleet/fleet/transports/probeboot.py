"""The fast path's bootstrap on a host: run a module function from a byte-compiled bundle cached on the host.

Never imported on a host: the ssh transport sends this file's text as ``python3 -I -S -c TEXT ROOT DIGEST NAME FUNC
ARGS`` (probecache.command), after the text of module_utils/knob_lean.py (``loads``, ``dumps``, ``sha256``: json's and
hashlib's answers without their imports). Standard library only.

* ROOT: the cache directory (``<state root>/.probe``, root-only); DIGEST: the sha256 of the cached entry the
  controller believes the host holds (``-``: none); NAME, FUNC: the module and its function; ARGS: the call's options
  as JSON. On stdin: ``{"args": private options}``, and, when the controller sends it, the bundle (``utils`` and
  ``module``, transports.base.bundle).
* An entry is one file named by the sha256 of its bytes: a header naming this format and the host's python, then
  the marshalled code objects of the module and its module_utils. It is run only when it is a single-link regular
  file owned by this user, readable by nobody else, in a directory of the same kind, reached without following any
  symlink, and when its bytes hash to its name. Anything else is a miss; an entry that exists but fails a check is
  removed (``unlink`` never follows a link) and logged (stderr and syslog).
* On a miss with the bundle on stdin it is compiled, run and stored (random ``O_EXCL`` temp name in the directory's
  descriptor, 0400, fsync, rename); without it the bootstrap exits ``EXIT_MISS`` and the controller sends it.
* stderr gets one line ``knobfleet-probe-cache: EVENT [DIGEST] [why]`` before the function runs: ``hit DIGEST``,
  ``stored DIGEST``, ``replaced DIGEST why`` (a tampered entry was removed and a good one stored), ``miss why``,
  ``nocache why`` (could not cache; ran from the bundle). stdout is the function's JSON document, as base.BOOT
  prints it.
"""

from __future__ import annotations

import errno
import marshal
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (``typing`` costs a probe ~5 ms)
    from typing import Any

if __name__ != "__main__":  # imported on the controller; on a host knob_lean's text runs ahead of this file's
    from knobfleet.module_utils.knob_lean import dumps, loads, sha256

EXIT_MISS = 75  # EX_TEMPFAIL: no usable entry and no bundle on stdin
MARK = "knobfleet-probe-cache:"
MAX_ENTRY = 4 * 1024 * 1024
KEEP = 8  # entries kept per host (other knobfleet versions, other pythons)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def header() -> bytes:
    return ("knobfleet-probe 1 %x\n" % sys.hexversion).encode()


class Refused(Exception):
    """An entry or directory that must not be used: ``tampered`` (exists, fails a check) or a plain miss."""

    def __init__(self, why: str, tampered: bool = False) -> None:
        Exception.__init__(self, why)
        self.why, self.tampered = why, tampered


def log(message: str) -> None:
    """A cache event worth an operator's eyes: stderr and the host's syslog."""
    sys.stderr.write("knobfleet-probe: %s\n" % message)
    try:
        import syslog

        syslog.openlog("knobfleet-probe", 0, syslog.LOG_AUTH)
        syslog.syslog(syslog.LOG_WARNING, message)
    except (ImportError, OSError):
        pass


def walk(path: str, create: bool = False) -> int:
    """A descriptor of directory ``path`` reached from ``/`` without following a symlink; missing components are
    made 0700 when ``create``."""
    parts = [p for p in path.split("/") if p]
    if not path.startswith("/") or any(p in (".", "..") for p in parts):
        raise Refused("%s: not a plain absolute path" % path)
    fd = os.open("/", DIR_FLAGS)
    try:
        for part in parts:
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused("%s: a symlink or not a directory on the way" % path, True) from None
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def private(st: os.stat_result, what: str) -> None:
    """Refuse what this user does not own or others may read or write."""
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise Refused(
            "%s: owned by uid %d, mode %04o (want uid %d, no access for others)"
            % (what, st.st_uid, st.st_mode & 0o7777, os.geteuid()),
            True,
        )


def load(root: str, digest: str) -> Any:
    """The code of entry ``digest`` under ``root``, checked (see the module docstring); Refused otherwise."""
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise Refused("not a digest: %r" % digest[:80])
    try:
        dfd = walk(root)
    except FileNotFoundError:
        raise Refused("no cache directory") from None
    try:
        private(os.fstat(dfd), root)
        try:
            fd = os.open(digest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            raise Refused("no entry %s" % digest) from None
        except OSError as exc:  # ELOOP: a symlink; ENXIO: a socket; ...
            raise Refused("entry %s: %s" % (digest, exc.strerror), True) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > MAX_ENTRY:
                raise Refused(
                    "entry %s: not a single-link regular file of at most %d bytes" % (digest, MAX_ENTRY), True
                )
            private(st, "entry %s" % digest)
            chunks, size = [], 0
            while size <= MAX_ENTRY:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        got = sha256(data).hexdigest()
        if got != digest:
            raise Refused("entry %s: its content hashes to %s" % (digest, got), True)
    except Refused as exc:
        if exc.tampered:
            try:
                os.unlink(digest, dir_fd=dfd)  # never follows a link; a directory there stays (EISDIR)
            except OSError:
                pass
        raise
    finally:
        os.close(dfd)
    head = header()
    if not data.startswith(head):
        raise Refused("entry %s: written by another python or format" % digest)
    return marshal.loads(data[len(head) :])


def compile_bundle(body: dict[str, Any], name: str) -> Any:
    utils = [(n, compile(s, n, "exec")) for n, s in body["utils"]]
    return (utils, compile(body["module"], name, "exec"))


def store(root: str, code: Any) -> str:
    """Write ``code`` as an entry under ``root`` (made 0700 under a root-only state root); its digest."""
    parent, _, leaf = root.rstrip("/").rpartition("/")
    pfd = walk(parent or "/", create=True)
    try:
        st = os.fstat(pfd)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise Refused("%s: writable by others (mode %04o, uid %d)" % (parent, st.st_mode & 0o7777, st.st_uid))
        try:
            os.mkdir(leaf, 0o700, dir_fd=pfd)
        except FileExistsError:
            pass
        try:
            dfd = os.open(leaf, DIR_FLAGS, dir_fd=pfd)
        except OSError as exc:
            raise Refused("%s: %s" % (root, exc.strerror), True) from None
    finally:
        os.close(pfd)
    try:
        private(os.fstat(dfd), root)
        data = header() + marshal.dumps(code)
        digest = str(sha256(data).hexdigest())
        tmp = ".%s.tmp" % os.urandom(8).hex()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, 0o400)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, digest, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
        prune(dfd, digest)
        return digest
    finally:
        os.close(dfd)


def prune(dfd: int, keep: str) -> None:
    """Keep the ``KEEP`` newest entries; remove older ones and leftover temp files (never following a link)."""
    with os.scandir(dfd) as it:
        found = [(e.stat(follow_symlinks=False).st_mtime, e.name) for e in it if e.name != keep]
    entries = sorted((t, n) for t, n in found if not n.startswith("."))
    old = [n for _t, n in entries[: max(0, len(entries) - (KEEP - 1))]] + [n for _t, n in found if n.startswith(".")]
    for name in old:
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass


def function(code: Any, name: str, func: str) -> Any:
    """The module's ``func``, its module_utils registered as ``ansible.module_utils.*`` first (as base.BOOT)."""
    utils, module_code = code
    for n, c in utils:
        u = type(sys)("ansible.module_utils." + n)
        u.__package__ = "ansible.module_utils"  # their imports of each other are relative (``from .knob_x``)
        sys.modules[u.__name__] = u
        exec(c, u.__dict__)
    m = type(sys)(name)
    exec(module_code, m.__dict__)
    return getattr(m, func)


def run(code: Any, name: str, func: str, args: dict[str, Any]) -> Any:
    """``func(args)`` of the module (``function``)."""
    return function(code, name, func)(args)


def obtain(root: str, digest: str, body: dict[str, Any], name: str) -> tuple[Any, str]:
    """The code to run and the cache event line (``MARK`` and what follows); Refused when there is no bundle."""
    why, tampered = "", False
    if digest != "-":
        try:
            return load(root, digest), "hit %s" % digest
        except Refused as exc:
            why, tampered = exc.why, exc.tampered
            if tampered:
                log("cached probe %s under %s refused and removed, never run: %s" % (digest, root, why))
        except (OSError, ValueError, EOFError, TypeError) as exc:  # unreadable, or marshal refused it
            why = "entry %s: %s" % (digest, exc)
    if "module" not in body:
        raise Refused(why or "no entry", tampered)
    code = compile_bundle(body, name)
    try:
        stored = store(root, code)
    except Refused as exc:
        if exc.tampered:
            log("probe cache %s refused, nothing cached: %s" % (root, exc.why))
        return code, "nocache %s" % exc.why
    except OSError as exc:
        return code, "nocache %s: %s" % (root, exc.strerror or exc)
    return code, ("replaced %s %s" % (stored, why)) if tampered else ("stored %s" % stored)


def read_line(fd: int, pending: bytearray, idle_s: float) -> bytes | None:
    """The next ``\n``-ended line of ``fd`` (without it), or None at end of input or after ``idle_s`` seconds
    without one (the controller went away: the session ends)."""
    import select

    while b"\n" not in pending:
        if not select.select([fd], [], [], idle_s)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line


def serve(code: Any, name: str, func: str, args: dict[str, Any], idle_s: float, pending: bytearray) -> int:
    """Session mode (``drift --watch``): the module is set up once, then every line on stdin is one call,
    ``func(args)`` with that line's JSON object over ``args``, answered by one line on stdout (the same document
    a one-shot call prints). Ends at end of input, or after ``idle_s`` seconds without a request."""
    fn = function(code, name, func)
    while True:
        line = read_line(0, pending, idle_s)
        if line is None:
            return 0
        call_args = dict(args)
        call_args.update(loads(line) if line.strip() else {})
        sys.stdout.write(dumps(fn(call_args)) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    """``ROOT DIGEST NAME FUNC ARGS`` runs once (stdin: the options and maybe the bundle, to its end);
    ``... serve IDLE_S`` keeps serving (stdin: that first document on one line, then one line per call)."""
    root, digest, name, func, args_json = argv[:5]
    session, pending = argv[5:6] == ["serve"], bytearray()
    raw = (read_line(0, pending, float(argv[6])) or b"") if session else sys.stdin.buffer.read()
    body = loads(raw) if raw.strip() else {}
    try:
        code, event = obtain(root, digest, body, name)
    except Refused as exc:
        sys.stderr.write("%s miss %s%s\n" % (MARK, "tampered: " if exc.tampered else "", exc.why))
        return EXIT_MISS
    sys.stderr.write("%s %s\n" % (MARK, event))
    sys.stderr.flush()
    args = loads(args_json)
    args.update(body.get("args") or {})
    if session:
        return serve(code, name, func, args, float(argv[6]), pending)
    sys.stdout.write(dumps(run(code, name, func, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
