"""Transport ``ssh``, the fast path: run one of the roles' own stdlib-only module functions on many hosts over
the same multiplexed SSH connections Ansible uses, without starting ``ansible-playbook``.

Why: a read-only probe is one module call per host, and ``ansible-playbook`` spends ~0.85 s starting,
re-reading the inventory and running its strategy around it (docs/PERFORMANCE.md). Here the module's
source, with the ``module_utils`` it imports, is piped to ``python3 -I -c BOOT`` on each host; ``BOOT`` registers
the utils as ``ansible.module_utils.*``, execs the module and prints one JSON document.

Connection parity with Ansible: the argv is built from the same ``ansible_*`` inventory vars and the same
SSH options knobfleet gives Ansible (ansible_cfg.SSH_ARGS), and ``ControlPath`` is ``<state>/cp/%C`` for both,
so a drift right after an apply reuses the apply's connections and vice versa. Hosts the fast path
cannot reach exactly as Ansible would (another connection plugin, a password, become) are reported by
``ineligible`` and the caller uses the playbook instead.

Speculative start (``warm_up``, lives here and in ``knobfleet.headstart``): the argv of every host is saved under
``<state>/cache/fastpath`` keyed by the inventory fingerprint and the module's source; the next command with
the same key starts those ssh processes first thing, before the slow imports, and ``SshTransport.run`` keeps
each only if the argv computed from the validated host vars is identical (else it is stopped and started
again). Reads only, so a wrong guess costs nothing; processes nobody collected are stopped at exit. The console
script's entry starts the same processes even earlier, before argparse (``knobfleet.headstart``), for a command line
it has seen before; ``warm_up`` takes those over when they were started for its key.

Scale: at most ``forks`` ssh processes run at once (``--forks``, else ``KNOBFLEET_FORKS``, else ansible.cfg's
``forks``, else 32); each host's process has its own deadline from its own start, so a hung host holds one slot
for ``timeout_s`` and delays nobody else; outcomes are yielded as each host answers (``iter_function``), so a
caller that consumes them as they come keeps only the documents in flight. The speculative start saves and
starts only the first ``forks`` hosts.

``ssh_argv`` and ``remote_command`` are pure; ``iter_function``, ``run_function`` and ``start_planned`` run the
processes.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from knobfleet.fleet.ansible_cfg import SSH_ARGS
from knobfleet.fleet.transports import probecache
from knobfleet.fleet.transports.base import (
    BOOT,
    DEFAULT_FORKS,
    Capabilities,
    HostFailure,
    ModuleCall,
    Outcome,
    Target,
    bundle,
    check_forks,
    default_forks,
    interpret,
)
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)

__all__ = [
    "BOOT",
    "DEFAULT_FORKS",
    "SSH_ARGS",
    "HostFailure",
    "Outcome",
    "SshTransport",
    "Target",
    "bundle",
    "check_forks",
    "default_forks",
    "ineligible",
    "interpret",
    "iter_function",
    "run_function",
    "ssh_argv",
]

CONNECT_TIMEOUT_S = 15
DEFAULT_PYTHON = "/usr/bin/python3"
# The connection variables the fast path reads (ssh_argv, _python, ineligible); a password var is only looked at.
READS = frozenset(
    {
        "ansible_connection",
        "ansible_become",
        "ansible_host",
        "ansible_ssh_host",
        "ansible_port",
        "ansible_ssh_port",
        "ansible_user",
        "ansible_ssh_user",
        "ansible_ssh_private_key_file",
        "ansible_private_key_file",
        "ansible_ssh_executable",
        "ansible_ssh_args",
        "ansible_ssh_common_args",
        "ansible_ssh_extra_args",
        "ansible_python_interpreter",
        "ansible_password",
        "ansible_ssh_pass",
        "ansible_become_password",
    }
)


def config_defaults() -> dict[str, str]:
    """The user's ansible.cfg / ANSIBLE_* connection settings, as the inventory vars they default."""
    from knobfleet import paths
    from knobfleet.fleet import ansible_cfg

    return ansible_cfg.connection_defaults(ansible_cfg.user_settings(paths.project_root()))


def ineligible(hv: Target, defaults: Mapping[str, str] | None = None) -> str | None:
    """Why ``hv`` cannot be reached over plain SSH exactly as Ansible would, or None."""
    c = {**(defaults or {}), **hv.connection}
    conn = c.get("ansible_connection", "ssh")
    if conn not in ("ssh", "smart", "ansible.builtin.ssh"):
        return f"{hv.host}: ansible_connection={conn}"
    if any(v == "<set>" for k, v in c.items() if "pass" in k):
        return f"{hv.host}: password authentication"
    if c.get("ansible_become", "").lower() in ("true", "yes", "1"):
        return f"{hv.host}: ansible_become"
    return None


