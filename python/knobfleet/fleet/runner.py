"""The only module that imports ansible_runner: a typed ``RunRequest`` in, a typed ``RunResult`` out.

Profile data is written to the extra-vars file tagged ``!unsafe``: ansible-core trusts extra vars and
would evaluate ``{{ lookup('pipe', …) }}`` inside them; unsafe values are written literally.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from knobfleet import paths
from knobfleet.errors import RunError
from knobfleet.fleet.ansible_cfg import SSH_ARGS

Event = dict[str, Any]


class Unsafe(str):
    """A string Ansible must never template (dumped as ``!unsafe``)."""


class _Dumper(yaml.SafeDumper):
    pass


def _unsafe_repr(dumper: yaml.SafeDumper, data: Unsafe) -> yaml.Node:
    # Double quotes: the only YAML style where every character (NEL, LS, \r…) is escaped and survives.
    return dumper.represent_scalar("!unsafe", str(data), style='"')


_Dumper.add_representer(Unsafe, _unsafe_repr)


def mark_unsafe(value: Any) -> Any:
    """Every string inside ``value`` (not mapping keys) becomes Unsafe."""
    if isinstance(value, str):
        return Unsafe(value)
    if isinstance(value, dict):
        return {k: mark_unsafe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mark_unsafe(v) for v in value]
    return value


def dump_vars(trusted: dict[str, Any], unsafe: dict[str, Any]) -> str:
    body = {**trusted, **{k: mark_unsafe(v) for k, v in unsafe.items()}}
    return yaml.dump(body, Dumper=_Dumper, sort_keys=True, allow_unicode=True, width=10_000)


@dataclass(frozen=True)
class RunRequest:
    playbook: str
    inventory: Path
    hosts: tuple[str, ...] = ()  # the inventory names to run on, exactly (none: every host of the inventory)
    trusted_vars: dict[str, Any] = field(default_factory=dict)
    unsafe_vars: dict[str, Any] = field(default_factory=dict)
    check: bool = False
    diff: bool = False
    forks: int = 10
    on_event: Callable[[Event], None] | None = None
    run_id: str = ""
    verbose: bool = field(default_factory=lambda: verbosity() > 0)
    # Polled about every 0.1 s while ansible-playbook runs: True stops it (ansible-runner's cancel).
    cancel: Callable[[], bool] | None = None


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: bool = False
    failures: list[tuple[str, str]] = field(default_factory=list)  # (task title for people, message)
    # Keyed by what the module says it is: the ``step`` field knobfleet's modules return (begin, stage,
    # commit, ready, probe, restore…), else the module's name (ansible.builtin.slurp); never a task title.
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    diffs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return not self.failed and not self.unreachable

    def first_failure(self, with_task: bool = True) -> str:
        if self.unreachable and not self.failures:
            return "unreachable"
        if not with_task:
            return self.failures[0][1].removeprefix("unreachable: ") if self.failures else "failed"
        return "; ".join(f"{task}: {msg}" for task, msg in self.failures[:1]) or "failed"


@dataclass
class RunResult:
    run_id: str
    rc: int
    status: str
    hosts: dict[str, HostResult]
    artifacts: Path
    wall_s: float

    def host(self, name: str) -> HostResult:
        return self.hosts.setdefault(name, HostResult(name))


def fold_event(result: RunResult, event: Event) -> None:
    """Fold one ansible-runner event into ``result``: per host its counts, failures, module results (keyed
    by the ``step`` a knobfleet module returns, else the module's name) and diffs. Pure."""
    data = event.get("event_data") or {}
    host, task = data.get("host"), str(data.get("task", ""))
    kind = event.get("event", "")
    if host:
        hr = result.host(host)
        res = data.get("res") or {}
        key = str(res.get("step") or data.get("task_action") or "")
        # A composite call (knob_generation install / finish) reports each step it ran under ``steps``:
        # keyed like separate calls, and a failure also under the step that failed.
        steps = res.get("steps")
        if isinstance(steps, dict):
            for sub, sub_res in steps.items():
                hr.results[str(sub)] = sub_res
        if kind == "runner_on_failed" and res.get("failed_step"):
            key = str(res["failed_step"])
        if kind == "runner_on_ok":
            hr.results[key] = res
            if res.get("diff") and res.get("changed"):
                for d in res["diff"] if isinstance(res["diff"], list) else [res["diff"]]:
                    hr.diffs.append({"step": key, **d})
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            hr.failures.append((task, _message(res)))
            hr.results[key] = res
        elif kind == "runner_on_unreachable":
            hr.unreachable = True
            hr.failures.append((task, "unreachable: " + _message(res)))


def verbosity() -> int:
    """-v / -vv (KNOBFLEET_VERBOSE): 1 shows Ansible's output and each run's artifact folder; 2 adds -vv."""
    try:
        return int(os.environ.get("KNOBFLEET_VERBOSE", "0") or 0)
    except ValueError:
        return 0


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def controller_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def operator() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or "root"


CLI_ROLE_VARS = {"knob_serve_restore_on_failure": False, "knob_serve_verify": False, "knob_serve_restore_verify": False}
# What knobfleet sets only where the user's Ansible (ansible.cfg or ANSIBLE_*) leaves Ansible's default, and why.
PREFERRED: dict[str, tuple[str, str, str]] = {
    # name in ansible_cfg.SETTINGS: (environment variable, value, why)
    "pipelining": ("ANSIBLE_PIPELINING", "True", "one SSH round trip per module instead of ~4"),
    "ssh_args": ("ANSIBLE_SSH_ARGS", " ".join(SSH_ARGS), "multiplexed connections, shared with the fast path"),
    "timeout": ("ANSIBLE_TIMEOUT", "15", "a dead host fails within 15 s"),
    "interpreter_python": ("ANSIBLE_PYTHON_INTERPRETER", "auto_silent", "no interpreter discovery warnings"),
    "nocolor": ("ANSIBLE_NOCOLOR", "1", "artifacts and -v output stay plain text"),
    "deprecation_warnings": ("ANSIBLE_DEPRECATION_WARNINGS", "False", "warnings knobfleet's users cannot act on"),
    "system_warnings": ("ANSIBLE_SYSTEM_WARNINGS", "False", "warnings knobfleet's users cannot act on"),
}
# What knobfleet always sets (documented in docs/OWN_FLEET.md, "What knobfleet overrides"):
#   ANSIBLE_CONFIG                  the project's ansible.cfg, unless ANSIBLE_CONFIG is set (runs start elsewhere)
#   ANSIBLE_SSH_CONTROL_PATH(_DIR)  <state>/cp/%C: the SSH fast path reuses Ansible's connections and vice versa
#   ANSIBLE_LOCAL_TEMP              <state>/tmp when the user set none
#   ANSIBLE_ROLES_PATH, ANSIBLE_MODULE_UTILS   from a checkout only: its roles/ and module_utils
#   stdout callback                 ansible-runner's own (it turns the run into events); callbacks_enabled is kept


def user_settings() -> dict[str, str]:
    from knobfleet.fleet import ansible_cfg

    return ansible_cfg.user_settings(paths.project_root())


def _env(forks: int) -> dict[str, str]:
    from knobfleet.fleet import ansible_cfg

    state = paths.state_dir()
    cp = paths.control_dir()
    (state / "tmp").mkdir(parents=True, exist_ok=True, mode=0o700)
    user = user_settings()
    env: dict[str, str] = {}
    cfg = ansible_cfg.config_file(paths.project_root())
    if "ANSIBLE_CONFIG" not in os.environ and cfg is not None:
        env["ANSIBLE_CONFIG"] = str(cfg)
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(cp)
    # ssh's own %C (a hash of host, port, user): the SSH fast path computes the same socket path.
    env["ANSIBLE_SSH_CONTROL_PATH"] = "%(directory)s/%%C"
    if "local_tmp" not in user:
        env["ANSIBLE_LOCAL_TEMP"] = str(state / "tmp")
    if not paths.uses_collection():  # a checkout: its roles and module_utils, before any of the user's
        env["ANSIBLE_ROLES_PATH"] = os.pathsep.join(
            p for p in (str(paths.roles_dir()), os.environ.get("ANSIBLE_ROLES_PATH", "")) if p
        )
        env["ANSIBLE_MODULE_UTILS"] = os.pathsep.join(
            p for p in (str(paths.module_utils_dir()), os.environ.get("ANSIBLE_MODULE_UTILS", "")) if p
        )
    for name, (var, value, _why) in PREFERRED.items():
        if name not in user:
            env[var] = value
    if "forks" not in user:
        env["ANSIBLE_FORKS"] = str(forks)
    env.update(vault_sources(os.environ, os.getcwd()))
    return env


def vault_sources(environ: Mapping[str, str], cwd: str) -> dict[str, str]:
    """The vault password file and --vault-id sources the user gave, relative to where knobfleet was started,
    made absolute: ansible-playbook runs in the run's own folder, where a relative one is "not found"."""

    def absolute(source: str) -> str:
        if not source or source.startswith("prompt") or os.path.isabs(source):
            return source
        return os.path.normpath(os.path.join(cwd, source))

    out: dict[str, str] = {}
    if environ.get("ANSIBLE_VAULT_PASSWORD_FILE"):
        out["ANSIBLE_VAULT_PASSWORD_FILE"] = absolute(environ["ANSIBLE_VAULT_PASSWORD_FILE"])
    if environ.get("ANSIBLE_VAULT_IDENTITY_LIST"):
        ids = [i.split("@", 1) if "@" in i else [i] for i in environ["ANSIBLE_VAULT_IDENTITY_LIST"].split(",") if i]
        out["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join("@".join([*i[:-1], absolute(i[-1])]) for i in ids)
    return out


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or "failed"
    text = str(msg).strip().splitlines()
    return text[0] if text else "failed"


KEEP_RUNS = 100


def prune_runs(keep: int = KEEP_RUNS) -> None:
    """Keep the newest ``keep`` run directories under the state dir (names sort by time)."""
    import shutil

    runs = paths.state_dir() / "runs"
    if runs.is_dir():
        for old in sorted(p for p in runs.iterdir() if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def run_playbook(req: RunRequest) -> RunResult:
    """Run ``playbooks/<req.playbook>`` and summarise it per host. Raises RunError only when the run
    could not start at all; host failures are in the result."""
    import ansible_runner

    run_id = req.run_id or new_run_id()
    prune_runs()
    pdd = paths.state_dir() / "runs" / run_id
    (pdd / "env").mkdir(parents=True, exist_ok=True)
    vars_file = pdd / "knob_vars.yml"
    # The CLI restores and verifies from the controller with its own rule (ops/transaction.py): the role's
    # on-host restore and verify steps, there for plain ansible-playbook, stay off under knobfleet.
    trusted = {**CLI_ROLE_VARS, **req.trusted_vars}
    # The fleet's marker key (fleet/fleetkey.py): the hosts make the same <secret hmac:…> markers as this
    # controller. It stays in this 0600 file and reaches modules only as no_log options.
    from knobfleet.fleet.fleetkey import fleet_key

    unsafe = {"knob_serve_secret_key": fleet_key(), **req.unsafe_vars}
    vars_file.write_text(dump_vars(trusted, unsafe), encoding="utf-8")
    os.chmod(vars_file, 0o600)
    playbook = paths.playbooks_dir() / req.playbook
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    cmdline = f"-e @{vars_file}" + (" --check" if req.check else "") + (" --diff" if req.diff else "")
    if verbosity() > 1:
        cmdline += " -" + "v" * (verbosity() - 1)
    result = RunResult(run_id, 0, "", {}, pdd / "artifacts" / run_id, 0.0)

    def handler(event: Event) -> bool:
        fold_event(result, event)
        if req.on_event:
            req.on_event(event)
        return True  # keep the event in the run's artifacts

    envvars = _env(req.forks)
    if req.verbose:
        sys.stderr.write(f"knobfleet: ansible-playbook {playbook}; artifacts in {pdd / 'artifacts' / run_id}\n")
    started = time.monotonic()
    with _signals(req.cancel) as cancel:
        r = _run(ansible_runner, req, pdd, playbook, cmdline, envvars, run_id, handler, cancel)
    result.wall_s = time.monotonic() - started
    return _summarise(r, req, result)


@contextlib.contextmanager
def _signals(cancel: Callable[[], bool] | None) -> Iterator[Callable[[], bool]]:
    """The cancel callback of a run. ansible-runner, given none, installs SIGINT/SIGTERM handlers of its own that
    SIGKILL ansible-playbook and are never put back (a host is then left locked mid-apply). Here: when knobfleet
    handles the signals itself (ops/interrupts: the play finishes, then the rollout restores), they are left
    alone; otherwise a signal during the run stops it as ansible-runner would, the handlers are put back after,
    and the signal is raised as KeyboardInterrupt once the run has returned."""
    if cancel is not None:
        yield cancel
        return
    import signal
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return
    got: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt


def limit_lines(hosts: tuple[str, ...]) -> str:
    """Ansible's --limit file for exactly ``hosts`` (pure): one anchored, escaped regex pattern a line, so a name
    with a space, ``,``, ``:``, ``!``, ``&``, ``*`` or ``[n]`` is that host, never split or read as a pattern."""
    import re

    return "".join(f"~^{re.escape(h)}$\n" for h in hosts)


def exact_limit(hosts: tuple[str, ...], pdd: Path) -> str | None:
    """--limit @FILE naming exactly ``hosts`` (``limit_lines``), written in the run's folder; None for no limit."""
    if not hosts:
        return None
    path = pdd / "limit.txt"
    path.write_text(limit_lines(hosts), encoding="utf-8")
    return f"@{path}"


def _run(
    ansible_runner: Any,
    req: RunRequest,
    pdd: Path,
    playbook: Path,
    cmdline: str,
    envvars: dict[str, str],
    run_id: str,
    handler: Callable[[Event], bool],
    cancel: Callable[[], bool],
) -> Any:
    try:
        return ansible_runner.run(
            private_data_dir=str(pdd),
            playbook=str(playbook),
            inventory=str(req.inventory.resolve()),
            limit=exact_limit(req.hosts, pdd),
            cmdline=cmdline,
            envvars=envvars,
            quiet=not req.verbose,
            ident=run_id,
            event_handler=handler,
            # pexpect_timeout: how often ansible-runner looks at a silent ansible-playbook (and at req.cancel)
            settings={"suppress_ansible_output": not req.verbose, "pexpect_timeout": 0.1},
            cancel_callback=cancel,
            **({} if "forks" in user_settings() else {"forks": req.forks}),
        )
    except Exception as exc:  # ansible-runner raises plain exceptions for setup problems
        raise RunError(f"ansible-runner could not start {req.playbook}: {exc}") from None


def _summarise(r: Any, req: RunRequest, result: RunResult) -> RunResult:
    result.rc, result.status = int(r.rc), str(r.status)
    stats = r.stats or {}
    for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed")):
        for host, n in (stats.get(key) or {}).items():
            setattr(result.host(host), attr, int(n))
    for host in stats.get("dark") or {}:
        result.host(host).unreachable = True
    if r.status in ("failed", "error", "timeout") and not result.hosts:
        out = ""
        try:
            out = r.stdout.read()[-2000:]
        except Exception:
            out = ""
        raise RunError(f"{req.playbook}: ansible-playbook failed before reaching any host (rc {r.rc}): {fatal(out)}")
    return result


def fatal(output: str) -> str:
    """ansible-playbook's own reason, for a one-line error: its ``ERROR!`` line (warnings before it repeat it over
    several lines), else the last line it wrote; escaped, and cut at 300 characters."""
    from knobfleet.rules import shown

    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    line = next((ln for ln in lines if ln.startswith("ERROR!")), lines[-1] if lines else "no output")
    line = shown(line.removeprefix("ERROR!").strip())
    return line if len(line) <= 300 else line[:297] + "..."
