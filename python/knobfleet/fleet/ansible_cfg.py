"""The user's own Ansible settings, as ansible-playbook would read them, without importing ansible.

Which file: ``ANSIBLE_CONFIG``, else the project's ``ansible.cfg`` (knobfleet runs playbooks from a per-run
folder, so it points Ansible at that file itself), else ``~/.ansible.cfg``, else ``/etc/ansible/ansible.cfg``
(Ansible's own order, with the project's folder as the working directory). An ``ANSIBLE_*`` environment
variable beats the file, as in Ansible.

knobfleet uses this to override only what the user left at Ansible's default (``runner._env``), and to build
the SSH fast path's command line from the same ssh settings (``connection_defaults``). Pure but for reading
one file; cached per (file, environment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path

# The SSH options knobfleet gives Ansible's ssh plugin (runner.PREFERRED) and the fast path uses itself
# (transports/ssh.py): one source, so both reach a host over the same multiplexed connection.
SSH_ARGS = ("-o", "ControlMaster=auto", "-o", "ControlPersist=300s", "-o", "ServerAliveInterval=15")

# knobfleet's name -> (environment variable, ansible.cfg section, key). Only settings knobfleet has an opinion on.
SETTINGS: dict[str, tuple[str, str, str]] = {
    "pipelining": ("ANSIBLE_PIPELINING", "ssh_connection", "pipelining"),
    "ssh_args": ("ANSIBLE_SSH_ARGS", "ssh_connection", "ssh_args"),
    "ssh_common_args": ("ANSIBLE_SSH_COMMON_ARGS", "ssh_connection", "ssh_common_args"),
    "ssh_extra_args": ("ANSIBLE_SSH_EXTRA_ARGS", "ssh_connection", "ssh_extra_args"),
    "ssh_executable": ("ANSIBLE_SSH_EXECUTABLE", "ssh_connection", "ssh_executable"),
    "control_path": ("ANSIBLE_SSH_CONTROL_PATH", "ssh_connection", "control_path"),
    "forks": ("ANSIBLE_FORKS", "defaults", "forks"),
    "timeout": ("ANSIBLE_TIMEOUT", "defaults", "timeout"),
    "remote_user": ("ANSIBLE_REMOTE_USER", "defaults", "remote_user"),
    "remote_port": ("ANSIBLE_REMOTE_PORT", "defaults", "remote_port"),
    "private_key_file": ("ANSIBLE_PRIVATE_KEY_FILE", "defaults", "private_key_file"),
    "interpreter_python": ("ANSIBLE_PYTHON_INTERPRETER", "defaults", "interpreter_python"),
    "local_tmp": ("ANSIBLE_LOCAL_TEMP", "defaults", "local_tmp"),
    "roles_path": ("ANSIBLE_ROLES_PATH", "defaults", "roles_path"),
    "module_utils": ("ANSIBLE_MODULE_UTILS", "defaults", "module_utils"),
    "nocolor": ("ANSIBLE_NOCOLOR", "defaults", "nocolor"),
    "deprecation_warnings": ("ANSIBLE_DEPRECATION_WARNINGS", "defaults", "deprecation_warnings"),
    "system_warnings": ("ANSIBLE_SYSTEM_WARNINGS", "defaults", "system_warnings"),
    "become": ("ANSIBLE_BECOME", "privilege_escalation", "become"),
    "connection": ("ANSIBLE_TRANSPORT", "defaults", "transport"),
}
# Pipelining may also be set in [defaults] or [connection] (ansible-core reads all three).
_ALSO = {"pipelining": (("defaults", "pipelining"), ("connection", "pipelining"))}


def config_file(project_dir: Path | None = None) -> Path | None:
    """The ansible.cfg Ansible reads for a run from ``project_dir`` (None: none exists). One that is there but is
    not a regular file (a FIFO, a device, a socket: Ansible would hang or fail reading it at start, before any
    message) is refused with one line (UsageError), before Ansible is imported or started."""
    env = os.environ.get("ANSIBLE_CONFIG")
    if env:
        p = Path(env).expanduser()
        chosen = p / "ansible.cfg" if p.is_dir() else p
        _refuse_special(chosen, "ANSIBLE_CONFIG")
        return chosen
    candidates = [Path.cwd() / "ansible.cfg"] if _cwd_readable() else []
    candidates += [project_dir / "ansible.cfg"] if project_dir else []
    candidates += [Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg")]
    for c in candidates:
        _refuse_special(c, "ansible.cfg")
    return next((c for c in candidates[1 if _cwd_readable() else 0 :] if c.is_file()), None)


def _cwd_readable() -> bool:
    try:
        os.getcwd()
    except OSError:
        return False
    return True


def _refuse_special(path: Path, what: str) -> None:
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return  # absent (or unreachable): Ansible skips it too
    if not stat.S_ISREG(st.st_mode):
        from knobfleet import paths, safefile
        from knobfleet.errors import UsageError
        from knobfleet.rules import shown

        raise UsageError(
            f"{what} {shown(paths.display(path))}: {safefile.kind(st.st_mode)}; Ansible reads it at start and would "
            "hang or fail: make it a regular file or point ANSIBLE_CONFIG at one"
        )


@cache
def _read(path: str | None, mtime: float) -> dict[str, str]:
    """The settings ``path`` sets; kept in ``<state>/cache/ansible-cfg.json`` by path, mtime and size, so that a
    read-only command does not import configparser (~4 ms, a dozen regexes) to find the same values again."""
    if path is None:
        return {}
    import json

    from knobfleet import paths, safefile
    from knobfleet.errors import KnobfleetError

    try:
        stamp = [path, mtime, os.stat(path).st_size]
    except OSError:
        return _parse(path)
    cached = paths.state_dir() / "cache" / "ansible-cfg.json"
    try:
        doc = json.loads(safefile.read_cache(cached) or "null")
        if doc.get("stamp") == stamp and isinstance(doc.get("values"), dict):
            return {str(k): str(v) for k, v in doc["values"].items()}
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    values = _parse(path)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        safefile.write_text(cached, json.dumps({"stamp": stamp, "values": values}, sort_keys=True))
    except (OSError, KnobfleetError):  # a FIFO, device, symlink or folder there: refused, never written through
        pass  # only costs the parse next time
    return values


def _parse(path: str) -> dict[str, str]:
    import configparser  # only where an ansible.cfg is found, and not cached

    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    out: dict[str, str] = {}
    for name, (_env, section, key) in SETTINGS.items():
        for sec, k in ((section, key), *_ALSO.get(name, ())):
            if parser.has_option(sec, k):
                out[name] = parser.get(sec, k).strip()
                break
    return out


def user_settings(project_dir: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings the user set (environment or ansible.cfg), by knobfleet's name; unset ones are absent."""
    environ = os.environ if environ is None else environ
    path = config_file(project_dir)
    try:
        mtime = path.stat().st_mtime if path else 0.0
    except OSError:
        path, mtime = None, 0.0
    out = dict(_read(str(path) if path else None, mtime))
    for name, (env, _section, _key) in SETTINGS.items():
        if env in environ:
            out[name] = environ[env]
    return out


def truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on", "y", "t")


def connection_defaults(settings: Mapping[str, str]) -> dict[str, str]:
    """ansible.cfg's connection settings as the inventory vars they are defaults of (host vars win)."""
    names = {
        "ssh_args": "ansible_ssh_args",
        "ssh_common_args": "ansible_ssh_common_args",
        "ssh_extra_args": "ansible_ssh_extra_args",
        "ssh_executable": "ansible_ssh_executable",
        "remote_user": "ansible_user",
        "remote_port": "ansible_port",
        "private_key_file": "ansible_ssh_private_key_file",
        "interpreter_python": "ansible_python_interpreter",
        "connection": "ansible_connection",
    }
    out = {var: settings[name] for name, var in names.items() if settings.get(name)}
    if truthy(settings.get("become")):
        out["ansible_become"] = "true"
    return out