def _python(hv: Target, defaults: Mapping[str, str] | None = None) -> str:
    c = {**(defaults or {}), **hv.connection}
    interp = c.get("ansible_python_interpreter", "")
    return DEFAULT_PYTHON if not interp or interp.startswith("auto") else interp


def ssh_argv(hv: Target, control_dir: Path, defaults: Mapping[str, str] | None = None) -> list[str]:
    """The ssh command line Ansible's ssh plugin would use for ``hv`` (without the remote command).
    ``defaults``: ansible.cfg's connection settings as inventory vars (``config_defaults``); host vars win."""
    c = {**(defaults or {}), **hv.connection}
    argv = [c.get("ansible_ssh_executable", "ssh")]
    argv += shlex.split(c["ansible_ssh_args"]) if "ansible_ssh_args" in c else list(SSH_ARGS)
    argv += [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "KbdInteractiveAuthentication=no",
        "-o",
        "PasswordAuthentication=no",
    ]
    port = c.get("ansible_port") or c.get("ansible_ssh_port")
    if port:
        argv += ["-o", f"Port={port}"]
    key = c.get("ansible_ssh_private_key_file") or c.get("ansible_private_key_file")
    if key:
        argv += ["-o", f'IdentityFile="{os.path.expanduser(key)}"']
    user = c.get("ansible_user") or c.get("ansible_ssh_user")
    if user:
        argv += ["-o", f"User={user}"]
    argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ControlPath={control_dir}/%C"]
    for key_ in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        argv += shlex.split(c.get(key_, ""))
    argv.append(c.get("ansible_host") or c.get("ansible_ssh_host") or hv.address or hv.host)
    return argv


def remote_command(
    hv: Target, module_name: str, func: str, args: dict[str, Any], defaults: Mapping[str, str] | None = None
) -> str:
    """The shell command for the host: isolated python3 running ``func(args)`` of the module on stdin."""
    boot = BOOT.format(name=module_name, func=func, args=json.dumps(args, sort_keys=True))
    return f"{shlex.quote(_python(hv, defaults))} -I -c {shlex.quote(boot)}"


Started = dict[str, tuple[list[str], "subprocess.Popen[bytes]"]]


def _launch(argv: list[str], source: bytes) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        proc.stdin.write(source)  # a module is far smaller than a pipe's buffer: this never blocks
        proc.stdin.close()
    except BrokenPipeError:
        pass  # ssh already exited; its status says why
    proc.stdin = None  # written and closed: communicate() must not touch it again
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.communicate()


def _plan_file(plan_key: str, source: bytes, control_dir: Path) -> Path:
    from knobfleet import paths

    digest = sha256(f"{plan_key}\0{control_dir}\0".encode() + source).hexdigest()
    return paths.state_dir() / "cache" / "fastpath" / f"{digest}.json"


def start_planned(plan_key: str, source: bytes, limit: int | None = None) -> Started:
    """Start the ssh processes saved for ``plan_key`` by an earlier run (nothing when none are saved), at most
    ``limit`` of them (the forks of this run)."""
    from knobfleet import paths

    try:
        from knobfleet import safefile

        plan = json.loads(safefile.read_cache(_plan_file(plan_key, source, paths.control_dir())) or "null")
        pairs = [(str(p["host"]), [str(a) for a in p["argv"]], p.get("full", True) is not False) for p in plan]
        short = probecache.short_payload(source)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    if limit is not None:
        pairs = pairs[: max(limit, 0)]
    started: Started = {}
    for host, argv, full in pairs:
        try:
            started[host] = (argv, _launch(argv, source if full else short))
        except OSError:
            continue  # run_function starts it again and reports why it cannot
    return started


def _save_plan(path: Path, argvs: dict[str, tuple[list[str], bool]]) -> None:
    body = json.dumps([{"host": h, "argv": a, "full": full} for h, (a, full) in argvs.items()])
    try:
        if path.exists() and path.read_text(encoding="utf-8") == body:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # only costs the head start next time


