#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: (re)start a systemd-managed engine if asked and wait until it is ready, failing fast
when it dies."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_ready
short_description: (Re)start an engine if asked, then wait for its health URL, failing fast on exit or restart
description:
  - First, in this order and only where asked, runs C(systemctl daemon-reload), enables the unit,
    restarts it (C(restart)) or starts it when it is not active (C(start)). One module call instead of
    a systemd task, a restart handler and a wait. In check mode reports what it would change.
  - Polls the health URL until it answers 200 within C(timeout_s).
  - Fails at once when the unit's main process exits, the unit fails, or systemd restarts it.
  - With C(grace_s), keeps watching after readiness that the same main process stays up.
  - Returns the main PID and the environ and cmdline of every process in the unit's cgroup.
options:
  service: {type: str, required: true}
  url: {type: str, required: true}
  timeout_s: {type: int, default: 600}
  grace_s: {type: int, default: 0}
  since_restart: {type: bool, default: false}
  daemon_reload: {type: bool, default: false}
  enable: {type: bool, default: false}
  restart: {type: bool, default: false}
  start: {type: bool, default: false}
author: knobfleet
"""

import os
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

PROPS = ("MainPID", "NRestarts", "ActiveState", "SubState", "ControlGroup", "ExecMainStatus")


def show(module, service):
    rc, out, err = module.run_command(["systemctl", "show", service, "--property=" + ",".join(PROPS)])
    if rc != 0:
        module.fail_json(msg="systemctl show %s failed: %s" % (service, err.strip()))
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props


def journal(module, service, lines=15):
    rc, out, _ = module.run_command(["journalctl", "-u", service, "-n", str(lines), "--no-pager", "-o", "cat"])
    return out.strip().splitlines() if rc == 0 else []


def health(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def cgroup_pids(cgroup):
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        path = base + cgroup + "/cgroup.procs"
        if cgroup and os.path.exists(path):
            with open(path) as fh:
                return sorted(int(x) for x in fh.read().split())
    return []


def process(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env_raw = fh.read()
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            cmd_raw = fh.read()
        with open("/proc/%d/comm" % pid) as fh:
            comm = fh.read().strip()
    except OSError:
        return None
    env = {}
    for item in env_raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "replace")
    cmdline = [c.decode("utf-8", "replace") for c in cmd_raw.split(b"\0")[:-1]]
    return {"pid": pid, "comm": comm, "env": env, "cmdline": cmdline}


def systemctl(module, *args):
    rc, out, err = module.run_command(["systemctl"] + list(args))
    if rc != 0:
        module.fail_json(msg="systemctl %s failed: %s" % (" ".join(args), (err or out).strip()),
                         journal=journal(module, args[-1]) if args[0] in ("restart", "start") else [])
    return out.strip()


def bring_up(module, p):
    """daemon-reload / enable / restart / start as asked; returns what was done (empty: nothing)."""
    service, done = p["service"], []
    enabled = module.run_command(["systemctl", "is-enabled", service])[1].strip()
    active = module.run_command(["systemctl", "is-active", service])[1].strip()
    wants = [("daemon-reload", p["daemon_reload"]), ("enable", p["enable"] and enabled != "enabled"),
             ("restart", p["restart"]), ("start", p["start"] and not p["restart"] and active != "active")]
    for verb, wanted in wants:
        if wanted:
            done.append(verb)
            if not module.check_mode:
                systemctl(module, *([verb] if verb == "daemon-reload" else [verb, service]))
    return done


def main():
    module = AnsibleModule(
        argument_spec=dict(service=dict(type="str", required=True), url=dict(type="str", required=True),
                           timeout_s=dict(type="int", default=600), grace_s=dict(type="int", default=0),
                           since_restart=dict(type="bool", default=False),
                           daemon_reload=dict(type="bool", default=False), enable=dict(type="bool", default=False),
                           restart=dict(type="bool", default=False), start=dict(type="bool", default=False)),
        supports_check_mode=True,
    )
    p = module.params
    done = bring_up(module, p)
    changed = any(verb != "daemon-reload" for verb in done)
    if module.check_mode:
        module.exit_json(changed=changed, would=done)
    started = time.monotonic()
    first = show(module, p["service"])
    pid0, restarts0 = first.get("MainPID", "0"), int(first.get("NRestarts", "0") or 0)
    deadline = started + p["timeout_s"]

    def check_alive(phase):
        now = show(module, p["service"])
        restarts = int(now.get("NRestarts", "0") or 0)
        if now.get("ActiveState") in ("failed", "inactive") or now.get("MainPID", "0") == "0":
            module.fail_json(msg="engine exited %s (unit %s, exit status %s)" % (
                phase, now.get("ActiveState"), now.get("ExecMainStatus")), journal=journal(module, p["service"]),
                state=now, waited_s=round(time.monotonic() - started, 2))
        if restarts > restarts0 or (pid0 != "0" and now.get("MainPID") != pid0):
            module.fail_json(msg="systemd restarted the engine %s (main PID %s -> %s, restarts %d -> %d)" % (
                phase, pid0, now.get("MainPID"), restarts0, restarts), journal=journal(module, p["service"]),
                state=now, waited_s=round(time.monotonic() - started, 2))
        return now

    status = None
    while True:
        state = check_alive("during start-up")
        status = health(p["url"])
        if status == 200:
            break
        if time.monotonic() > deadline:
            module.fail_json(msg="not ready after %ds: %s answered %s" % (p["timeout_s"], p["url"], status or
                                                                         "nothing (connection refused)"),
                             journal=journal(module, p["service"]), state=state,
                             waited_s=round(time.monotonic() - started, 2))
        time.sleep(0.1)
    ready_s = time.monotonic() - started
    grace_end = time.monotonic() + p["grace_s"]
    while time.monotonic() < grace_end:
        state = check_alive("within %ds after becoming ready" % p["grace_s"])
        time.sleep(0.25)
    state = check_alive("right after becoming ready")
    procs = [x for x in (process(pid) for pid in cgroup_pids(state.get("ControlGroup", ""))) if x]
    module.exit_json(changed=changed, done=done, ready_s=round(ready_s, 3), main_pid=int(state["MainPID"]),
                     n_restarts=int(state.get("NRestarts", "0") or 0), processes=procs)


if __name__ == "__main__":
    main()
