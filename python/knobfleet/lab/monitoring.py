"""``lab up --monitoring``: a real Prometheus (Debian's 2.42) and node_exporters, on loopback only.

- Prometheus runs on this machine at ``127.0.0.1:19090`` for the default lab, moved by 100 per slot for the
  others (``labid``) (not 9090, so a Prometheus of the machine's own keeps
  its port) with the config ``telemetry.promconfig`` generates from the lab inventory and the shipped rules
  (``monitoring/rules``). It scrapes every engine's ``/metrics``, node_exporter on each lab host, and the
  controller's node_exporter.
- Each lab host runs node_exporter as a transient systemd unit bound to its own address (``127.0.1.N:9100`` in
  the default lab).
- The drift textfile goes to a controller-side node_exporter (``127.0.0.1:19100`` for the default lab, textfile
  collector only):
  ``drift --prom`` describes the fleet as this controller sees it, so it lives with the controller, and the
  "host unreachable" alert keeps working when the host that would otherwise carry the file is the one down.

Processes started here are recorded with their PID and command line in ``<lab>/monitoring/run`` and ended by
PID (after checking the command line) by ``stop``; nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from knobfleet import labid, paths
from knobfleet.errors import LabError
from knobfleet.telemetry.promconfig import Settings, Target, drift_target, engine_target, node_target, render

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView

# The default lab's ports; every other lab's are moved by its slot (``labid``), so labs run side by side.
PROM_PORT = 19090
CONTROLLER_NODE_PORT = 19100
LISTEN_HOST = "127.0.0.1"
NODE_PORT = 9100
PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
NODE_UNIT = "knob-node-exporter"
READY_TIMEOUT_S = 60.0
LAB_INTERVAL_S = 2  # the lab scrapes and evaluates every 2 s so tests see alerts within seconds


@dataclass(frozen=True)
class Endpoint:
    host: str  # inventory host name
    address: str  # where its engine listens
    port: int
    engine: str | None


def monitoring_dir(lab_dir: Path) -> Path:
    return lab_dir / "monitoring"


def textfile_dir(lab_dir: Path) -> Path:
    """Where ``drift --prom`` writes for the controller's node_exporter (``*.prom``)."""
    return monitoring_dir(lab_dir) / "textfile"


def prom_listen(lab_dir: Path) -> str:
    """Where the Prometheus of the lab in ``lab_dir`` listens: 127.0.0.1:19090 for the default lab."""
    return f"{LISTEN_HOST}:{labid.of(lab_dir).port(PROM_PORT)}"


def controller_node_listen(lab_dir: Path) -> str:
    """Where the lab's controller-side node_exporter (the drift textfile) listens: 127.0.0.1:19100 for the default."""
    return f"{LISTEN_HOST}:{labid.of(lab_dir).port(CONTROLLER_NODE_PORT)}"


def prometheus_url(lab_dir: Path | None = None) -> str:
    """The URL of the Prometheus of the lab in ``lab_dir``; by default of the lab a command means
    (``labid.selected``: KNOBFLEET_LAB, else the one running in this checkout)."""
    if lab_dir is None:
        lab_dir = labid.selected(paths.state_dir())
    return f"http://{prom_listen(lab_dir)}"


def rules_source() -> Path:
    return paths.data_root() / "monitoring" / "rules"


def targets(
    engines: list[Endpoint],
    node_hosts: list[tuple[str, str]],
    extra: Sequence[Target] = (),
    controller_node: str = f"{LISTEN_HOST}:{CONTROLLER_NODE_PORT}",
) -> list[Target]:
    """Every scrape target of the lab: engines, each host's node_exporter, the controller's (at
    ``controller_node``), and ``extra`` (the router's metrics port when the lab has one)."""
    out = [engine_target(e.host, e.address, e.port, e.engine) for e in engines]
    out += [node_target(name, address, NODE_PORT) for name, address in node_hosts]
    out.append(drift_target(controller_node))
    return out + list(extra)


def preflight() -> None:
    for binary, pkg in ((PROMETHEUS, "prometheus"), (NODE_EXPORTER, "prometheus-node-exporter")):
        if not Path(binary).is_file():
            raise LabError(
                f"lab up --monitoring: {binary} not found; install it with `apt-get install -y {pkg}` "
                "(or run `make demo`, which does)"
            )


def _record(run: Path, name: str, proc: subprocess.Popen[bytes]) -> None:
    (run / f"{name}.pid").write_text(f"{proc.pid}\n", encoding="utf-8")


def _ours(pid: int, binary: str) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return argv0.decode(errors="replace") == binary


def _spawn(run: Path, name: str, argv: list[str]) -> None:
    log = (run / f"{name}.log").open("ab")
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log.close()
    _record(run, name, proc)


