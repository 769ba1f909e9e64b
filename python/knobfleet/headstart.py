"""The head start of a read-only command, before argparse and the heavy imports: the console script's entry
(``knobfleet._entry``) calls ``start(argv)`` first thing, and the ssh probes the same command line started last
time, in the same folder with the same environment, run a few milliseconds after the interpreter is up.

How a command line finds its probes: ``SshTransport.warm_up`` (which runs once the command has parsed its
arguments and found its inventory) calls ``remember``, which writes one record per command line under
``$KNOBFLEET_STATE_DIR/cache/headstart`` (else ``~/.cache/knobfleet/headstart``), named by ``recall_key``: the
digest of the folder, the arguments and the environment variables that change what they mean. The record holds
the speculative-start plan (each host's ssh argv) and the bytes each process reads on stdin; ``start`` launches
them. ``SshTransport.warm_up`` then ``take``\\ s them if the plan key it computed is the one they were started
for, and ``iter_function`` keeps each only if its argv is still the one the validated host vars give (else stops
it and starts it again), exactly as for the speculative start. Reads only, so a stale record costs a wasted probe,
never a wrong answer; whatever nobody took is stopped at exit.

Why so spare: this runs before anything else is imported, and each import before the first ``ssh`` delays every
host's answer (``subprocess`` and ``pathlib`` alone are ~15 ms each here). So: ``os`` and builtins only
(``marshal`` for the record, ``os.posix_spawnp`` for the processes: ``Spawned`` does what the transport needs of
a ``Popen``); the rest is imported when the command itself has loaded it anyway.
"""

from __future__ import annotations

import itertools
import marshal
import os

TYPE_CHECKING = False  # typing costs ~5 ms to import; only the type checker reads what follows
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from knobfleet.sshmux import Passenger

COMMANDS = ("drift", "verify")  # the read-only commands the entry starts probes for
# What changes which hosts a command line reads, or how it reaches them, besides the arguments and the folder.
ENV = (
    "KNOBFLEET_INVENTORY",
    "KNOBFLEET_LIMIT",
    "KNOBFLEET_VIA",
    "KNOBFLEET_FORKS",
    "KNOBFLEET_HOME",
    "KNOBFLEET_STATE_DIR",
    "KNOBFLEET_INVENTORY_CACHE",
    "ANSIBLE_INVENTORY",
    "ANSIBLE_CONFIG",
    "HOME",
)
SCHEMA = 3
# The fleet's secret key (fleet/fleetkey.py) travels in each probe's stdin; a record never holds it: it holds this
# in its place, and ``start`` puts the key back from the key's own file (owner-only) as it launches.
KEY_PLACEHOLDER = b"@@knobfleet-fleet-key@@"

STARTED: dict[str, tuple[list[str], Spawned | Passenger]] = {}
KEY: list[str | None] = [None]  # the plan key of what ``start`` launched
INVOCATION: list[str | None] = [None]  # this command line's recall key (None: not a command that starts early)


def _sha256(data: bytes) -> str:
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # 3.11
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment,unused-ignore]
    return str(sha256(data).hexdigest())


