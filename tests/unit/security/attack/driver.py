"""Runs one case's command line as ``python -m knobfleet`` does (``knobfleet._entry.main``), watched from inside by an
audit hook (``sys.addaudithook``), installed before knobfleet is imported:

- a connection (or datagram) to an address outside 127.0.0.0/8 and ::1, and a name lookup of anything but a loopback
  address or ``localhost``, is refused before it is made (nothing leaves the machine) and logged;
- a file opened for writing, or made, renamed, removed, linked or changed, outside the case's roots (pytest's temp
  dir) is refused and logged (the machine's own files are never touched).

The command line comes from a JSON file (``argv``): a value may hold what a shell cannot pass (NUL), as a caller of
``knobfleet.cli.main(argv)`` can. ``parse_only``: commands whose handler is replaced by one that returns 0 once the
line is parsed. Usage: ``python driver.py SPEC.json``."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import sys
import threading

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
ALLOWED = ("/dev/null", "/dev/tty")
PATH_EVENTS = {  # event: indexes of (path, dir_fd) pairs in its arguments
    "os.mkdir": ((0, 2),),
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.link": ((1, 3),),
    "os.truncate": ((0, None),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 4),),
    "os.mkfifo": ((0, 1),),
    "os.mknod": ((0, 2),),
    "shutil.rmtree": ((0, 1),),
}


def main() -> int:
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]  # this folder's modules are the harness's, not the command's
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    log_path: str = spec["log"]
    roots = tuple(os.path.realpath(r) + os.sep for r in spec["roots"])
    guard = threading.local()

    def note(kind: str, what: str) -> None:
        guard.busy = True
        try:
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, (json.dumps([kind, what]) + "\n").encode())
            os.close(fd)
        finally:
            guard.busy = False

    def loopback(host: object) -> bool:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        if not isinstance(host, str):
            return True  # AF_UNIX and the like
        if host in ("localhost", "localhost.localdomain", "", socket.gethostname()):
            return True
        try:
            return ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            return False

    def where(path: object, dir_fd: object) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        text = os.fsdecode(path) if isinstance(path, bytes | str) else os.fspath(path)  # type: ignore[arg-type]
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(text):
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        return os.path.realpath(text)

    def outside(real: str | None) -> bool:
        return real is not None and real not in ALLOWED and not (real + os.sep).startswith(roots)

    def hook(event: str, args: tuple[object, ...]) -> None:
        if getattr(guard, "busy", False):
            return
        if event in ("socket.connect", "socket.sendto"):
            sock, addr = args[0], args[1]
            inet = getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6) and isinstance(addr, tuple)
            if inet and not loopback(addr[0]):
                note("connect", f"{addr[0]}:{addr[1]}")
                raise OSError(errno.ENETUNREACH, "blocked by the attack harness: not a loopback address")
        elif event == "socket.getaddrinfo":
            if not loopback(args[0]):
                note("resolve", str(args[0]))
                raise socket.gaierror(socket.EAI_NONAME, "blocked by the attack harness: a name lookup")
        elif event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags > 0 and bool(flags & WRITE_FLAGS)
            )
            if writes:
                guard.busy = True
                try:
                    real = where(path, None)
                finally:
                    guard.busy = False
                if outside(real):
                    note("write", str(real))
                    raise PermissionError(errno.EACCES, "blocked by the attack harness: outside the temp dir", path)
        elif event in PATH_EVENTS:
            for i, fd_i in PATH_EVENTS[event]:
                guard.busy = True
                try:
                    real = where(args[i], args[fd_i] if fd_i is not None and fd_i < len(args) else None)
                finally:
                    guard.busy = False
                if outside(real):
                    note("write", f"{event} {real}")
                    raise PermissionError(errno.EACCES, "blocked by the attack harness: outside the temp dir")

    sys.addaudithook(hook)
    sys.dont_write_bytecode = True

    import knobfleet.cli as cli

    parse_only = [tuple(p) for p in spec.get("parse_only", [])]
    real_build = cli.build_parser

    def build(command: str | None = None):  # type: ignore[no-untyped-def]
        parser = real_build(command)
        for path in parse_only:
            p = parser
            for word in path:
                subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
                p = next((s.choices[word] for s in subs if word in s.choices), None)  # type: ignore[assignment]
                if p is None:
                    break
            if p is not None:
                p.set_defaults(func=lambda args: 0)
        return parser

    cli.build_parser = build  # type: ignore[assignment]
    sys.argv = ["knobfleet", *spec["argv"]]
    from knobfleet._entry import main as entry

    return entry()


if __name__ == "__main__":
    sys.exit(main())