def _get(url: str) -> int:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def start(
    lab_dir: Path,
    engines: list[Endpoint],
    node_hosts: list[tuple[str, str]],
    ssh_argv: Callable[[str, list[str]], list[str]],
    extra: Sequence[Target] = (),
) -> str:
    """Start node_exporters and Prometheus for the lab; returns Prometheus's URL once it is ready."""
    preflight()
    stop(lab_dir)
    mdir = monitoring_dir(lab_dir)
    run = mdir / "run"
    for d in (run, textfile_dir(lab_dir), mdir / "tsdb", mdir / "rules"):
        d.mkdir(parents=True, exist_ok=True)
    for rules in sorted(rules_source().glob("*.yml")):
        shutil.copy2(rules, mdir / "rules" / rules.name)
    config = render(
        targets(engines, node_hosts, list(extra), controller_node_listen(lab_dir)),
        Settings(LAB_INTERVAL_S, LAB_INTERVAL_S, ("rules/*.yml",), loopback_only=True),
    )
    (mdir / "prometheus.yml").write_text(config, encoding="utf-8")
    _spawn(
        run,
        "node-exporter",
        [
            NODE_EXPORTER,
            f"--web.listen-address={controller_node_listen(lab_dir)}",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfile_dir(lab_dir)}",
        ],
    )
    for name, address in node_hosts:
        # a node_exporter an earlier start left on the host (they end with their hosts, not with `stop`): its
        # transient unit would refuse the new one ("already loaded")
        subprocess.run(ssh_argv(name, ["systemctl", "stop", NODE_UNIT]), capture_output=True, text=True, timeout=60)
        argv = ssh_argv(
            name,
            [
                "systemd-run",
                f"--unit={NODE_UNIT}",
                "--collect",
                "--property=Restart=on-failure",
                NODE_EXPORTER,
                f"--web.listen-address={address}:{NODE_PORT}",
                "--collector.textfile.directory=/var/lib/prometheus/node-exporter",
            ],
        )
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LabError(f"lab up --monitoring: {name}: node_exporter did not start: {proc.stderr.strip()[-300:]}")
    _spawn(
        run,
        "prometheus",
        [
            PROMETHEUS,
            f"--config.file={mdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={mdir / 'tsdb'}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address={prom_listen(lab_dir)}",
            "--web.enable-lifecycle",
        ],
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while _get(f"{prometheus_url(lab_dir)}/-/ready") != 200:
        if time.monotonic() > deadline:
            tail = (run / "prometheus.log").read_text(errors="replace")[-600:]
            stop(lab_dir)
            raise LabError(f"lab up --monitoring: Prometheus not ready after {READY_TIMEOUT_S:.0f}s: {tail}")
        time.sleep(0.2)
    return prometheus_url(lab_dir)


def running(lab_dir: Path) -> bool:
    pid_file = monitoring_dir(lab_dir) / "run" / "prometheus.pid"
    try:
        return _ours(int(pid_file.read_text().strip()), PROMETHEUS)
    except (OSError, ValueError):
        return False


def stop(lab_dir: Path, forget: bool = False) -> list[str]:
    """End the Prometheus and controller node_exporter this lab started (by PID, command line checked); the lab
    hosts' node_exporters end with their hosts. ``forget`` (``lab down``): also remove the series Prometheus kept
    and the drift textfile, so that a lab booted later in the same folder (another test module of a shard) never
    reads hosts of this one. Returns what was stopped."""
    run = monitoring_dir(lab_dir) / "run"
    stopped = []
    for name, binary in (("prometheus", PROMETHEUS), ("node-exporter", NODE_EXPORTER)):
        pid_file = run / f"{name}.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _ours(pid, binary):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _ours(pid, binary) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _ours(pid, binary):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(name)
        pid_file.unlink(missing_ok=True)
    if forget:
        for kept in (monitoring_dir(lab_dir) / "tsdb", textfile_dir(lab_dir)):
            if kept.is_dir() and not kept.is_symlink():
                shutil.rmtree(kept, ignore_errors=True)
    return stopped


def start_for_lab(lab: LabView, extra: Sequence[Target] = ()) -> str:
    """Monitoring for the running lab: its inventory's engines and its hosts' node_exporters."""
    from knobfleet.fleet.inventory import load_hosts

    up = [h for h in lab.status() if h.state == "running"]
    if not up:
        raise LabError("lab up --monitoring: no lab host is running; `knobfleet lab up` first")
    hosts = load_hosts(lab.dir / "inventory")
    engines = [Endpoint(h.host, h.listen_host or h.address, h.port, h.engine) for h in hosts]

    def ssh_argv(name: str, command: list[str]) -> list[str]:
        return lab.ssh_argv(lab.named(name), command)

    return start(lab.dir, engines, [(h.name, h.address) for h in up], ssh_argv, extra)
