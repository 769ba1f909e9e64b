"""One host's call over ssh, as ``ssh.iter_function`` makes it on each host: the ssh command line Ansible's ssh
plugin would use (``ssh_argv``, pure), the remote command (``remote_command``, or the host's probe cache entry:
probecache), the head start's process when it is that very command, the bundle sent again when the host lost or
refused its cached entry, and with the transport's ``Sessions`` the host's kept session (sshsession.py).

``ssh.py`` (the transport: eligibility, the head start, at most ``forks`` hosts at once) imports this module when a
call runs; the call it hands over is sshrun.py's ``FunctionRun``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.fleet.ansible_cfg import SSH_ARGS
from knobfleet.fleet.transports import probecache
from knobfleet.fleet.transports.base import BOOT, HostFailure, Outcome, Target, host_view, interpret
from knobfleet.fleet.transports.sshvars import SshVars

if TYPE_CHECKING:
    from knobfleet.fleet.transports.sshrun import FunctionRun, Started

Popen = subprocess.Popen[bytes]

CONNECT_TIMEOUT_S = 15


def _python(hv: Target, defaults: Mapping[str, str] | None = None) -> str:
    return host_view(SshVars, hv, defaults).python


def ssh_argv(hv: Target, control_dir: Path, defaults: Mapping[str, str] | None = None) -> list[str]:
    """The ssh command line Ansible's ssh plugin would use for ``hv`` (without the remote command).
    ``defaults``: ansible.cfg's connection settings as inventory vars (``config_defaults``); host vars win."""
    v = host_view(SshVars, hv, defaults)
    argv = [v.ansible_ssh_executable]
    argv += shlex.split(v.ansible_ssh_args) if v.ansible_ssh_args is not None else list(SSH_ARGS)
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
    if v.port:
        argv += ["-o", f"Port={v.port}"]
    if v.key_file:
        argv += ["-o", f'IdentityFile="{os.path.expanduser(v.key_file)}"']
    if v.user:
        argv += ["-o", f"User={v.user}"]
    argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ControlPath={control_dir}/%C"]
    argv += shlex.split(v.ansible_ssh_common_args) + shlex.split(v.ansible_ssh_extra_args)
    argv.append(v.address(hv))
    return argv


def remote_command(
    hv: Target, module_name: str, func: str, args: dict[str, Any], defaults: Mapping[str, str] | None = None
) -> str:
    """The shell command for the host: isolated python3 running ``func(args)`` of the module on stdin."""
    boot = BOOT.format(name=module_name, func=func, args=json.dumps(args, sort_keys=True))
    return f"{shlex.quote(_python(hv, defaults))} -I -c {shlex.quote(boot)}"


def stop(proc: Popen) -> None:
    """Kill ``proc`` and reap it."""
    proc.kill()
    proc.communicate()


