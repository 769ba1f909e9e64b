"""What runs the engine on a host (its runtime), as the host sees it: the container runtimes' run line and their
view of the running container. Shared by the on-host modules and the controller (stdlib only).

Three runtimes (the controller's registry is python/knobfleet/runtimes.py):

- ``systemd``: the serve script ``exec``s the engine, which is the unit's main process; its processes are the
  unit's cgroup.
- ``docker`` and ``podman``: the serve script ``exec``s ``docker run``/``podman run`` in the foreground (the unit's
  main process is the client, as in the unit people write by hand), the knobs passed through as ``--env NAME`` from
  the script's own ``export`` lines (the values never on a command line), the image pinned to its ID. The engine is
  the container's process: its host PID comes from the runtime (``inspect``), and its environ and command line are
  read from ``/proc`` on the host, never from the runtime's own report (``Config.Env`` is what was asked for: an
  entrypoint or a CDI spec may change what runs).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: ``typing`` (and json, re, subprocess below) would cost every probe milliseconds
    from typing import Any

CONTAINER_RUNTIMES = ("docker", "podman")
RUNTIMES = ("systemd", *CONTAINER_RUNTIMES)
BINARIES = {"docker": "/usr/bin/docker", "podman": "/usr/bin/podman"}

# Options of `docker run` / `podman run` that take a value as the next word (the run line knobfleet writes uses
# --opt=value only; these read a hand-written one, adopted as generation 0). Any other option is a flag.
VALUED = frozenset(
    [
        "-a",
        "--attach",
        "--add-host",
        "--annotation",
        "--blkio-weight",
        "--cap-add",
        "--cap-drop",
        "--cgroup-parent",
        "--cgroupns",
        "--cgroups",
        "--cidfile",
        "--conmon-pidfile",
        "--cpu-period",
        "--cpu-quota",
        "--cpu-shares",
        "--cpus",
        "--cpuset-cpus",
        "--cpuset-mems",
        "--device",
        "--dns",
        "--dns-option",
        "--dns-search",
        "-e",
        "--entrypoint",
        "--env",
        "--env-file",
        "--expose",
        "--gpus",
        "--group-add",
        "--health-cmd",
        "--health-interval",
        "--health-retries",
        "--health-start-period",
        "--health-timeout",
        "-h",
        "--hostname",
        "--init-path",
        "--ip",
        "--ip6",
        "--ipc",
        "-l",
        "--label",
        "--label-file",
        "--log-driver",
        "--log-opt",
        "--mac-address",
        "-m",
        "--memory",
        "--memory-reservation",
        "--memory-swap",
        "--mount",
        "--name",
        "--net",
        "--network",
        "--network-alias",
        "--oom-score-adj",
        "--pid",
        "--pids-limit",
        "--platform",
        "--pod",
        "-p",
        "--publish",
        "--pull",
        "--restart",
        "--runtime",
        "--sdnotify",
        "--security-opt",
        "--shm-size",
        "--stop-signal",
        "--stop-timeout",
        "--storage-opt",
        "--sysctl",
        "--systemd",
        "--tmpfs",
        "-u",
        "--user",
        "--ulimit",
        "--userns",
        "--uts",
        "-v",
        "--volume",
        "--volumes-from",
        "-w",
        "--workdir",
    ]
)


def is_run_line(argv: list[str]) -> bool:
    """Whether an exec line starts a container: ``docker run``/``podman run`` (also ``container run``)."""
    if len(argv) < 2 or os.path.basename(argv[0]) not in CONTAINER_RUNTIMES:
        return False
    rest = argv[1:]
    if rest[:2] == ["container", "run"]:
        return True
    return rest[0] == "run"


def split_run_line(argv: list[str]) -> dict[str, Any] | None:
    """Pure: a container run line's parts — ``runtime``, ``options`` (the words before the image), ``image``,
    ``engine`` (the command the container runs: what its process's cmdline must be), ``env`` (the names passed
    with ``--env NAME``/``-e NAME`` and the pairs of ``--env NAME=value``), ``name``, ``restart`` (a
    ``--restart`` policy, or None) and ``stop_timeout``; None for a line that starts no container or names no
    image."""
    if not is_run_line(argv):
        return None
    i = 3 if argv[1] == "container" else 2
    options: list[str] = []
    values: dict[str, list[str]] = {}
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, eq, value = word.partition("=")
        if not eq and name in VALUED and i + 1 < len(argv):
            value = argv[i + 1]
            options += [word, value]
            i += 2
        else:
            options.append(word)
            i += 1
        if eq or name in VALUED:
            values.setdefault(name, []).append(value)
    if i >= len(argv):
        return None
    env_names, env_pairs = [], {}
    for item in values.get("--env", []) + values.get("-e", []):
        key, eq, value = item.partition("=")
        if eq:
            env_pairs[key] = value
        else:
            env_names.append(key)

    def last(name: str) -> str | None:
        got = values.get(name)
        return got[-1] if got else None

    timeout = last("--stop-timeout")
    return {
        "runtime": os.path.basename(argv[0]),
        "options": options,
        "image": argv[i],
        "engine": argv[i + 1 :],
        "env_names": env_names,
        "env_pairs": env_pairs,
        "name": last("--name"),
        "restart": last("--restart"),
        "stop_timeout": int(timeout) if timeout is not None and timeout.isdigit() else None,
        "pull": last("--pull"),
    }


def ask(runtime: str, args: list[str], timeout_s: float) -> tuple[int, bytes, str]:
    """Run the runtime's client with ``args`` (read-only subcommands only: inspect), bounded by ``timeout_s``:
    (exit status, stdout at most 1 MiB, ""), or (-1, b"", why) when it is not installed or could not run."""
    import subprocess

    binary = BINARIES.get(runtime)
    if binary is None or not os.path.exists(binary):
        return -1, b"", "%s is not installed (%s)" % (runtime, binary)
    try:
        proc = subprocess.run([binary, *args], capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, b"", "%s %s: %s" % (runtime, " ".join(args[:2]), exc)
    return proc.returncode, proc.stdout[: 1 << 20], ""


def inspect(runtime: str, name: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The runtime's view of the container ``name``: ``{"found": False}``, or its host PID (``pid``, 0 when not
    running), ``image_id``, ``image`` (as named when started), ``restart`` policy and ``started``; ``error``
    when the runtime could not be asked (missing, hung: bounded by ``timeout_s``)."""
    import json

    rc, out, why = ask(runtime, ["container", "inspect", "--format", "{{json .}}", name], timeout_s)
    if why:
        return {"found": False, "error": why}
    if rc != 0:
        return {"found": False}
    try:  # docker prints one object a line; podman 4.3 prints its whole array, indented, whatever the format
        doc = json.loads(out.decode("utf-8", "replace"))
    except ValueError:
        return {"found": False, "error": "%s container inspect %s: not JSON" % (runtime, name)}
    return view(doc[0] if isinstance(doc, list) and doc else doc)


