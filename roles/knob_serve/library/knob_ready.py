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
  - Returns the main PID and, when the service's paths are given, the probe document of the ready engine
    (module_utils knob_observe), which knobfleet checks with its live-state rule.
version_added: "0.1.0"
author: knobfleet
options:
  service:
    description: The systemd unit (with or without C(.service)).
    type: str
    required: true
  url:
    description: Health URL that must answer 200.
    type: str
    required: true
  timeout_s:
    description: Readiness deadline in seconds.
    type: int
    default: 600
  grace_s:
    description: Seconds the same main process must stay up after readiness.
    type: int
    default: 0
  since_restart:
    description: Recorded with the result (the wait follows a restart).
    type: bool
    default: false
  daemon_reload:
    description: Run C(systemctl daemon-reload) first.
    type: bool
    default: false
  enable:
    description: Enable the unit when it is not.
    type: bool
    default: false
  restart:
    description: Restart the unit.
    type: bool
    default: false
  start:
    description: Start the unit when it is not active (ignored with C(restart)).
    type: bool
    default: false
  script_path:
    description: With C(unit_path) and C(state_dir), return the ready engine's probe document.
    type: path
  unit_path:
    description: The installed unit (for the probe document).
    type: path
  state_dir:
    description: The service's state folder (for the probe document).
    type: path
  info_url:
    description: The engine's info URL (for the probe document).
    type: str
    default: ""
  secret:
    description: Secret env names or patterns; values leave the host only as hashes.
    type: list
    elements: str
    default: []
  secret_key:
    description: The fleet's key for secret markers (knobfleet passes its own); empty shows secrets as C(<secret>).
    type: str
    default: ""
  phases:
    description:
      - The engine's start-up phases (its catalog's C(serve.startup_phases)), each C(name) and C(pattern) (a
        regular expression searched in the unit's journal lines since the start). A phase ends at its last
        matching line before the engine was ready.
    type: list
    elements: dict
    default: []
  run_id:
    description: Recorded with the start in the ledger.
    type: str
    default: ""
  cache_dir:
    description:
      - The engine's compile cache folder (the role's C(knob_serve_cache.dir); empty when no cache is kept). Read
        before the restart (module_utils knob_cache) and recorded with the start as C(cold), C(warm) or C(off).
        Without it, nothing is recorded.
    type: str
notes:
  - Supports check mode (reports what it would do in C(would)).
"""

EXAMPLES = r"""
- name: Restart the engine and wait until it answers
  knobfleet.serving.knob_ready:
    service: sglang-decode.service
    url: http://127.0.0.1:30000/health_generate
    daemon_reload: true
    restart: true
    timeout_s: 900
    grace_s: 30
"""

RETURN = r"""
step:
  description: Always C(ready); knobfleet keys results by it.
  returned: always
  type: str
  sample: ready
done:
  description: What was done (daemon-reload, enable, restart, start).
  returned: success
  type: list
  elements: str
  sample: [daemon-reload, restart]