@dataclasses.dataclass(frozen=True)
class FunctionRun:
    """One module function to run over ssh: ``func(args[host])`` of the module ``source`` (its bundle), through
    the control sockets in ``control_dir``, each host bounded by ``timeout_s`` from its own start, at most
    ``forks`` at once. ``plan_key``/``started``: the head start (processes an earlier run saved the argv of and
    ``warm_up`` started). ``defaults``: ansible.cfg's ssh settings. ``cache_roots``/``known``: each host's probe
    cache and what it is known to hold (probecache). ``persist``: keep one interpreter per host (a ``Session``)."""

    control_dir: Path
    source: bytes
    module_name: str
    func: str
    args: Mapping[str, dict[str, Any]]
    timeout_s: float = 60.0
    plan_key: str | None = None
    started: Started | None = None
    defaults: Mapping[str, str] | None = None
    forks: int | None = None
    cache_roots: Mapping[str, str] | None = None
    known: probecache.Known | None = None
    persist: bool = False


def iter_function(hosts: Sequence[Target], run: FunctionRun) -> Iterator[Outcome]:
    """Run ``run.func(run.args[host])`` on every host, at most ``run.forks`` at once, each bounded by
    ``run.timeout_s`` from its own start; yield each host's outcome as it arrives. Processes in ``run.started``
    whose argv is exactly the one computed here are used as they are; the others are stopped. Closing the iterator
    early stops what is still running. A host in ``run.cache_roots`` (its probe cache directory) runs the code
    cached there when ``run.known`` says it holds this bundle's, else gets the bundle and caches it (probecache).
    With ``run.persist``, such a host is asked through its ``Session`` (opened on first use, kept for the next
    call); a session that fails is closed and the call runs the usual way."""
    control_dir, source, module_name, func, args = run.control_dir, run.source, run.module_name, run.func, run.args
    timeout_s, plan_key, started, defaults, forks = run.timeout_s, run.plan_key, run.started, run.defaults, run.forks
    cache_roots, known, persist = run.cache_roots, run.known, run.persist
    control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    limit = max(1, forks if forks is not None else default_forks())
    early = dict(started or {})
    wanted = {hv.host for hv in hosts}
    for host in [h for h in early if h not in wanted]:  # started for hosts no longer asked for
        _stop(early.pop(host)[1])
    if not hosts:
        return

    roots = dict(cache_roots or {}) if known is not None else {}
    bundle_id = probecache.bundle_digest(source) if roots else ""
    short = probecache.short_payload(source) if roots else b""

    def argv_of(hv: Target, fresh: bool = False) -> tuple[list[str], bool, str | None]:
        """The host's argv, whether the bundle goes on stdin, and its key in ``known`` (None: not cached)."""
        reach = ssh_argv(hv, control_dir, defaults)
        root = roots.get(hv.host)
        if root is None or known is None:
            return [*reach, remote_command(hv, module_name, func, args[hv.host], defaults)], True, None
        python = _python(hv, defaults)
        key = probecache.Known.key(reach, python, root)
        code = None if fresh else known.get(key, bundle_id)
        cmd = probecache.command(python, root, code, module_name, func, args[hv.host])
        return [*reach, cmd], code is None, key

    if plan_key is not None:  # what the next run starts first thing: the hosts it will work on first
        from knobfleet import headstart

        plan = {hv.host: argv_of(hv)[:2] for hv in hosts[:limit]}
        _save_plan(_plan_file(plan_key, source, control_dir), plan)
        pairs = [(h, a, full) for h, (a, full) in plan.items()]
        from knobfleet import paths
        from knobfleet.fleet.fleetkey import KEY_FILE, fleet_key

        key = (fleet_key(), str(paths.state_dir() / KEY_FILE)) if (paths.state_dir() / KEY_FILE).exists() else None
        headstart.remember(plan_key, pairs, source, probecache.short_payload(source), key)

    lock = threading.Lock()
    todo = iter(hosts)
    done: list[Outcome | None] = []  # None: a worker finished
    ready = threading.Condition(lock)
    running: set[subprocess.Popen[bytes]] = set()
    stopping = threading.Event()

    def attempt(
        hv: Target, argv: list[str], full: bool, deadline: float, mine: subprocess.Popen[bytes] | None
    ) -> Outcome | tuple[int, bytes, bytes]:
        if mine is not None:
            proc = mine
        else:
            try:
                proc = _launch(argv, source if full else short)
            except OSError as exc:
                return Outcome(hv.host, error=HostFailure("error", f"cannot run {argv[0]}: {exc.strerror}"))
        with lock:
            running.add(proc)
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return Outcome(
                hv.host, error=HostFailure("error", f"no answer within {timeout_s:g} s; the ssh process was stopped")
            )
        finally:
            with lock:
                running.discard(proc)
        return proc.returncode, out, err

    def in_session(hv: Target, deadline: float) -> Outcome | None:
        """The host's answer from its kept interpreter (opened now if need be), or None: ask the usual way."""
        root = roots.get(hv.host)
        if root is None or known is None:
            return None
        reach, python = ssh_argv(hv, control_dir, defaults), _python(hv, defaults)
        code = known.get(probecache.Known.key(reach, python, root), bundle_id)
        if code is None:  # the host's entry is not known yet: the usual call stores it first
            return None
        cmd = probecache.command(python, root, code, module_name, func, args[hv.host], session=True)
        line = Session.ask([*reach, cmd], short, deadline)
        if line is None:
            return None
        return dataclasses.replace(interpret(hv.host, 0, line, b"", python), cache="session")

    def one(hv: Target) -> Outcome:
        deadline = time.monotonic() + timeout_s
        if persist:
            answered = in_session(hv, deadline)
            if answered is not None:
                return answered
        argv, full, key = argv_of(hv)
        with lock:
            mine = early.pop(hv.host, None)
        if mine is not None and mine[0] != argv:
            _stop(mine[1])
            mine = None
        got = attempt(hv, argv, full, deadline, mine[1] if mine is not None else None)
        if isinstance(got, Outcome):
            return got
        if key is None or known is None:
            return interpret(hv.host, *got, _python(hv, defaults))
        ev = probecache.event(got[2])
        if probecache.is_miss(got[0], ev) and not full:  # the host lost or refused its entry: send the bundle
            known.drop(key, bundle_id)
            missed = ev
            argv, full, key = argv_of(hv, fresh=True)
            got = attempt(hv, argv, full, deadline, None)
            if isinstance(got, Outcome):
                return got
            ev = probecache.event(got[2])
            if ev is not None and ev.kind == "stored" and missed is not None and missed.why.startswith("tampered:"):
                ev = probecache.Event("replaced", ev.digest, missed.why.removeprefix("tampered:").strip())
        if ev is not None and ev.kind in ("stored", "replaced") and key is not None:
            known.put(key, bundle_id, ev.digest)
        elif ev is not None and key is not None and ev.kind == "nocache":
            known.drop(key, bundle_id)
        return dataclasses.replace(interpret(hv.host, *got, _python(hv, defaults)), cache=str(ev) if ev else "")

    def worker() -> None:
        try:
            while not stopping.is_set():
                with lock:
                    hv = next(todo, None)
                if hv is None:
                    break
                outcome = one(hv)
                with ready:
                    done.append(outcome)
                    ready.notify()
        finally:
            with ready:
                done.append(None)
                ready.notify()

    n_workers = min(limit, len(hosts))
    threads = [threading.Thread(target=worker, name=f"knobfleet-ssh-{i}", daemon=True) for i in range(n_workers)]
    for t in threads:
        t.start()
    finished = 0
    try:
        while finished < n_workers:
            with ready:
                while not done:
                    ready.wait()
                item = done.pop(0)
            if item is None:
                finished += 1
            else:
                yield item
    finally:
        stopping.set()
        with lock:
            leftover = list(running) + [p for _a, p in early.values()]
            early.clear()
        for proc in leftover:
            if proc.poll() is None:
                proc.kill()
        for t in threads:
            t.join()


