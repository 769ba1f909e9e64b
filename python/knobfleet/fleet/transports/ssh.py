"""Transport ``ssh``, the fast path: run one of the roles' own stdlib-only module functions on many hosts over
the same multiplexed SSH connections Ansible uses, without starting ``ansible-playbook``.

Why: a read-only probe is one module call per host, and ``ansible-playbook`` spends ~0.85 s starting,
re-reading the inventory and running its strategy around it (docs/PERFORMANCE.md). Here the module's
source, with the ``module_utils`` it imports, is piped to ``python3 -I -c BOOT`` on each host; ``BOOT`` registers
the utils as ``ansible.module_utils.*``, execs the module and prints one JSON document.

Connection parity with Ansible: the argv is built from the same ``ansible_*`` inventory vars and the same
SSH options knobfleet gives Ansible (runner.ssh_env), and ``ControlPath`` is ``<state>/cp/%C`` for both,
so a drift right after an apply reuses the apply's connections and vice versa. Hosts the fast path
cannot reach exactly as Ansible would (another connection plugin, a password, become) are reported by
``ineligible`` and the caller uses the playbook instead.

Speculative start (``warm_up``, lives here and nowhere else): the argv of every host is saved under
``<state>/cache/fastpath`` keyed by the inventory fingerprint and the module's source; the next command with
the same key starts those ssh processes first thing, before the slow imports, and ``SshTransport.run`` keeps
each only if the argv computed from the validated host vars is identical (else it is stopped and started
again). Reads only, so a wrong guess costs nothing; processes nobody collected are stopped at exit.

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
import hashlib
import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:  # this module stays light: the CLI imports it before pydantic to start probes early
    from knobfleet.fleet.transports import ModuleCall


class Target(Protocol):
    """What a transport needs to reach a host: ``fleet.hostvars.HostVars`` and ``fleet.readhost.ReadHost`` both
    are one."""

    @property
    def host(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def connection(self) -> dict[str, str]: ...


# Kept equal to runner.ssh_env(): the options Ansible's ssh plugin gets from knobfleet.
SSH_ARGS = ("-o", "ControlMaster=auto", "-o", "ControlPersist=300s", "-o", "ServerAliveInterval=15")
CONNECT_TIMEOUT_S = 15
DEFAULT_PYTHON = "/usr/bin/python3"
DEFAULT_FORKS = 32  # ssh processes at once when neither --forks, KNOBFLEET_FORKS nor ansible.cfg's forks says


def default_forks() -> int:
    """How many hosts the fast path works on at once: ``KNOBFLEET_FORKS``, else ansible.cfg's (or ANSIBLE_FORKS')
    ``forks`` as Ansible reads it, else 32."""
    from knobfleet.errors import UsageError

    env = os.environ.get("KNOBFLEET_FORKS", "").strip()
    if env:
        return check_forks(env, "KNOBFLEET_FORKS")
    from knobfleet import paths
    from knobfleet.fleet import ansible_cfg

    value = ansible_cfg.user_settings(paths.project_root()).get("forks", "").strip()
    if not value:
        return DEFAULT_FORKS
    try:
        return check_forks(value, "forks")
    except UsageError as exc:
        raise UsageError(f"{exc} (set in {ansible_cfg.config_file(paths.project_root()) or 'ANSIBLE_FORKS'})") from None


def check_forks(value: str | int, where: str = "--forks") -> int:
    from knobfleet.errors import UsageError

    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{where}={value}: expected a whole number of hosts at once, 1 or more")
    return n


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


BOOT = (
    "import json,sys,types\n"
    "b=json.loads(sys.stdin.buffer.read())\n"
    "for n,s in b['utils']:\n"
    " u=types.ModuleType('ansible.module_utils.'+n);sys.modules[u.__name__]=u\n"
    " exec(compile(s,n,'exec'),u.__dict__)\n"
    "m=types.ModuleType({name!r})\n"
    "exec(compile(b['module'],{name!r},'exec'),m.__dict__)\n"
    "a=json.loads({args!r});a.update(b.get('args') or {{}})\n"
    "sys.stdout.write(json.dumps(m.{func}(a)))\n"
)
UTIL_IMPORT = re.compile(rb"ansible\.module_utils\.(knob_[a-z_]+)")
# The collection's copies import their utils by FQCN; BOOT registers them under ansible.module_utils.
COLLECTION_UTILS = b"ansible_collections.knobfleet.serving.plugins.module_utils."


def _plain_imports(source: bytes) -> bytes:
    return source.replace(COLLECTION_UTILS, b"ansible.module_utils.")


def bundle(source: bytes, utils_dir: Path, private: Mapping[str, Any] | None = None) -> bytes:
    """What BOOT reads on stdin: the module's source and the knobfleet module_utils it imports, directly or
    through each other, each after the ones it imports. Works with either copy: the repository's
    (``ansible.module_utils.knob_*``) or the collection's (imports by FQCN, rewritten back here). ``private``:
    options of every host's call that must never be in an argv, which ``ps`` shows to every user of both
    machines (the fleet's secret-marker key); BOOT adds them to each host's options."""
    order: list[str] = []
    texts: dict[str, str] = {}
    source = _plain_imports(source)

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in texts or name in seen:
            return
        text = _plain_imports((utils_dir / f"{name}.py").read_bytes()).decode("utf-8")
        for dep in sorted({m.decode() for m in UTIL_IMPORT.findall(text.encode())}):
            visit(dep, (*seen, name))
        texts[name] = text
        order.append(name)

    for name in sorted({m.decode() for m in UTIL_IMPORT.findall(source)}):
        visit(name, ())
    utils = [[n, texts[n]] for n in order]
    body: dict[str, Any] = {"utils": utils, "module": source.decode("utf-8")}
    if private:
        body["args"] = dict(private)
    return json.dumps(body).encode("utf-8")


def remote_command(
    hv: Target, module_name: str, func: str, args: dict[str, Any], defaults: Mapping[str, str] | None = None
) -> str:
    """The shell command for the host: isolated python3 running ``func(args)`` of the module on stdin."""
    boot = BOOT.format(name=module_name, func=func, args=json.dumps(args, sort_keys=True))
    return f"{shlex.quote(_python(hv, defaults))} -I -c {shlex.quote(boot)}"


@dataclass(frozen=True)
class HostFailure:
    """Why a host gave no document: it could not be reached, or the module failed there."""

    kind: Literal["unreachable", "error"]
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class Outcome:
    """One host's answer: ``doc`` when the function ran, else ``error``."""

    host: str
    doc: Any = None
    error: HostFailure | None = None
    missing_python: bool = False


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def interpret(host: str, rc: int, stdout: bytes, stderr: bytes, python: str) -> Outcome:
    """Pure: what one ssh process's exit status and output mean."""
    err = _last_line(stderr.decode("utf-8", "replace"))
    if rc == 255:  # ssh's own status for a connection it could not make
        return Outcome(host, error=HostFailure("unreachable", err or "ssh exited 255"))
    if rc == 127:
        return Outcome(host, error=HostFailure("error", f"{python} not found on the host"), missing_python=True)
    if rc != 0:
        return Outcome(
            host, error=HostFailure("error", f"the module failed on the host (exit {rc}): {err or 'no message'}")
        )
    try:
        return Outcome(host, doc=json.loads(stdout))
    except ValueError:
        return Outcome(host, error=HostFailure("error", f"the module printed no JSON document: {stdout[:200]!r}"))


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

    digest = hashlib.sha256(f"{plan_key}\0{control_dir}\0".encode() + source).hexdigest()
    return paths.state_dir() / "cache" / "fastpath" / f"{digest}.json"


def start_planned(plan_key: str, source: bytes, limit: int | None = None) -> Started:
    """Start the ssh processes saved for ``plan_key`` by an earlier run (nothing when none are saved), at most
    ``limit`` of them (the forks of this run)."""
    from knobfleet import paths

    try:
        plan = json.loads(_plan_file(plan_key, source, paths.control_dir()).read_text(encoding="utf-8"))
        pairs = [(str(p["host"]), [str(a) for a in p["argv"]]) for p in plan]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if limit is not None:
        pairs = pairs[: max(limit, 0)]
    started: Started = {}
    for host, argv in pairs:
        try:
            started[host] = (argv, _launch(argv, source))
        except OSError:
            continue  # run_function starts it again and reports why it cannot
    return started


def _save_plan(path: Path, argvs: dict[str, list[str]]) -> None:
    body = json.dumps([{"host": h, "argv": a} for h, a in argvs.items()])
    try:
        if path.exists() and path.read_text(encoding="utf-8") == body:
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # only costs the head start next time


def iter_function(
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
) -> Iterator[Outcome]:
    """Run ``func(args[host])`` from the module ``source`` on every host, at most ``forks`` at once, each bounded
    by ``timeout_s`` from its own start; yield each host's outcome as it arrives. Processes in ``started`` whose
    argv is exactly the one computed here are used as they are; the others are stopped. Closing the iterator
    early stops what is still running."""
    control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    limit = max(1, forks if forks is not None else default_forks())
    early = dict(started or {})
    wanted = {hv.host for hv in hosts}
    for host in [h for h in early if h not in wanted]:  # started for hosts no longer asked for
        _stop(early.pop(host)[1])
    if not hosts:
        return

    def argv_of(hv: Target) -> list[str]:
        return [*ssh_argv(hv, control_dir, defaults), remote_command(hv, module_name, func, args[hv.host], defaults)]

    if plan_key is not None:  # what the next run starts first thing: the hosts it will work on first
        _save_plan(_plan_file(plan_key, source, control_dir), {hv.host: argv_of(hv) for hv in hosts[:limit]})

    lock = threading.Lock()
    todo = iter(hosts)
    done: list[Outcome | None] = []  # None: a worker finished
    ready = threading.Condition(lock)
    running: set[subprocess.Popen[bytes]] = set()
    stopping = threading.Event()

    def one(hv: Target) -> Outcome:
        argv = argv_of(hv)
        with lock:
            mine = early.pop(hv.host, None)
        if mine is not None and mine[0] != argv:
            _stop(mine[1])
            mine = None
        if mine is not None:
            proc = mine[1]
        else:
            try:
                proc = _launch(argv, source)
            except OSError as exc:
                return Outcome(hv.host, error=HostFailure("error", f"cannot run {argv[0]}: {exc.strerror}"))
        with lock:
            running.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return Outcome(
                hv.host, error=HostFailure("error", f"no answer within {timeout_s:g} s; the ssh process was stopped")
            )
        finally:
            with lock:
                running.discard(proc)
        return interpret(hv.host, proc.returncode, out, err, _python(hv, defaults))

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
) -> dict[str, Outcome]:
    """``iter_function``, collected: every host's outcome, in the order of ``hosts``."""
    got = {
        o.host: o
        for o in iter_function(
            hosts, control_dir, source, module_name, func, args, timeout_s, plan_key, started, defaults, forks
        )
    }
    return {hv.host: got[hv.host] for hv in hosts}


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

    def ineligible(self, hv: Target) -> str | None:
        return ineligible(hv, config_defaults())

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        stop_unused()
        _EARLY_KEY[0] = key
        _EARLY.update(start_planned(key, source, forks if forks is not None else default_forks()))

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
        return iter_function(
            hosts,
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
