#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module: a host's whole observed state for one knobfleet-managed service, as one JSON document."""

from __future__ import annotations

DOCUMENTATION = r"""
module: knob_probe
short_description: Observe a knobfleet-managed engine service (read-only)
description:
  - Returns managed files (sha256, mode, owner, mtime, content when small), systemd unit properties and
    drop-ins, every process of the unit's cgroup with its environ, cmdline and start time, the generations
    and C(current), the lock, the engine's health and /get_server_info.
  - Changes nothing. Bounded in time.
options:
  service: {type: str, required: true}
  script_path: {type: path, required: true}
  unit_path: {type: path, required: true}
  state_dir: {type: path, required: true}
  health_url: {type: str, default: ""}
  info_url: {type: str, default: ""}
  http_timeout_s: {type: float, default: 2.0}
author: knobfleet
"""

import glob
import grp
import hashlib
import json
import os
import pwd
import subprocess
import time
import urllib.error
import urllib.request

MAX_CONTENT = 64 * 1024
PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic",
         "NeedDaemonReload", "FragmentPath", "DropInPaths", "ControlGroup", "UnitFileState", "Result")


def file_info(path):
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path, "exists": False}
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    info = {"path": path, "exists": True, "sha256": hashlib.sha256(data).hexdigest(), "mode": "%04o" % (st.st_mode & 0o7777),
            "owner": owner, "group": group, "mtime": st.st_mtime, "size": st.st_size}
    if len(data) <= MAX_CONTENT:
        info["content"] = data.decode("utf-8", "replace")
    return info


def unit_props(service):
    try:
        out = subprocess.run(["systemctl", "show", service, "--property=" + ",".join(PROPS)], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def boot_time():
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def cgroup_pids(cgroup):
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        path = base + cgroup + "/cgroup.procs"
        if cgroup and os.path.exists(path):
            with open(path) as fh:
                return sorted(int(x) for x in fh.read().split())
    return []


def process(pid, btime, hz):
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env_raw = fh.read()
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            cmd_raw = fh.read()
        with open("/proc/%d/stat" % pid) as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    start_ticks = int(rest[19])
    env = {}
    for item in env_raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "replace")
    return {"pid": pid, "ppid": int(rest[1]), "comm": comm, "env": env,
            "cmdline": [c.decode("utf-8", "replace") for c in cmd_raw.split(b"\0")[:-1]],
            "start_ticks": start_ticks, "start_epoch": btime + start_ticks / float(hz)}


def generations(state_dir):
    out = {"exists": os.path.isdir(state_dir), "current": None, "list": [], "errors": [], "lock": None}
    gens = os.path.join(state_dir, "generations")
    try:
        out["current"] = int(os.path.basename(os.readlink(os.path.join(state_dir, "current"))))
    except (OSError, ValueError):
        pass
    if os.path.isdir(gens):
        for name in sorted(os.listdir(gens)):
            if not name.isdigit():
                continue
            entry = {"generation": int(name), "files": sorted(os.listdir(os.path.join(gens, name)))}
            meta_path = os.path.join(gens, name, "meta.json")
            try:
                with open(meta_path) as fh:
                    entry["meta"] = json.load(fh)
            except (OSError, ValueError) as exc:
                out["errors"].append("%s: %s" % (meta_path, exc))
            out["list"].append(entry)
    cur = out["current"]
    if cur is not None:
        cur_dir = os.path.join(gens, "%04d" % cur)
        out["current_files"] = {}
        if os.path.isdir(cur_dir):
            for name in os.listdir(cur_dir):
                if name != "meta.json":
                    out["current_files"][name] = file_info(os.path.join(cur_dir, name))
    out["ledger"] = ledger_tail(os.path.join(state_dir, "ledger.jsonl"))
    try:
        with open(os.path.join(state_dir, "lock")) as fh:
            out["lock"] = json.load(fh)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        out["lock"] = {"corrupt": str(exc)}
    return out


def ledger_tail(path, max_bytes=128 * 1024):
    """The newest ledger entries (bounded), oldest first; unreadable lines are reported, not hidden."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]
    out = []
    for line in lines:
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": "unreadable", "raw": line[:200].decode("utf-8", "replace")})
    return out


def http_get(url, timeout):
    if not url:
        return None, None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return None, None


def probe(p):
    """The probe document for params ``p`` (the module's options). Standard library only: knobfleet's
    SSH fast path runs this same function with ``python3 -I`` over a multiplexed connection."""
    started = time.time()
    unit = p["service"] + ".service"
    props = unit_props(unit)
    dropins = []
    for pattern in ("/etc/systemd/system/%s.d/*.conf", "/run/systemd/system/%s.d/*.conf",
                    "/usr/lib/systemd/system/%s.d/*.conf"):
        for path in sorted(glob.glob(pattern % unit)):
            dropins.append(file_info(path))
    btime, hz = boot_time(), os.sysconf("SC_CLK_TCK")
    procs = [x for x in (process(pid, btime, hz) for pid in cgroup_pids(props.get("ControlGroup", ""))) if x]
    health, _ = http_get(p["health_url"], p["http_timeout_s"])
    info_status, info_raw = http_get(p["info_url"], p["http_timeout_s"])
    server_info = None
    if info_status == 200 and info_raw:
        try:
            server_info = json.loads(info_raw)
        except ValueError:
            server_info = None
    return {
        "schema_version": 1, "service": p["service"], "unit": unit, "time": started,
        "files": {"script": file_info(p["script_path"]), "unit": file_info(p["unit_path"])},
        "dropins": dropins, "unit_props": props, "processes": procs,
        "generations": generations(p["state_dir"]), "health": health, "health_url": p["health_url"],
        "server_info": server_info, "probe_s": round(time.time() - started, 3),
    }


def main():
    # Imported here, not at the top: the fast path execs this file on hosts without Ansible's module_utils.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(service=dict(type="str", required=True), script_path=dict(type="path", required=True),
                           unit_path=dict(type="path", required=True), state_dir=dict(type="path", required=True),
                           health_url=dict(type="str", default=""), info_url=dict(type="str", default=""),
                           http_timeout_s=dict(type="float", default=2.0)),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, probe=probe(module.params))


if __name__ == "__main__":
    main()