def run_function(
    hosts: Sequence[Target],
    control_dir: Path,
    source: bytes,
    module_name: str,
    func: str,
    args: Mapping[str, dict[str, Any]],
    timeout_s: float = 60.0,
    plan_key: str | None = None,
    started: Started | None = None,
    defaults: Mapping[str, str] | None = None,
    forks: int | None = None,
    cache_roots: Mapping[str, str] | None = None,
    known: probecache.Known | None = None,
    persist: bool = False,
) -> dict[str, Outcome]:
    """``iter_function``, collected: every host's outcome, in the order of ``hosts``."""
    run = FunctionRun(
        control_dir, source, module_name, func, args, timeout_s, plan_key, started, defaults, forks, cache_roots,
        known, persist,
    )  # fmt: skip
    got = {o.host: o for o in iter_function(hosts, run)}
    return {hv.host: got[hv.host] for hv in hosts}


class Session:
    """One host's probe interpreter kept across calls (``drift --watch``): an ssh process running the host's
    cached entry in session mode (probeboot.serve). Each call writes one line and reads one line back, so a
    repeated probe costs the host neither an ssh session, nor an interpreter start, nor loading the entry.
    Sessions are keyed by their exact argv; ``close_all`` (and exit) ends them, which ends the host's side. At most
    ``MAX_OPEN`` are kept (each is an ssh process on the controller); hosts past that are asked the one-shot way."""

    MAX_OPEN: ClassVar[int] = 256
    _open: ClassVar[dict[tuple[str, ...], Session]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, argv: list[str], first: bytes) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pending = b""
        self.first = first.replace(b"\n", b" ") + b"\n"  # the call's private options: the first line

    @classmethod
    def ask(cls, argv: list[str], first: bytes, deadline: float) -> bytes | None:
        """The answer of the session for ``argv`` (opened if need be), or None when it failed or was late (then
        it is closed: the caller runs the call the usual way, and the next call opens a new one)."""
        key = tuple(argv)
        with cls._lock:
            session = cls._open.get(key)
            if session is None and len(cls._open) >= cls.MAX_OPEN:
                return None
        try:
            if session is None:
                session = cls(argv, first)
                with cls._lock:
                    cls._open[key] = session
            line = session.request(deadline)
        except OSError:
            line = None
        if line is None and session is not None:
            with cls._lock:
                cls._open.pop(key, None)
            session.close()
        return line

    def request(self, deadline: float) -> bytes | None:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(self.first + b"{}\n")
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return None
        self.first = b""
        fd = proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def close(self) -> None:
        """End the session: end of input for the host's side, then the ssh process (killed if it lingers)."""
        proc = self.proc
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @classmethod
    def close_all(cls) -> int:
        """Close every open session; how many there were."""
        with cls._lock:
            sessions = list(cls._open.values())
            cls._open.clear()
        for session in sessions:
            session.close()
        return len(sessions)