class Calls:
    """One ``iter_function`` call as each host runs it: its argv (cached entry or bundle), the head start's process
    when it is the same command, a cache miss answered with the bundle, the kept session with ``sessions``. The
    workers share ``lock`` (the ssh processes running, the head start's processes not yet taken)."""

    def __init__(self, run: FunctionRun, early: Started, launch: Callable[[list[str], bytes], Popen]) -> None:
        self.run = run
        self.early = early
        self.launch = launch  # ssh._launch (looked up there when the run starts: a test replaces it)
        self.roots = dict(run.cache_roots or {}) if run.known is not None else {}
        self.bundle_id = probecache.bundle_digest(run.source) if self.roots else ""
        self.short = probecache.short_payload(run.source) if self.roots else b""
        self.lock = threading.Lock()
        self.running: set[Popen] = set()

    def argv_of(self, hv: Target, fresh: bool = False) -> tuple[list[str], bool, str | None]:
        """The host's argv, whether the bundle goes on stdin, and its key in ``known`` (None: not cached)."""
        run = self.run
        reach = ssh_argv(hv, run.control_dir, run.defaults)
        root = self.roots.get(hv.host)
        if root is None or run.known is None:
            return [*reach, remote_command(hv, run.module_name, run.func, run.args[hv.host], run.defaults)], True, None
        python = _python(hv, run.defaults)
        key = probecache.Known.key(reach, python, root)
        code = None if fresh else run.known.get(key, self.bundle_id)
        cmd = probecache.command(python, root, code, run.module_name, run.func, run.args[hv.host])
        return [*reach, cmd], code is None, key

    def attempt(
        self, hv: Target, argv: list[str], full: bool, deadline: float, mine: Popen | None
    ) -> Outcome | tuple[int, bytes, bytes]:
        """The host's (returncode, stdout, stderr), or its failure: ssh cannot start, or no answer in time."""
        if mine is not None:
            proc = mine
        else:
            try:
                proc = self.launch(argv, self.run.source if full else self.short)
            except OSError as exc:
                return Outcome(hv.host, error=HostFailure("error", f"cannot run {argv[0]}: {exc.strerror}"))
        with self.lock:
            self.running.add(proc)
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(proc)
            timeout_s = self.run.timeout_s
            return Outcome(
                hv.host, error=HostFailure("error", f"no answer within {timeout_s:g} s; the ssh process was stopped")
            )
        finally:
            with self.lock:
                self.running.discard(proc)
        return proc.returncode, out, err

    def in_session(self, hv: Target, deadline: float) -> Outcome | None:
        """The host's answer from its kept interpreter (opened now if need be), or None: ask the usual way."""
        run = self.run
        root = self.roots.get(hv.host)
        if root is None or run.known is None:
            return None
        reach, python = ssh_argv(hv, run.control_dir, run.defaults), _python(hv, run.defaults)
        code = run.known.get(probecache.Known.key(reach, python, root), self.bundle_id)
        if code is None:  # the host's entry is not known yet: the usual call stores it first
            return None
        assert run.sessions is not None
        cmd = probecache.command(python, root, code, run.module_name, run.func, run.args[hv.host], session=True)
        line = run.sessions.ask([*reach, cmd], self.short, deadline)
        if line is None:
            return None
        return dataclasses.replace(interpret(hv.host, 0, line, b"", python), cache="session")

    def one(self, hv: Target) -> Outcome:
        """The host's outcome: from its session, else from the head start's process or a new one (the bundle sent
        again when the host lost or refused its cached entry); ``known`` follows what the host now holds."""
        run = self.run
        deadline = time.monotonic() + run.timeout_s
        if run.sessions is not None:
            answered = self.in_session(hv, deadline)
            if answered is not None:
                return answered
        argv, full, key = self.argv_of(hv)
        with self.lock:
            mine = self.early.pop(hv.host, None)
        if mine is not None and mine[0] != argv:
            stop(mine[1])
            mine = None
        got = self.attempt(hv, argv, full, deadline, mine[1] if mine is not None else None)
        if mine is not None and getattr(mine[1], "refused", False):  # the master would not open it: as ssh does,
            got = self.attempt(hv, argv, full, deadline, None)  # a client of its own
        if isinstance(got, Outcome):
            return got
        known = run.known
        if key is None or known is None:
            return interpret(hv.host, *got, _python(hv, run.defaults))
        ev = probecache.event(got[2])
        if probecache.is_miss(got[0], ev) and not full:  # the host lost or refused its entry: send the bundle
            known.drop(key, self.bundle_id)
            resent = self.resend(hv, ev, deadline)
            if isinstance(resent, Outcome):
                return resent
            got, ev, key = resent
        if ev is not None and ev.kind in ("stored", "replaced") and key is not None:
            known.put(key, self.bundle_id, ev.digest)
        elif ev is not None and key is not None and ev.kind == "nocache":
            known.drop(key, self.bundle_id)
        return dataclasses.replace(interpret(hv.host, *got, _python(hv, run.defaults)), cache=str(ev) if ev else "")

    def resend(
        self, hv: Target, missed: probecache.Event | None, deadline: float
    ) -> Outcome | tuple[tuple[int, bytes, bytes], probecache.Event | None, str | None]:
        """The bundle sent again to a host that lost or refused its cached entry (``missed``): what it answered, the
        cache's event (a tampered entry stored anew is ``replaced``) and the host's key; or its failure."""
        argv, full, key = self.argv_of(hv, fresh=True)
        got = self.attempt(hv, argv, full, deadline, None)
        if isinstance(got, Outcome):
            return got
        ev = probecache.event(got[2])
        if ev is not None and ev.kind == "stored" and missed is not None and missed.why.startswith("tampered:"):
            ev = probecache.Event("replaced", ev.digest, missed.why.removeprefix("tampered:").strip())
        return got, ev, key

    def stop(self) -> list[Popen]:
        """Every process still running or not taken (the head start's), forgotten here: the caller kills them."""
        with self.lock:
            leftover = list(self.running) + [p for _a, p in self.early.values()]
            self.early.clear()
        return leftover


MuxPlans = dict[str, tuple[str, list[str], list[str]]]


def mux_plans(plan: Mapping[str, tuple[list[str], bool]], previous: Mapping[str, Any] | None) -> tuple[str, MuxPlans]:
    """For the head start's record: the ssh config files' stamp and, for each host of ``plan`` whose probe may go
    through its ControlMaster, what ``ssh -G`` says of its argv (sshmux.plan). Taken from ``previous`` (the record
    as it is) for a host whose argv and stamp are unchanged; else ``ssh -G`` is asked, all hosts at once, once."""
    from knobfleet import sshmux

    if not plan:
        return "", {}
    first = next(iter(plan.values()))[0]
    home = sshmux.homes()
    files = sshmux.config_files(first, home)
    stamp = sshmux.stamp(first, home)
    same = [h for h, (argv, _f) in plan.items() if sshmux.config_files(argv, home) == files]
    old_argv = {str(p[0]): p[1] for p in (previous or {}).get("pairs", ())}
    old_mux = (previous or {}).get("mux") or {}
    reuse = (previous or {}).get("stamp") == stamp
    got: MuxPlans = {}
    ask: dict[str, subprocess.Popen[bytes]] = {}
    for host in same:
        argv = plan[host][0]
        if reuse and old_argv.get(host) == argv:
            if host in old_mux:
                way = old_mux[host]
                got[host] = (str(way[0]), [str(x) for x in way[1]], [str(x) for x in way[2]])
            continue
        try:  # the options and the host, without the remote command
            ask[host] = subprocess.Popen([argv[0], "-G", *argv[1:-1]], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        except OSError:
            continue
    for host, proc in ask.items():
        try:
            out = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            stop(proc)
            continue
        way = sshmux.plan(out.decode("utf-8", "replace")) if proc.returncode == 0 else None
        if way is not None:
            got[host] = way
    return stamp, got
