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

``iter_function``, ``run_function`` and ``start_planned`` run the processes, each call described by a
``FunctionRun`` (sshrun.py, with ``Started``, the head start's processes). Each host's call (its argv, pure:
``ssh_argv`` and ``remote_command``; the head start's process, the probe cache, the bundle sent again) is
``sshcalls.py``, loaded when a call runs; the sessions of ``drift --watch`` (``Session``, and ``Sessions``: the pool
the transport keeps) are ``sshsession.py``, loaded only when a call keeps one. Their callers import these names from
those files.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

from knobfleet.fleet.transports import probecache
from knobfleet.fleet.transports.base import (
    Capabilities,
    Job,
    Outcome,
    RunsItsStream,
    Target,
    bundle,
    default_forks,
    host_view,
    keys,
)
from knobfleet.fleet.transports.sshrun import FunctionRun, Started
from knobfleet.fleet.transports.sshvars import SshVars
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)

if TYPE_CHECKING:
    from knobfleet.fleet.transports.sshcalls import Calls
    from knobfleet.fleet.transports.sshsession import Sessions

__all__ = [
    "SshTransport",
    "ineligible",
    "iter_function",
    "run_function",
]

READS = keys(SshVars)


def config_defaults() -> dict[str, str]:
    """The user's ansible.cfg / ANSIBLE_* connection settings, as the inventory vars they default."""
    from knobfleet import paths
    from knobfleet.fleet import ansible_cfg

    return ansible_cfg.connection_defaults(ansible_cfg.user_settings(paths.project_root()))


def ineligible(hv: Target, defaults: Mapping[str, str] | None = None) -> str | None:
    """Why ``hv`` cannot be reached over plain SSH exactly as Ansible would, or None."""
    v = host_view(SshVars, hv, defaults)
    if v.ansible_connection not in ("ssh", "smart", "ansible.builtin.ssh"):
        return f"{hv.host}: ansible_connection={v.ansible_connection}"
    if v.password:
        return f"{hv.host}: password authentication"
    if v.becomes:
        return f"{hv.host}: ansible_become"
    return None


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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
    from knobfleet import safefile

    body = json.dumps([{"host": h, "argv": a, "full": full} for h, (a, full) in argvs.items()])
    if safefile.read_cache(path) != body:  # only costs the head start next time when it cannot be written
        safefile.write_cache(path, body)


def iter_function(hosts: Sequence[Target], run: FunctionRun) -> Iterator[Outcome]:
    """Run ``run.func(run.args[host])`` on every host, at most ``run.forks`` at once, each bounded by
    ``run.timeout_s`` from its own start; yield each host's outcome as it arrives. Processes in ``run.started``
    whose argv is exactly the one computed here are used as they are; the others are stopped. Closing the iterator
    early stops what is still running. A host in ``run.cache_roots`` (its probe cache directory) runs the code
    cached there when ``run.known`` says it holds this bundle's, else gets the bundle and caches it (probecache).
    With ``run.sessions``, such a host is asked through its ``Session`` there (opened on first use, kept for the next
    call); a session that fails is closed and the call runs the usual way."""
    from knobfleet.fleet.transports.sshcalls import Calls, stop

    run.control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    limit = max(1, run.forks if run.forks is not None else default_forks())
    early = dict(run.started or {})
    wanted = {hv.host for hv in hosts}
    for host in [h for h in early if h not in wanted]:  # started for hosts no longer asked for
        stop(early.pop(host)[1])
    if not hosts:
        return
    calls = Calls(run, early, _launch)
    if run.plan_key is not None:  # what the next run starts first thing: the hosts it will work on first
        _remember(run, run.plan_key, {hv.host: calls.argv_of(hv)[:2] for hv in hosts[:limit]})
    yield from _fan_out(calls, hosts, limit)


def _remember(run: FunctionRun, plan_key: str, plan: dict[str, tuple[list[str], bool]]) -> None:
    """Save ``plan`` (each host's argv and whether the bundle goes on stdin) for the next run's ``warm_up``, and
    for the console script's entry (``headstart``), with where the fleet's key is (never the key itself)."""
    from knobfleet import headstart, paths
    from knobfleet.fleet.fleetkey import KEY_FILE, fleet_key
    from knobfleet.fleet.transports.sshcalls import mux_plans

    _save_plan(_plan_file(plan_key, run.source, run.control_dir), plan)
    pairs = [(h, a, full) for h, (a, full) in plan.items()]
    key = (fleet_key(), str(paths.state_dir() / KEY_FILE)) if (paths.state_dir() / KEY_FILE).exists() else None
    mux = mux_plans(plan, headstart.recalled()) if headstart.INVOCATION[0] is not None else None
    headstart.remember(plan_key, pairs, run.source, probecache.short_payload(run.source), key, mux)


def _fan_out(calls: Calls, hosts: Sequence[Target], limit: int) -> Iterator[Outcome]:
    """Each host's outcome (``calls.one``) as it arrives, from at most ``limit`` worker threads; closed early, what
    still runs is stopped."""
    todo = iter(hosts)
    done: list[Outcome | None] = []  # None: a worker finished
    ready = threading.Condition(calls.lock)
    stopping = threading.Event()

    def worker() -> None:
        try:
            while not stopping.is_set():
                with calls.lock:
                    hv = next(todo, None)
                if hv is None:
                    break
                outcome = calls.one(hv)
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
        for proc in calls.stop():
            if proc.poll() is None:
                proc.kill()
        for t in threads:
            t.join()


def run_function(hosts: Sequence[Target], run: FunctionRun) -> dict[str, Outcome]:
    """``iter_function``, collected: every host's outcome, in the order of ``hosts``."""
    got = {o.host: o for o in iter_function(hosts, run)}
    return {hv.host: got[hv.host] for hv in hosts}


# --- the transport ---------------------------------------------------------------------------------------


class SshTransport(RunsItsStream):
    """Plain ssh over Ansible's own ControlMaster sockets; see the module docstring. Its state: the processes
    ``warm_up`` started ahead (by the saved plan, or taken over from the console script's entry) and the plan's
    key, until ``stream`` takes them or ``stop_warm`` (also at exit) stops them; and the interpreters it keeps per
    host for ``drift --watch`` (``sshsession.Sessions``, made on the first call that asks, closed at exit)."""

    name: ClassVar[str] = "ssh"
    reads: ClassVar[frozenset[str]] = READS
    caps: ClassVar[Capabilities] = Capabilities(quick=True, streams=True, warms_up=True, auto=True)

    def __init__(self) -> None:
        self._early: Started = {}
        self._plan_key: str | None = None
        self._sessions: Sessions | None = None
        atexit.register(self.stop_warm)

    def _kept(self) -> Sessions:
        """The interpreters this transport keeps per host (``drift --watch``), made on first use."""
        if self._sessions is None:
            from knobfleet.fleet.transports.sshsession import Sessions

            self._sessions = Sessions()
        return self._sessions

    def ineligible(self, hv: Target) -> str | None:
        return ineligible(hv, config_defaults())

    def stop_warm(self) -> None:
        """Stop speculative processes nobody collected (an error came first, or another transport was chosen)."""
        for _argv, proc in self._early.values():
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
            if proc.stdout is not None and not proc.stdout.closed:
                proc.communicate()
        self._early.clear()

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        from knobfleet import headstart

        self.stop_warm()
        self._plan_key = key
        # started by the console script's entry, before the imports, for this very command line (Spawned: the part
        # of Popen the transport uses)
        early = cast(Started, headstart.take(key))
        self._early.update(early or start_planned(key, source, forks if forks is not None else default_forks()))

    def stream(self, job: Job) -> Iterator[Outcome]:
        from knobfleet import paths

        call = job.call
        started = dict(self._early)
        self._early.clear()
        roots = {h: r for h, a in call.args.items() if (r := probecache.root_of(a)) is not None}
        return iter_function(
            job.hosts,
            FunctionRun(
                paths.control_dir(),
                bundle(call.source(), paths.module_utils_dir(), call.private),
                call.module,
                call.function,
                call.args,
                timeout_s=call.timeout_s,
                plan_key=self._plan_key,
                started=started,
                defaults=config_defaults(),
                forks=job.forks,
                cache_roots=roots,
                known=probecache.Known(paths.state_dir() / "cache" / "probecode"),
                sessions=self._kept() if call.persist else None,
            ),
        )
