"""A passenger session through a running OpenSSH ControlMaster, without starting an ``ssh`` client: the head start
of a one-shot read (headstart.py) opens each host's probe this way when the master Ansible and the fast path share
is up, and starts ``ssh`` as before when it is not.

Why: the ``ssh`` client a mux session would start costs ~5 ms of CPU and ~5 ms of latency per host before it says a
word to the master (its own start, OpenSSL, the config files); the master does all the work anyway. Here the
controller speaks the master's protocol (OpenSSH's PROTOCOL.mux, version 4) itself: one Unix-socket connection per
host, a ``MUX_C_NEW_SESSION`` carrying the remote command and the environment the client would send, then the
session's stdin, stdout and stderr handed over as descriptors (``SCM_RIGHTS``), exactly as ``ssh`` does.
``Passenger`` is the part of ``Popen`` the transport uses, as ``headstart.Spawned`` is.

What it may use, and why it is safe:

* Only what ``ssh -G`` said for the very argv the transport computed (``plan``): the control socket ``ssh`` itself
  would use, and ``SendEnv``/``SetEnv``. A host whose config asks for anything a plain passenger does not send (a
  TTY, agent or X11 forwarding, port forwards, a local command, a subsystem) gets the ``ssh`` client, as before.
* The answer is kept with the head start's record, with ``stamp``: the identity of the ssh config files. When any of
  them changed, nothing recorded is used (a ``Host`` block may now point the name elsewhere).
* The master must run as this user (``SO_PEERCRED``); anything else, or no master, is an ``OSError`` and the caller
  starts ``ssh``.

Standard library only, and nothing costly to import (``os``, ``sys``, ``_socket``): it runs before argparse."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs ~5 ms to import; only the type checker reads what follows
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

VERSION = 4
HELLO = 0x00000001
NEW_SESSION = 0x10000002
S_PERMISSION_DENIED = 0x80000002
S_FAILURE = 0x80000003
S_EXIT_MESSAGE = 0x80000004
S_SESSION_OPENED = 0x80000006
S_TTY_ALLOC_FAIL = 0x80000008
NO_ESCAPE = 0xFFFFFFFF
MAX_FRAME = 256 * 1024  # the master's replies are a few bytes; anything larger is not a master
LOST = 255  # what ``ssh`` exits with when the connection fails or the master hangs up without an exit status
KILLED = -9  # ``Popen.returncode`` of a process ended by SIGKILL: what ``kill`` leaves

# ``ssh -G`` keys, each with the values (as ``ssh -G`` prints them) under which ``ssh`` asks for no more than a plain
# session; any other value asks for more (a TTY, forwarding, a local command, another session type, a tunnel).
# "requesttty true" (RequestTTY yes) allocates a TTY only when stdin is a terminal, which a probe's never is.
PLAIN = {
    "requesttty": ("auto", "false", "true"),
    "forwardagent": ("no",),
    "forwardx11": ("no",),
    "permitlocalcommand": ("no",),
    "sessiontype": ("default",),
    "stdinnull": ("no",),
    "forkafterauthentication": ("no",),
    "tunnel": ("false",),
}
# keys ``ssh -G`` prints only when set, any of which asks for more (a RemoteCommand makes ``ssh`` refuse a command)
NEVER = ("localforward", "remoteforward", "dynamicforward", "remotecommand")


def _u32(v: int) -> bytes:
    return v.to_bytes(4, "big")


def _string(b: bytes) -> bytes:
    return _u32(len(b)) + b


def frame(body: bytes) -> bytes:
    return _u32(len(body)) + body


def request(command: str, env: Sequence[str]) -> bytes:
    """The client's hello and its new-session request: no TTY, no forwarding, no escape character, ``command`` and
    ``env`` (``NAME=value`` strings). Pure."""
    body = _u32(NEW_SESSION) + _u32(1) + _string(b"") + _u32(0) * 4 + _u32(NO_ESCAPE) + _string(b"")
    body += _string(command.encode("utf-8", "surrogateescape"))
    body += b"".join(_string(e.encode("utf-8", "surrogateescape")) for e in env)
    return frame(_u32(HELLO) + _u32(VERSION)) + frame(body)


class ProtocolError(Exception):
    """What the socket said is not the mux protocol."""


def split_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole frames at the start of ``buf`` as (type, body after the type), and the bytes left over. Pure."""
    out: list[tuple[int, bytes]] = []
    at = 0
    while len(buf) - at >= 4:
        n = int.from_bytes(buf[at : at + 4], "big")
        if n < 4 or n > MAX_FRAME:
            raise ProtocolError(f"a frame of {n} bytes")
        if len(buf) - at - 4 < n:
            break
        body = buf[at + 4 : at + 4 + n]
        out.append((int.from_bytes(body[:4], "big"), body[4:]))
        at += 4 + n
    return out, buf[at:]


def _reason(body: bytes) -> str:
    """The reason string of a refusal (request id, then the string)."""
    n = int.from_bytes(body[4:8], "big") if len(body) >= 8 else 0
    return body[8 : 8 + n].decode("utf-8", "replace")