atexit.register(Session.close_all)


# --- the transport ---------------------------------------------------------------------------------------

_EARLY: Started = {}
_EARLY_KEY: list[str | None] = [None]


def stop_unused() -> None:
    """Stop speculative processes nobody collected (an error came first, or another transport was chosen)."""
    for _argv, proc in _EARLY.values():
        if proc.returncode is None and proc.poll() is None:
            proc.kill()
        if proc.stdout is not None and not proc.stdout.closed:
            proc.communicate()
    _EARLY.clear()


atexit.register(stop_unused)


class SshTransport:
    """Plain ssh over Ansible's own ControlMaster sockets; see the module docstring."""

    name: ClassVar[str] = "ssh"
    reads: ClassVar[frozenset[str]] = READS
    caps: ClassVar[Capabilities] = Capabilities(quick=True, streams=True, warms_up=True, auto=True)

    def ineligible(self, hv: Target) -> str | None:
        return ineligible(hv, config_defaults())

    def stop_warm(self) -> None:
        stop_unused()

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        from knobfleet import headstart

        stop_unused()
        _EARLY_KEY[0] = key
        # started by the console script's entry, before the imports, for this very command line (Spawned: the part
        # of Popen the transport uses)
        early = cast(Started, headstart.take(key))
        _EARLY.update(early or start_planned(key, source, forks if forks is not None else default_forks()))

    def stream(
        self,
        hosts: Sequence[Target],
        call: ModuleCall,
        inventory: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        forks: int | None = None,
    ) -> Iterator[Outcome]:
        from knobfleet import paths

        started = dict(_EARLY)
        _EARLY.clear()
        roots = {h: r for h, a in call.args.items() if (r := probecache.root_of(a)) is not None}
        return iter_function(
            hosts,
            FunctionRun(
                paths.control_dir(),
                bundle(call.source(), paths.module_utils_dir(), call.private),
                call.module,
                call.function,
                call.args,
                timeout_s=call.timeout_s,
                plan_key=_EARLY_KEY[0],
                started=started,
                defaults=config_defaults(),
                forks=forks,
                cache_roots=roots,
                known=probecache.Known(paths.state_dir() / "cache" / "probecode"),
                persist=call.persist,
            ),
        )

    def run(
        self,
        hosts: Sequence[Target],
        call: ModuleCall,
        inventory: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        forks: int | None = None,
    ) -> dict[str, Outcome]:
        got = {o.host: o for o in self.stream(hosts, call, inventory, on_event, forks)}
        return {hv.host: got[hv.host] for hv in hosts}