def recall_key(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
    """The digest naming this command line's record, or None when it is not one to start early (another command,
    --help, the playbook path, --watch, which keeps its own interpreters, or ``KNOBFLEET_HEADSTART=0``). Pure."""
    if not argv or argv[0] not in COMMANDS or env.get("KNOBFLEET_HEADSTART", "1") == "0":
        return None
    rest = list(argv[1:])
    if any(a in ("-h", "--help", "--watch") or a.startswith("--watch=") for a in rest):
        return None
    if "--via=ansible" in rest or any(a == "--via" and b == "ansible" for a, b in itertools.pairwise(rest)):
        return None
    parts = [cwd, *argv, "\0", *(f"{k}={env.get(k, chr(0))}" for k in ENV)]
    return _sha256("\n".join(parts).encode("utf-8", "surrogateescape"))[:32]


def folder(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    state = env.get("KNOBFLEET_STATE_DIR")
    if state:
        return os.path.join(os.path.abspath(state), "cache", "headstart")
    return os.path.join(os.path.expanduser("~"), ".cache", "knobfleet", "headstart")


class Spawned:
    """An ssh process started with ``os.posix_spawnp``, its stdin written and closed: the part of ``Popen`` the
    transport uses (``pid``, ``returncode``, ``poll``, ``kill``, ``wait``, ``communicate``, ``stdout``)."""

    def __init__(self, argv: list[str], data: bytes) -> None:
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        try:
            actions = [(os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1), (os.POSIX_SPAWN_DUP2, w_err, 2)]
            self.pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions)
        except OSError:
            for fd in (r_in, w_in, r_out, w_out, r_err, w_err):
                os.close(fd)
            raise
        for fd in (r_in, w_out, w_err):
            os.close(fd)
        self.args = argv
        self.returncode: int | None = None
        self.stdout: Any = os.fdopen(r_out, "rb", buffering=0)
        self.stderr: Any = os.fdopen(r_err, "rb", buffering=0)
        try:
            view = memoryview(data)
            while view:  # ssh reads its stdin at once; a payload larger than the pipe's buffer waits for it
                view = view[os.write(w_in, view) :]
        except BrokenPipeError:
            pass  # ssh already exited; its status says why
        finally:
            os.close(w_in)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.002)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            import signal

            try:  # noqa: SIM105 (contextlib costs an import here)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Both outputs to their end, then the exit status; ``subprocess.TimeoutExpired`` past ``timeout``."""
        import selectors
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {self.stdout.fileno(): [], self.stderr.fileno(): []}
        open_ = [f for f in (self.stdout, self.stderr) if not f.closed]
        with selectors.DefaultSelector() as sel:
            for f in open_:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    import subprocess

                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        sel.unregister(key.fileobj)
        out, err = (b"".join(chunks[f.fileno()]) if not f.closed else b"" for f in (self.stdout, self.stderr))
        self.stdout.close()
        self.stderr.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out, err


def start(argv: Sequence[str]) -> int:
    """Launch what this command line's record names; how many processes were started (0: none recorded)."""
    try:
        key = recall_key(argv, os.getcwd(), os.environ)
    except OSError:  # the working folder is gone
        return 0
    INVOCATION[0] = key
    if key is None:
        return 0
    try:
        raw = _read_record(os.path.join(folder(), f"recall-{key}"))
        if raw is None:
            return 0
        rec = marshal.loads(raw)
        if rec.get("schema") != SCHEMA:
            return 0
        pairs = [(str(h), [str(a) for a in args], bool(whole)) for h, args, whole in rec["pairs"]]
        full, short, plan_key = bytes(rec["full"]), bytes(rec["short"]), str(rec["plan_key"])
        if KEY_PLACEHOLDER in full or KEY_PLACEHOLDER in short:
            fleet = _read_key(str(rec["key_file"]))
            if fleet is None:
                return 0
            full, short = full.replace(KEY_PLACEHOLDER, fleet), short.replace(KEY_PLACEHOLDER, fleet)
        mux = _mux_of(rec, pairs) if os.environ.get("KNOBFLEET_SSH_MUX", "1") != "0" else {}  # 0: ssh clients only
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return 0
    for host, args, whole in pairs:
        data = full if whole else short
        way = mux.get(host)
        if way is not None:  # the host's ControlMaster is up: a session through it, no ssh client (sshmux.py)
            from knobfleet import sshmux

            try:
                STARTED[host] = (args, sshmux.Passenger(way[0], args[-1], way[1], data, args))
                continue
            except (OSError, ValueError):
                pass  # no master (or not ours): ssh starts one, as below
        try:
            STARTED[host] = (args, Spawned(args, data))
        except OSError:
            continue  # the command starts it again and reports why it cannot
    KEY[0] = plan_key
    return len(STARTED)