def view(doc: Any) -> dict[str, Any]:
    """Pure: what knobfleet keeps of one ``container inspect`` document (docker's and podman's shapes; the recorded
    ones are in tests/data/runtimes)."""
    if not isinstance(doc, dict):
        return {"found": False, "error": "container inspect: not an object"}
    state, config, host = _obj(doc.get("State")), _obj(doc.get("Config")), _obj(doc.get("HostConfig"))
    policy = _obj(host.get("RestartPolicy"))
    pid = state.get("Pid")
    image_id = str(doc.get("Image") or "")
    return {
        "found": True,
        "pid": pid if isinstance(pid, int) and pid > 0 and state.get("Running") else 0,
        "running": bool(state.get("Running")),
        "image_id": image_id if image_id.startswith("sha256:") or not image_id else "sha256:" + image_id,
        "image": str(doc.get("ImageName") or config.get("Image") or ""),
        "restart": str(policy.get("Name") or "") or None,
        "started": str(state.get("StartedAt") or ""),
    }


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def image_id(runtime: str, ref: str, timeout_s: float = 10.0) -> tuple[str | None, str]:
    """The ID of the local image ``ref`` (nothing is pulled): (``sha256:…``, "") or (None, why)."""
    rc, raw, why = ask(runtime, ["image", "inspect", "--format", "{{.Id}}", ref], timeout_s)
    out = raw.decode("utf-8", "replace").strip()
    if why or rc != 0 or not out:
        return None, why or "no image %s on this host" % ref
    return (out if out.startswith("sha256:") else "sha256:" + out), ""


def image_config(runtime: str, ref: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The local image's config (``Env``, ``Labels``: where an image carries its CUDA version), {} when it cannot
    be read; nothing is pulled."""
    import json

    rc, out, why = ask(runtime, ["image", "inspect", "--format", "{{json .Config}}", ref], timeout_s)
    try:
        doc = json.loads(out.decode("utf-8", "replace")) if rc == 0 and not why else {}
    except ValueError:
        return {}
    doc = doc[0] if isinstance(doc, list) and doc else doc
    return doc if isinstance(doc, dict) else {}


def descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """``pid`` and every process under it (its workers), from ``/proc/*/stat``'s parent fields; bounded by the
    process table."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return [pid]
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "stat"), "rb") as f:
                stat = f.read(4096).decode("utf-8", "replace")
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo.extend(children.get(p, []))
    return sorted(out)


def container_view(files: dict[str, Any], props: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """Under a container runtime, the container the unit runs as its runtime names it, with the processes of its tree
    read from /proc (the engine and its workers), or None (systemd: the engine is the unit's main process). The
    runtime and the container's name come from the installed files themselves: the serve script's exec line, else a
    hand-written unit's ExecStart (``docker run``/``podman run``, ``knob_runtime.split_run_line``)."""
    from .knob_procfs import boot_time, process
    from .knob_shell import script_env_argv

    run = None
    script = (files.get("script") or {}).get("content")
    if script:
        run = split_run_line(script_env_argv(script)[1])
    if run is None:
        run = split_run_line(exec_start((files.get("unit") or {}).get("content") or ""))
    if run is None:
        return None
    name = run.get("name") or ""
    seen: dict[str, Any] = (
        inspect(run["runtime"], name, max(timeout, 5.0)) if name else {"found": False, "error": "no --name"}
    )
    btime, hz = boot_time(), os.sysconf("SC_CLK_TCK")
    pid = seen.get("pid")
    tree = descendants(pid) if isinstance(pid, int) and pid > 0 else []
    procs = [x for x in (process(pid, btime, hz) for pid in tree) if x]
    client = str(props.get("MainPID") or "0")
    return {"kind": run["runtime"], "name": name, "client_pid": int(client) if client.isdigit() else 0, **seen,
            "processes": procs}  # fmt: skip


def exec_start(unit: str) -> list[str]:
    """A unit's first ExecStart= command as words (shell-like splitting, a leading ``-``/``@`` prefix dropped); [] when
    there is none."""
    import re
    import shlex

    joined = re.sub(r"\\\n", " ", unit)  # systemd's line continuations
    for line in joined.splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and key.strip() == "ExecStart" and value.strip():
            try:
                words = shlex.split(value)
            except ValueError:
                return []
            if words and words[0][:1] in "-@+!":
                words[0] = words[0].lstrip("-@+!")
            return words
    return []