systemctl_s:
  description: Seconds each systemctl verb took (C(restart) includes the old engine's stop).
  returned: success
  type: dict
  sample: {daemon-reload: 0.12, restart: 1.4}
ready_s:
  description: Seconds until the health URL answered 200, counted from after the restart or start.
  returned: success
  type: float
  sample: 1.7
main_pid:
  description: The engine's main PID once ready.
  returned: success
  type: int
  sample: 577
probe:
  description: The probe document of the ready engine (when the paths were given).
  returned: success
  type: dict
startup:
  description:
    - What this start cost (only when the module restarted or started the engine), from the unit's timestamps,
      the first health 200 and the journal (module_utils knob_startup). With C(state_dir) it is also appended to
      the service's ledger (event C(start)), keyed by generation, profile and engine version.
  returned: when the engine was restarted or started
  type: dict
  sample:
    kind: restart
    stop_s: 0.4
    pre_s: 0.02
    start_s: 31.7
    phases: [{phase: weights, s: 9.1, end_s: 9.1}, {phase: serving, s: 2.0, end_s: 31.6}]
    cache: warm
"""

import re
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.knob_cache import cache_state
from ansible.module_utils.knob_observe import observe, parse_props, read_bounded
from ansible.module_utils.knob_redact import redact_text, secret_values
from ansible.module_utils.knob_startup import TIMESTAMPS, compile_phases, journal_entries, phases, timing

PROPS = ("MainPID", "NRestarts", "ActiveState", "SubState", "ControlGroup", "ExecMainStatus")


def show(module, service):
    rc, out, err = module.run_command(["systemctl", "show", service, "--property=" + ",".join(PROPS)])
    if rc != 0:
        module.fail_json(step="ready", msg="systemctl show %s failed: %s" % (service, err.strip()))
    return parse_props(out)


def journal(module, service, lines=15, scan=400, since=None):
    """The unit's last log lines, with the serve script's secret values hidden (an engine may log its arguments:
    SGLang prints its server args, --api-key included). The last ``lines`` are kept; when the engine's own last
    error (see ``last_error``) is further up, it is put first, so that the cause of a failed start survives the
    restart noise systemd logs after it. ``since`` (UNIX time): only lines logged from then on, so that an earlier
    start's error is never taken for this one's."""
    window = ["--since", "@%d" % int(since)] if since else []
    rc, out, _ = module.run_command(["journalctl", "-u", service, "-n", str(scan), *window, "--no-pager", "-o", "cat"])
    if rc != 0:
        return []
    p = module.params
    values = []
    if p.get("script_path"):
        try:  # bounded, never a FIFO or a link
            values = secret_values(
                read_bounded(p["script_path"], single_link=False)[0].decode("utf-8", "replace"), p.get("secret") or []
            )
        except OSError:
            values = []
    text = redact_text(out.strip(), p.get("secret") or [], p.get("secret_key", ""), values).splitlines()
    tail = text[-lines:]
    cause = last_error(text)
    return ([cause] if cause and cause not in tail else []) + tail


# A Python exception line as a traceback ends it ("NotImplementedError: ...", "ValueError: ...",
# "a.b.CustomError: ...").
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def last_error(lines):
    """The last line of the log that is a Python exception (what a traceback ends with), or None."""
    for line in reversed(lines):
        text = line.strip()
        if len(text) <= 2000 and _ERROR_LINE.match(text):
            return text
    return None


def failed(journal_lines):
    """The message suffix naming the engine's own last error, when its log has one."""
    cause = last_error(journal_lines)
    return "; the engine's last error: %s" % cause if cause else ""


def health(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def systemctl(module, *args):
    rc, out, err = module.run_command(["systemctl", *args])
    if rc != 0:
        module.fail_json(
            step="ready",
            msg="systemctl %s failed: %s" % (" ".join(args), (err or out).strip()),
            journal=journal(module, args[-1]) if args[0] in ("restart", "start") else [],
        )
    return out.strip()


def bring_up(module, p, timings=None):
    """daemon-reload / enable / restart / start as asked; returns what was done (empty: nothing). ``timings``
    gets the seconds each verb took (a restart's include the old engine's own stop)."""
    service, done = p["service"], []
    enabled = module.run_command(["systemctl", "is-enabled", service])[1].strip()
    active = module.run_command(["systemctl", "is-active", service])[1].strip()
    wants = [
        ("daemon-reload", p["daemon_reload"]),
        ("enable", p["enable"] and enabled != "enabled"),
        ("restart", p["restart"]),
        ("start", p["start"] and not p["restart"] and active != "active"),
    ]
    for verb, wanted in wants:
        if wanted:
            done.append(verb)
            if not module.check_mode:
                t0 = time.monotonic()
                systemctl(module, *([verb] if verb == "daemon-reload" else [verb, service]))
                if timings is not None:
                    timings[verb] = round(time.monotonic() - t0, 3)
    return done


def measure_start(module, p, done, begun, ready_us, cache=None):
    """The start's cost (knob_startup) when this call restarted or started the engine, else None; a journal that
    cannot be read leaves the phases out, never the start."""
    if "restart" not in done and "start" not in done:
        return None
    rc, out, _ = module.run_command(["systemctl", "show", p["service"], "--property=" + ",".join(TIMESTAMPS)])
    t = timing(parse_props(out), ready_us, "restart" in done) if rc == 0 else None
    if t is None:
        return None
    rc, out, _ = module.run_command(
        ["journalctl", "-u", p["service"], "--since", "@%d" % int(begun), "-n", "5000", "--no-pager", "-o", "json",
         "--output-fields=MESSAGE"]
    )  # fmt: skip
    try:
        patterns = compile_phases(p["phases"])
    except ValueError as exc:
        module.warn("start-up phases not read: %s" % exc)
        patterns = []
    found = phases(journal_entries(out), patterns, t["main_us"], ready_us) if rc == 0 and patterns else []
    return {
        "kind": "restart" if "restart" in done else "start",
        "stop_s": t["stop_s"],
        "pre_s": t["pre_s"],
        "start_s": t["start_s"],
        "phases": found,
        "cache": cache,
    }


def record_start(module, p, startup, probe):
    """Append the start to the service's ledger (event ``start``), keyed by the generation it ran, its profile and
    the engine version the probe read; a ledger that cannot be written is a warning (the engine is up)."""
    from ansible.module_utils.knob_store import Store, now

    store = Store(p["state_dir"])
    try:
        number = store.current()
        meta = store.meta(number) if number is not None else {}
    except (OSError, ValueError):
        number, meta = None, {}
    package = (probe or {}).get("engine_package") or {}
    entry = dict(
        startup,
        time=now(),
        event="start",
        generation=number,
        profile=meta.get("profile"),
        version=meta.get("version"),
        hash=meta.get("hash"),
        engine_version=package.get("version") or (probe or {}).get("engine_version"),
        run_id=p["run_id"],
    )
    try:
        store.append_ledger(entry)
    except OSError as exc:
        module.warn("the start was not recorded in %s: %s" % (store.ledger, exc.strerror or exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            url=dict(type="str", required=True),
            timeout_s=dict(type="int", default=600),
            grace_s=dict(type="int", default=0),
            since_restart=dict(type="bool", default=False),
            daemon_reload=dict(type="bool", default=False),
            enable=dict(type="bool", default=False),
            restart=dict(type="bool", default=False),
            start=dict(type="bool", default=False),
            script_path=dict(type="path"),
            unit_path=dict(type="path"),
            state_dir=dict(type="path"),
            info_url=dict(type="str", default=""),
            secret=dict(type="list", elements="str", default=[]),
            secret_key=dict(type="str", default="", no_log=True),
            phases=dict(type="list", elements="dict", default=[]),
            run_id=dict(type="str", default=""),
            cache_dir=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    timings = {}
    begun = time.time() - 1  # journal lines of this start only (journalctl --since has whole seconds)
    cache = None if p["cache_dir"] is None else cache_state(p["cache_dir"])  # what this start will find
    done = bring_up(module, p, timings)
    changed = any(verb != "daemon-reload" for verb in done)
    if module.check_mode:
        module.exit_json(changed=changed, step="ready", would=done)
    started = time.monotonic()
    first = show(module, p["service"])
    pid0, restarts0 = first.get("MainPID", "0"), int(first.get("NRestarts", "0") or 0)
    deadline = started + p["timeout_s"]

    def check_alive(phase):
        now = show(module, p["service"])
        restarts = int(now.get("NRestarts", "0") or 0)
        if now.get("ActiveState") in ("failed", "inactive") or now.get("MainPID", "0") == "0":
            log = journal(module, p["service"], since=begun)
            module.fail_json(
                step="ready",
                msg="engine exited %s (unit %s, exit status %s)%s"
                % (phase, now.get("ActiveState"), now.get("ExecMainStatus"), failed(log)),
                journal=log,
                state=now,
                waited_s=round(time.monotonic() - started, 2),
            )
        if restarts > restarts0 or (pid0 != "0" and now.get("MainPID") != pid0):
            log = journal(module, p["service"], since=begun)
            module.fail_json(
                step="ready",
                msg="systemd restarted the engine %s (main PID %s -> %s, restarts %d -> %d)%s"
                % (phase, pid0, now.get("MainPID"), restarts0, restarts, failed(log)),
                journal=log,
                state=now,
                waited_s=round(time.monotonic() - started, 2),
            )
        return now

    status = None
    while True:
        state = check_alive("during start-up")
        status = health(p["url"])
        if status == 200:
            ready_us = int(time.monotonic() * 1e6)
            break
        if time.monotonic() > deadline:
            log = journal(module, p["service"], since=begun)
            module.fail_json(
                step="ready",
                msg="not ready after %ds: %s answered %s%s"
                % (p["timeout_s"], p["url"], status or "nothing (connection refused)", failed(log)),
                journal=log,
                state=state,
                waited_s=round(time.monotonic() - started, 2),
            )
        time.sleep(0.1)
    ready_s = time.monotonic() - started
    grace_end = time.monotonic() + p["grace_s"]
    while time.monotonic() < grace_end:
        state = check_alive("within %ds after becoming ready" % p["grace_s"])
        time.sleep(0.25)
    state = check_alive("right after becoming ready")
    result = dict(
        changed=changed,
        step="ready",
        done=done,
        ready_s=round(ready_s, 3),
        systemctl_s=timings,
        main_pid=int(state["MainPID"]),
        n_restarts=int(state.get("NRestarts", "0") or 0),
    )
    startup = measure_start(module, p, done, begun, ready_us, cache)
    if startup is not None:
        result["startup"] = startup
    if p["script_path"] and p["unit_path"] and p["state_dir"]:
        result["probe"] = observe(
            {
                "service": p["service"].rsplit(".service", 1)[0],
                "script_path": p["script_path"],
                "unit_path": p["unit_path"],
                "state_dir": p["state_dir"],
                "health_url": p["url"],
                "info_url": p["info_url"],
                "secret": p["secret"],
                "secret_key": p.get("secret_key", ""),
            }
        )
    if startup is not None and p["state_dir"]:
        record_start(module, p, startup, result.get("probe"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