def plan(g_output: str) -> tuple[str, list[str], list[str]] | None:
    """From ``ssh -G``'s output for a host: (its control socket, its SendEnv patterns, its SetEnv entries), or None
    when a passenger session would not be what ``ssh`` sends (no control path, or ``PLAIN``/``NEVER`` say it asks for
    more). Pure."""
    path = ""
    send: list[str] = []
    setenv: list[str] = []
    for line in g_output.splitlines():
        key, _, value = line.strip().partition(" ")
        key = key.lower()
        if key == "controlpath":
            path = value
        elif key == "sendenv":
            send += value.split()
        elif key == "setenv":
            setenv.append(value)  # one entry a line, its value may hold spaces (SetEnv FOO="a b")
        elif key in NEVER or (key in PLAIN and value not in PLAIN[key]):
            return None
    if not path.startswith("/"):  # "none", or no control path at all
        return None
    return path, send, setenv


def matches(pattern: str, name: str) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` any run of characters, ``?`` any one; nothing else is special. Pure."""
    p = n = 0
    star, mark = -1, 0
    while n < len(name):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == name[n]):
            p += 1
            n += 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, n
            p += 1
        elif star >= 0:
            p, mark = star + 1, mark + 1
            n = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def environment(send: Sequence[str], setenv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The ``NAME=value`` strings ``ssh`` puts in a new session: the variables of ``environ`` a SendEnv pattern
    names (a ``-pattern`` takes them out again, as in ssh_config), then the SetEnv entries. Pure."""
    keep = [p for p in send if not p.startswith("-")]
    drop = [p[1:] for p in send if p.startswith("-")]
    out = [
        f"{k}={v}"
        for k, v in environ.items()
        if any(matches(p, k) for p in keep) and not any(matches(p, k) for p in drop)
    ]
    return out + list(setenv)


def homes() -> list[str]:
    """Where ``~/.ssh/config`` may be: ``ssh`` reads the user's home from the password database, which ``$HOME``
    may not be (``sudo`` keeps it on some systems); both are watched."""
    found = [os.path.expanduser("~")]
    try:
        import pwd

        found.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    return list(dict.fromkeys(found))


def config_files(argv: Sequence[str], home: Sequence[str]) -> list[str]:
    """The ssh config files that decide what ``argv`` reaches: ``-F FILE`` if given (``ssh`` then reads no other),
    else ``.ssh/config`` in each of ``home``, ``/etc/ssh/ssh_config`` and ``/etc/ssh/ssh_config.d``'s files. Pure."""
    for i, a in enumerate(argv[:-1]):
        if a == "-F":
            return [argv[i + 1]]
        if a.startswith("-F") and len(a) > 2:
            return [a[2:]]
    return [*(os.path.join(h, ".ssh", "config") for h in home), "/etc/ssh/ssh_config", "/etc/ssh/ssh_config.d"]


def stamp(argv: Sequence[str], home: Sequence[str]) -> str:
    """The identity (inode, size, change time) of each config file ``argv`` reads, and of each file in a config
    folder: when any changes, what ``ssh -G`` said before is not used."""
    parts = []
    for path in config_files(argv, home):
        names = [path]
        try:
            if os.path.isdir(path):
                names += sorted(os.path.join(path, n) for n in os.listdir(path))
        except OSError:
            pass
        for name in names:
            try:
                st = os.stat(name)
                parts.append(f"{name}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
            except OSError:
                parts.append(f"{name}:-")
    return "\n".join(parts)


class Passenger:
    """A session opened through the master at ``path``: ``command`` run with ``env``, ``data`` on its stdin (written
    and closed). ``OSError`` when there is no master there, or it is not this user's; the part of ``Popen`` the
    transport uses (``args``, ``returncode``, ``poll``, ``kill``, ``wait``, ``communicate``, ``stdout``)."""

    def __init__(self, path: str, command: str, env: Sequence[str], data: bytes, argv: list[str]) -> None:
        import _socket

        self.args = argv
        self.returncode: int | None = None
        self._buf = b""
        self._opened = False
        self._killed = False
        self._busy = False  # a thread is inside _finish
        self._status: int | None = None  # the exit message's, final once the master hangs up
        self._why = ""
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        fds: list[int] = []
        try:
            sock.connect(path)
            creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
            uid = int.from_bytes(creds[4:8], sys.byteorder)
            if uid != os.geteuid():
                raise PermissionError(f"{path}: the master runs as uid {uid}")
            for _ in range(3):
                fds += os.pipe()
            r_in, w_in, r_out, w_out, r_err, w_err = fds
            sock.sendall(request(command, env))
            for fd in (r_in, w_out, w_err):  # stdin, stdout, stderr, in that order, one per message
                sock.sendmsg([b"\0"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))])
        except OSError:
            sock.close()
            for fd in fds:
                os.close(fd)
            raise
        for fd in (r_in, w_out, w_err):  # the master holds its own copies now
            os.close(fd)
        self._sock = sock
        self.stdout = os.fdopen(r_out, "rb", buffering=0)
        self.stderr = os.fdopen(r_err, "rb", buffering=0)
        try:
            view = memoryview(data)
            while view:  # a payload larger than the pipe's buffer waits for the master to read it
                view = view[os.write(w_in, view) :]
        except BrokenPipeError:
            pass  # the master dropped the session; its status says why
        finally:
            os.close(w_in)

    def _read(self, block: bool) -> bool:
        """Take what the master said (waiting for it when ``block``). The session ends when the master hangs up, not
        at its exit message: sshd sends the exit status when the command exits and forwards output still in its pipes
        after it, which the master drops for a passenger that has hung up (``mux_master_control_cleanup_cb``); ``ssh``
        itself reads on to EOF. EOF without an exit status is ``LOST``. False: nothing was there (not blocking)."""
        import _socket

        try:
            chunk = self._sock.recv(4096) if block else self._sock.recv(4096, _socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._end(LOST if self._status is None else self._status)
            return True
        try:
            frames, self._buf = split_frames(self._buf + chunk)
        except ProtocolError as exc:
            self._why = f"not an ssh master: {exc}"
            self._end(LOST)
            return True
        for kind, body in frames:
            if kind in (S_PERMISSION_DENIED, S_FAILURE):
                self._why = _reason(body)
                self._end(LOST)
            elif kind == S_EXIT_MESSAGE and len(body) >= 8:
                self._status = int.from_bytes(body[4:8], "big")
            elif kind == HELLO and int.from_bytes(body[:4], "big") != VERSION:
                self._why = f"mux protocol {int.from_bytes(body[:4], 'big')}, not {VERSION}"
                self._end(LOST)
            elif kind == S_SESSION_OPENED:
                self._opened = True
        return True

    def _end(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._sock.close()  # a closed socket object's fileno is -1: a later shutdown or recv never reaches a reused one

    @property
    def refused(self) -> bool:
        """Ended before the master opened the session (it refused, or hung up): ``ssh`` itself would have made its own
        connection then, so the caller asks again by starting it."""
        return self.returncode == LOST and not self._opened

    def poll(self) -> int | None:
        """The exit status once the master has hung up, else None; it reads only when no other thread is inside
        ``communicate``/``wait`` (that one reads the socket then)."""
        while self.returncode is None and not self._busy and self._read(block=False):
            pass  # all that is there: an exit message and the hang-up after it end the session in one call
        return self.returncode

    def kill(self) -> None:
        """End the session, as SIGKILL ends ``ssh``: the master sees its passenger go and closes the channel; output
        not read yet is dropped. Safe from another thread than one in ``communicate``/``wait``: nothing is closed
        under it (the socket is shut down, which wakes it; it closes what it holds)."""
        if self.returncode is None:
            self.returncode = KILLED
        self._killed = True
        try:  # noqa: SIM105 (contextlib costs an import here)
            self._sock.shutdown(2)  # SHUT_RDWR; fails harmlessly on a socket already closed
        except OSError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        """The exit status once the master hangs up. As with ``Popen`` and pipes, output nobody reads can hold the
        session open (the master waits for room in the pipe): ``communicate`` reads it, ``kill`` drops it."""
        out = self._finish(timeout, drain=False)
        assert out is None and self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Both outputs to their end, then the exit status; ``subprocess.TimeoutExpired`` past ``timeout``."""
        got = self._finish(timeout, drain=True)
        assert got is not None
        return got

    def _finish(self, timeout: float | None, drain: bool) -> tuple[bytes, bytes] | None:
        self._busy = True
        try:
            return self._finish_reading(timeout, drain)
        finally:
            self._busy = False

    def _finish_reading(self, timeout: float | None, drain: bool) -> tuple[bytes, bytes] | None:
        """Read the socket to the master's hang-up and, with ``drain``, both outputs to their end; a ``kill`` (here or
        from another thread) stops it with what was read."""
        import select
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {}
        poller = select.poll()
        if drain:
            for f in (self.stdout, self.stderr):
                if not f.closed:
                    chunks[f.fileno()] = []
                    poller.register(f.fileno(), select.POLLIN)
        sock_fd = -1 if self.returncode is not None else self._sock.fileno()
        if sock_fd >= 0:
            poller.register(sock_fd, select.POLLIN)
        open_ = set(chunks) | ({sock_fd} if sock_fd >= 0 else set())
        while open_ and not self._killed:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            for fd, _ev in poller.poll(None if left is None else max(1, int(left * 1000))):
                if fd == sock_fd:
                    self._read(block=True)
                    if self.returncode is not None:
                        poller.unregister(fd)
                        open_.discard(fd)
                    continue
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_.discard(fd)
        if self.returncode is not None:
            self._sock.close()  # killed before the master hung up: nothing more is read from it
        if not drain:
            return None
        out, err = (b"".join(chunks.get(f.fileno(), [])) if not f.closed else b"" for f in (self.stdout, self.stderr))
        if self._why:
            err += f"knobfleet: ssh master: {self._why}\n".encode()
        self.stdout.close()
        self.stderr.close()
        return out, err