def _mux_of(rec: dict[str, Any], pairs: list[tuple[str, list[str], bool]]) -> dict[str, tuple[str, list[str]]]:
    """Each host's control socket and session environment, for the hosts ``ssh -G`` vouched for when the record was
    written, while the ssh config files are the ones it read then (else none: every host gets the ssh client)."""
    recorded = rec.get("mux") or {}
    if not recorded or not pairs:
        return {}
    from knobfleet import sshmux

    if sshmux.stamp(pairs[0][1], sshmux.homes()) != rec.get("stamp"):
        return {}
    out = {}
    for host, _args, _whole in pairs:
        way = recorded.get(host)
        if way is not None:
            path, send, setenv = str(way[0]), [str(p) for p in way[1]], [str(e) for e in way[2]]
            out[host] = (path, sshmux.environment(send, setenv, os.environ))
    return out


def recalled() -> dict[str, Any] | None:
    """This command line's record as ``start`` read it (None: none, or not one to start early)."""
    key = INVOCATION[0]
    raw = _read_record(os.path.join(folder(), f"recall-{key}")) if key is not None else None
    try:
        rec = marshal.loads(raw) if raw is not None else None
    except (EOFError, ValueError, TypeError):
        return None
    return rec if isinstance(rec, dict) and rec.get("schema") == SCHEMA else None


def take(plan_key: str) -> dict[str, tuple[list[str], Spawned | Passenger]]:
    """The processes ``start`` launched, if they were started for ``plan_key`` (else they are stopped: {})."""
    if KEY[0] != plan_key:
        stop()
        return {}
    got = dict(STARTED)
    STARTED.clear()
    return got


def _read_key(path: str) -> bytes | None:
    """The fleet's key from its file, under the checks fleetkey makes (a regular file, yours, owner-only)."""
    text = (_read_record(path, 4096, private=True) or b"").strip()
    return text if len(text) >= 32 and text.isalnum() else None


def remember(
    plan_key: str,
    pairs: Sequence[tuple[str, list[str], bool]],
    full: bytes,
    short: bytes,
    secret: tuple[str, str] | None = None,
    mux: tuple[str, Mapping[str, tuple[str, list[str], list[str]]]] | None = None,
) -> None:
    """Record, for this command line, the processes the next identical one starts first thing. ``secret``: (the
    fleet's key, its file): the key is replaced by ``KEY_PLACEHOLDER`` in what is written. ``mux``: (the ssh
    config files' ``sshmux.stamp``, each host's ``sshmux.plan``): the hosts whose probe may go through their
    ControlMaster."""
    key = INVOCATION[0]
    if key is None:
        return
    key_file = ""
    if secret is not None and secret[0]:
        value = secret[0].encode()
        full, short, key_file = full.replace(value, KEY_PLACEHOLDER), short.replace(value, KEY_PLACEHOLDER), secret[1]
    rec = {"schema": SCHEMA, "plan_key": plan_key, "pairs": [list(p) for p in pairs], "full": full, "short": short,
           "key_file": key_file, "stamp": mux[0] if mux else "",
           "mux": {h: list(w) for h, w in mux[1].items()} if mux else {}}  # fmt: skip
    data = marshal.dumps(rec)
    where = folder()
    path = os.path.join(where, f"recall-{key}")
    if _read_record(path) == data:
        return
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        # a fresh name (O_EXCL): never through a symlink, a FIFO or a file planted at a guessable temp name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        try:  # noqa: SIM105 (contextlib costs an import here)
            os.unlink(tmp)
        except OSError:
            pass  # only costs the head start next time


MAX_RECORD = 16 * 1024 * 1024


def _read_record(path: str, limit: int = MAX_RECORD, private: bool = False) -> bytes | None:
    """A record's bytes, or None: absent, not a regular file (a FIFO or device planted there is never waited on),
    a symlink, or larger than ``limit``; with ``private``, also when it is not yours or others may read it."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        if private and (st.st_mode & 0o077 or st.st_uid != os.geteuid()):
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks) if size <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def stop() -> None:
    """Stop what ``start`` launched and nobody took: killed, its pipes closed unread, reaped."""
    for _argv, proc in STARTED.values():
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()
        proc.wait()
    STARTED.clear()


def _at_exit() -> None:
    stop()


import atexit  # noqa: E402  (builtin; registered last so that a failed import above registers nothing)

atexit.register(_at_exit)
