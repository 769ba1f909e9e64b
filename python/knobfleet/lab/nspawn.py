"""Boot, inspect and tear down lab hosts: systemd-nspawn containers over an overlay of this machine's root.

Layout under the lab state dir (``.state/lab`` in a checkout, git-ignored)::

    ssh/id_ed25519[.pub]  ssh/known_hosts      the lab's key pair and host keys (strict checking)
    hosts/labN/           a tmpfs holding upper/ work/ root/ (root = the overlay the container boots)
    run/labN.pid          the systemd-nspawn process, run/labN.log its console
    inventory/            an Ansible inventory for the hosts that are up

Only this module runs nspawn, mount and umount.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet import paths
from knobfleet.errors import LabError
from knobfleet.lab import hostfiles, limits, sim
from knobfleet.lab.cgroups import cgroup_dirs, join_cgroups, kill_leftovers, remove_cgroups
from knobfleet.lab.hostfiles import LabHost

BOOT_TIMEOUT_S = 90.0
TMPFS_SIZE = "512m"
MAX_HOSTS = 64
# What systemd-nspawn keeps per machine under /run; it refuses to remove it when /run is not a tmpfs
# ("Attempted to remove disk file system under ..."), so `lab down` removes what is left of its own machines.
NSPAWN_RUN = Path("/run/systemd/nspawn")


@dataclass(frozen=True)
class Service:
    """A service the lab runs besides its hosts (the router, Prometheus), for ``lab status``."""

    name: str
    url: str
    state: str  # running | stopped
    pid: int | None = None
    detail: str = ""

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "url": self.url, "state": self.state, "pid": self.pid, "detail": self.detail}


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    state: str  # running | stopped | broken
    pid: int | None


class Lab:
    def __init__(self, state: Path | None = None) -> None:
        self.dir = (state or paths.state_dir() / "lab").resolve()
        self.vllm: Any = None  # a vllm_install.VllmInstall while booting vLLM hosts
        self.vllm_hosts: set[str] = set()
        self.sglang: Any = None  # a sglang_install.SglangInstall while booting real-SGLang hosts
        self.sglang_hosts: set[str] = set()
        self.router_model: str | None = None  # `up --router`: the local model dir the stand-ins report
        self.ssh_dir = self.dir / "ssh"
        self.key = self.ssh_dir / "id_ed25519"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.notes: list[str] = []  # what up/down changed outside the lab (kernel limits), for the operator

    # --- queries --------------------------------------------------------------------------------

    def host_dir(self, host: LabHost) -> Path:
        return self.dir / "hosts" / host.name

    def pid_file(self, host: LabHost) -> Path:
        return self.dir / "run" / f"{host.name}.pid"

    def pid(self, host: LabHost) -> int | None:
        """The nspawn PID of ``host`` if that process is alive and really is our container."""
        try:
            pid = int(self.pid_file(host).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        root = str(self.host_dir(host) / "root").encode()
        ok = any(arg.endswith(b"systemd-nspawn") for arg in cmdline[:1]) and any(root in a for a in cmdline)
        return pid if ok else None

    def known(self) -> list[LabHost]:
        found = set()
        for base in (self.dir / "hosts", self.dir / "run"):
            if base.is_dir():
                for entry in base.iterdir():
                    stem = entry.name.split(".")[0]
                    if entry.suffix == ".log":
                        continue
                    if stem.startswith("lab") and stem[3:].isdigit():
                        found.add(int(stem[3:]))
        return [LabHost(i) for i in sorted(found)]

    def status(self) -> list[HostStatus]:
        out = []
        for host in self.known():
            pid = self.pid(host)
            if pid is None:
                state = "broken" if _mounted(self.host_dir(host)) else "stopped"
            else:
                state = "running" if _port_open(host.address, 22) else "booting"
            out.append(HostStatus(host.name, host.address, state, pid))
        return out

    def services(self) -> list[Service]:
        """The router (with its metrics URL) and Prometheus, where this lab started them."""
        from knobfleet.lab import monitoring
        from knobfleet.lab.router_lab import LabRouter

        out = []
        router = LabRouter(self.dir)
        if router.info_file.exists() or router.pid_file.exists():
            info = router.info()
            state = "running" if info.pid else "stopped"
            kind = self.router_kind()
            out.append(Service(f"router ({kind})", info.url, state, info.pid, f"{len(info.workers)} worker(s)"))
            out.append(Service("router metrics", info.metrics_url, state, info.pid))
        if (monitoring.monitoring_dir(self.dir) / "run").is_dir():
            up = monitoring.running(self.dir)
            out.append(Service("prometheus", monitoring.prometheus_url(), "running" if up else "stopped"))
        return out

    @staticmethod
    def _router_kind(router: bool | str) -> str:
        return router if isinstance(router, str) else "sglang-router"

    def router_kind(self) -> str:
        try:
            return (self.dir / "router-kind").read_text().strip() or "sglang-router"
        except OSError:
            return "sglang-router"

    def _running_host(self, name: str, what: str) -> LabHost:
        hosts = {h.name: h for h in self.known()}
        if not (name.startswith("lab") and name[3:].isdigit()) or name not in hosts or self.pid(hosts[name]) is None:
            running = ", ".join(h.name for h in self.known() if self.pid(h) is not None) or "none"
            raise LabError(
                f"lab {what}: {name!r} is not a running host of this lab (running: {running}); it sets a lab "
                "host's hardware, never a real host's"
            )
        return hosts[name]

    def host_speed(self, name: str) -> float:
        """The speed factor a running lab host's engine reads (1.0 when none is set)."""
        from knobfleet.lab.sim import model

        path = self.host_dir(LabHost(int(name[3:]))) / "root" / model.HOST_SPEED_FILE.lstrip("/")
        try:
            return model.parse_speed(path.read_text(encoding="ascii")[:64])
        except (OSError, ValueError):
            return 1.0

    def set_host_speed(self, name: str, factor: float) -> float:
        """Write the host-level speed file inside ``name`` (the engine re-reads it every second); 1.0 removes it."""
        from knobfleet.lab.sim import model

        host = self._running_host(name, "speed")
        lo, hi = model.HOST_SPEED_RANGE
        if not (math.isfinite(factor) and lo <= factor <= hi):
            raise LabError(f"lab speed: {factor!r}: a speed factor is a number in {lo:g}..{hi:g} (1 = as the others)")
        path = self.host_dir(host) / "root" / model.HOST_SPEED_FILE.lstrip("/")
        if factor == 1.0:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(path, f"{factor:g}\n")
        return factor

    # --- up -------------------------------------------------------------------------------------

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise LabError("lab: needs root (systemd-nspawn and mounts); run as root or with sudo")
        for tool, pkg in (
            ("systemd-nspawn", "systemd-container"),
            ("sshd", "openssh-server"),
            ("ssh-keygen", "openssh-client"),
        ):
            if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
                raise LabError(
                    f"lab: {tool} not found; install it with `apt-get install -y {pkg}` "
                    "(or run `make demo`, which does)"
                )
        if not Path("/usr/bin/python3").exists():
            raise LabError(
                "lab: /usr/bin/python3 not found; lab hosts need it for Ansible (apt-get install -y python3)"
            )

    def ensure_keys(self) -> None:
        self.ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "knobfleet-lab", "-f", str(self.key)])

    def up(
        self,
        count: int,
        vllm: tuple[str, ...] = (),
        router: bool | str = False,
        group_size: int = 0,
        sglang: tuple[str, ...] = (),
    ) -> list[HostStatus]:
        """Boot lab1..labN; hosts already running are kept, leftovers of crashed runs are cleaned. Hosts named
        in ``vllm`` run real vLLM (CPU build, tiny model; installed once, cached) instead of the stand-in.
        ``router``: SGLang's router in front of every host's engine (``router_lab``), on loopback only: True or
        ``"sglang-router"`` for sglang-router 0.3.2, ``"smg"`` for SMG 1.13.
        Hosts named in ``sglang`` run real SGLang 0.5.23 (CPU path, the same tiny model; ``sglang_install``).
        ``group_size``: the hosts form engine groups of that many consecutive hosts (one multi-node engine each,
        ``hostfiles.lab_groups``), declared in the lab inventory's ``knob_engine_groups``."""
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"lab up: -n {count}: choose 1..{MAX_HOSTS} hosts")
        if group_size and (group_size < 2 or count % group_size):
            raise LabError(f"lab up: --groups {group_size}: a group size of 2 or more that divides -n {count}")
        if group_size and (vllm or router or sglang):
            raise LabError(
                "lab up: --groups runs the stand-in as multi-node engines; it does not combine with --vllm, "
                "--sglang or --router"
            )
        hosts = [LabHost(i) for i in range(1, count + 1)]
        for opt, names in (("--vllm", vllm), ("--sglang", sglang)):
            unknown = sorted(set(names) - {h.name for h in hosts})
            if unknown:
                raise LabError(f"lab up: {opt} {','.join(unknown)}: not among lab1..lab{count}")
        both = sorted(set(vllm) & set(sglang))
        if both:
            raise LabError(f"lab up: {','.join(both)} named by both --vllm and --sglang; a host runs one engine")
        self.preflight()
        self.ensure_keys()
        if vllm or router:
            from knobfleet.lab import vllm_install

            self.vllm = vllm_install.ensure()  # before any host boots: a host's writes land in its own tmpfs
        if sglang:
            from knobfleet.lab import sglang_install

            self.sglang = sglang_install.ensure()
        if router:
            from knobfleet.lab import router_install

            router_install.ensure(kind=self._router_kind(router))
            # The router loads each worker's tokenizer from the model path the worker reports: a local dir.
            self.router_model = str((self.sglang or self.vllm).model_dir)
        running = {h.name for h in hosts if self.pid(h) is not None}
        if router and running and self.router_model_dir() != self.router_model:
            # Their engines report another model path: the router would reach for a hub to load its tokenizer.
            raise LabError(
                f"lab up --router: {', '.join(sorted(running))} already run without the router's local model "
                "path; `knobfleet lab down` first"
            )
        self.vllm_hosts = set(vllm) | (self.vllm_host_names() & running)
        self.sglang_hosts = set(sglang) | (self.sglang_host_names() & running)
        if self.sglang_hosts and self.sglang is None:
            from knobfleet.lab import sglang_install

            self.sglang = sglang_install.layout()
        if running and self.group_size() != group_size:
            now = f"groups of {self.group_size()}" if self.group_size() else "no groups"
            raise LabError(f"lab up: {', '.join(sorted(running))} already run with {now}; `knobfleet lab down` first")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "group-size").write_text(f"{group_size}\n")
        (self.dir / "vllm-hosts").write_text("".join(f"{h}\n" for h in sorted(self.vllm_hosts)))
        (self.dir / "sglang-hosts").write_text("".join(f"{h}\n" for h in sorted(self.sglang_hosts)))
        new = [h for h in hosts if h.name not in running]
        try:
            self.notes += [c.message() for c in limits.raise_for(len(new), self.dir / "run")]
        except OSError as exc:
            raise LabError(
                f"lab up: cannot raise the inotify limits {len(new)} hosts need ({exc}); raise "
                f"{limits.INSTANCES} to at least {limits.needed(len(new), *limits.usage())[limits.INSTANCES]}"
            ) from None
        started: list[LabHost] = []
        for host in new:
            self._cleanup(host)
            if _port_open(host.address, 22):
                raise LabError(
                    f"lab up: {host.address}:22 is already taken by another process; "
                    f"free it (ss -ltnp 'sport = :22') or stop that service"
                )
            self._prepare(host)
            self._boot(host)
            started.append(host)
        self._write_known_hosts(hosts)
        self._wait_ssh(hosts)
        if router:
            (self.dir / "router-model").write_text(f"{self.router_model}\n")
            (self.dir / "router-kind").write_text(f"{self._router_kind(router)}\n")
        self.write_inventory(hosts)
        if router:
            self.start_router(hosts)
        return self.status()

    def worker_urls(self, hosts: list[LabHost]) -> list[str]:
        """The engine URL of each host, as the router fronts it."""
        vllm_hosts = self.vllm_host_names()
        return [f"http://{h.address}:{hostfiles.VLLM_PORT if h.name in vllm_hosts else 30000}" for h in hosts]

    def start_router(self, hosts: list[LabHost]) -> None:
        from knobfleet.lab.router_lab import LabRouter

        # real SGLang workers are ready 40-100 s after their host boots (imports dominate on 2 loaded cores)
        slow = bool(self.sglang_host_names() & {h.name for h in hosts})
        LabRouter(self.dir).start(self.worker_urls(hosts), self.router_kind(), timeout_s=300.0 if slow else 60.0)

    def router_model_dir(self) -> str | None:
        try:
            return (self.dir / "router-model").read_text().strip() or None
        except OSError:
            return None

    def _prepare(self, host: LabHost) -> None:
        hdir = self.host_dir(host)
        hdir.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", f"knobfleet-{host.name}", str(hdir)])
        for sub in ("upper", "work", "root"):
            (hdir / sub).mkdir()
        _run(
            [
                "mount",
                "-t",
                "overlay",
                f"knobfleet-{host.name}",
                "-o",
                f"lowerdir=/,upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
                str(hdir / "root"),
            ]
        )
        root = hdir / "root"
        _write(root / "etc/hostname", f"{host.name}\n")
        # The host's /tmp is this machine's /tmp under the overlay (``_boot``); Debian's tmpfiles.d/tmp.conf says
        # `D /tmp`, which empties it at boot, and in an overlay that whiteouts every file below, a checkout under
        # /tmp included (the machine's own /tmp is never touched: whiteouts live in the host's upper layer).
        # Same name in /etc overrides it: create, do not clean.
        _write(
            root / "etc/tmpfiles.d/tmp.conf",
            "# Written by `knobfleet lab up`: keep /tmp at boot\nd /tmp 1777 root root -\n",
        )
        _write(root / "etc/machine-id", os.urandom(16).hex() + "\n")
        _write(root / "etc/ssh/sshd_config.d/knobfleet-lab.conf", hostfiles.sshd_config(host))
        key = root / "etc/ssh/ssh_host_ed25519_key"
        for old in (key, key.with_suffix(".pub")):
            old.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(key)])
        _write(root / "root/.ssh/authorized_keys", self.key.with_suffix(".pub").read_text(), 0o600)
        # A stock root shell: the overlay would otherwise give each host this machine's own ~/.bashrc, which bash
        # sources for every ssh command (a developer's pyenv init there costs ~0.1 s of CPU per command).
        for rc in (".bashrc", ".profile"):
            skel = Path("/etc/skel") / rc
            _write(root / "root" / rc, skel.read_text() if skel.is_file() else "", 0o644)
        os.chmod(root / "root/.ssh", 0o700)
        unit_dir = root / "etc/systemd/system"
        if host.name in self.vllm_hosts and self.vllm is not None:
            script = hostfiles.vllm_serve_script(host, str(self.vllm.vllm), str(self.vllm.model_dir))
            service, unit = hostfiles.VLLM_SERVICE, hostfiles.vllm_serve_unit()
            _write(root / hostfiles.VLLM_SCRIPT_PATH.lstrip("/"), script, 0o755)
        elif host.name in self.sglang_hosts and self.sglang is not None:
            script = hostfiles.sglang_serve_script(host, str(self.sglang.python), str(self.sglang.model_dir))
            service, unit = hostfiles.SGLANG_SERVICE, hostfiles.sglang_serve_unit()
            _write(root / hostfiles.SGLANG_SCRIPT_PATH.lstrip("/"), script, 0o755)
        else:
            service, unit = hostfiles.SERVICE, hostfiles.serve_unit()
            model = self.router_model or hostfiles.SIM_MODEL_PATH
            script = hostfiles.serve_script(host, model, self.group_size())
            _write(root / hostfiles.SCRIPT_PATH.lstrip("/"), script, 0o755)
        _write(unit_dir / f"{service}.service", unit)
        _link(unit_dir / "multi-user.target.wants" / f"{service}.service", f"/etc/systemd/system/{service}.service")
        self._mask_units(root)
        self._install_sim(root)
        for stale in ("var/lib/knobfleet", "run/nologin", "etc/nologin"):
            p = root / stale
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()

    def _mask_units(self, root: Path) -> None:
        unit_dir = root / "etc/systemd/system"
        masks = set(hostfiles.MASKED_UNITS)
        for wants in (
            "multi-user.target.wants",
            "timers.target.wants",
            "sysinit.target.wants",
            "getty.target.wants",
            "sockets.target.wants",
            "graphical.target.wants",
        ):
            d = Path("/etc/systemd/system") / wants
            if d.is_dir():
                masks |= {
                    e.name
                    for e in d.iterdir()
                    if e.name not in hostfiles.KEEP_WANTS and not e.name.startswith("systemd-journald")
                }
        for unit in sorted(masks):
            target = unit_dir / unit
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to("/dev/null")

    def _install_sim(self, root: Path) -> None:
        src = Path(__file__).resolve().parent / "sim"
        dest = root / hostfiles.SIM_SITE.lstrip("/")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        pkg = Path(__file__).resolve().parent.parent
        shutil.copy2(pkg / "waves.py", dest / "_waves.py")
        shutil.copy2(pkg / "gpus.json", dest / "gpus.json")
        shutil.copy2(pkg / "calibrations.json", dest / "calibrations.json")  # waves.calibration_for reads it
        (dest / "VERSION").write_text(sim.__version__ + "\n", encoding="utf-8")  # the engine version ranks compare

    def _boot(self, host: LabHost) -> None:
        (self.dir / "run").mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "run" / f"{host.name}.log", "wb")  # noqa: SIM115 - handed to the child
        cmd = [
            "systemd-nspawn",
            "--boot",
            f"--directory={self.host_dir(host) / 'root'}",
            f"--machine={host.machine}",
            f"--hostname={host.name}",
            "--register=no",
            "--keep-unit",
            "--link-journal=no",
            "--console=passive",
            "--resolv-conf=off",
            "--timezone=off",
            "-q",
        ]
        dirs = cgroup_dirs(host)
        # nspawn mounts a fresh tmpfs on /tmp by default, which would hide this machine's /tmp from the host: a
        # checkout under /tmp (where many people clone) would then not exist inside it. Off, /tmp is part of the
        # overlay like every other path: this machine's files below, the host's own writes on top (tmp.mount is
        # masked in the hosts, so nothing mounts over it later).
        env = dict(os.environ, SYSTEMD_NSPAWN_TMPFS_TMP="0")
        with log:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=lambda: join_cgroups(dirs),
            )
        self.pid_file(host).write_text(f"{proc.pid}\n")

    def _write_known_hosts(self, hosts: list[LabHost]) -> None:
        lines = []
        for host in self.known():
            pub = self.host_dir(host) / "root/etc/ssh/ssh_host_ed25519_key.pub"
            if pub.exists():
                lines.append(hostfiles.known_hosts_line(host, pub.read_text()))
        _write(self.known_hosts, "".join(lines), 0o644)

    def _wait_ssh(self, hosts: list[LabHost]) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        pending = list(hosts)
        while pending:
            for host in list(pending):
                if self.pid(host) is None:
                    tail = _tail(self.dir / "run" / f"{host.name}.log")
                    raise LabError(
                        f"lab up: {host.name}: systemd-nspawn exited during boot; last console lines:\n{tail}"
                    )
                if _port_open(host.address, 22):
                    pending.remove(host)
            if pending and time.monotonic() > deadline:
                names = ", ".join(h.name for h in pending)
                raise LabError(
                    f"lab up: {names}: sshd did not answer within {BOOT_TIMEOUT_S:.0f}s; "
                    f"see {paths.display(self.dir / 'run')}/<host>.log, then `knobfleet lab down`"
                )
            if pending:
                time.sleep(0.1)

    def ssh_argv(self, host: LabHost, command: list[str] | None = None) -> list[str]:
        argv = [
            "ssh",
            "-i",
            str(self.key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            f"root@{host.address}",
        ]
        return argv + (command or [])

    def ssh_vars(self) -> str:
        """Connection vars for Ansible and testinfra: literal paths, no templating needed."""
        return (
            "# Written by `knobfleet lab up`: how to reach the lab hosts. Strict host key checking stays on.\n"
            f"ansible_ssh_private_key_file: {self.key}\n"
            "ansible_ssh_common_args: >-\n"
            f"  -o UserKnownHostsFile={self.known_hosts}\n"
            "  -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ConnectTimeout=10\n"
        )

    def write_inventory(self, hosts: list[LabHost]) -> Path:
        """An inventory for exactly the hosts that are up (``inventories/lab`` lists lab1..lab3), and the
        connection vars of the default lab inventory when this is the default lab."""
        inv = self.dir / "inventory"
        (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
        lines = [
            "# Written by `knobfleet lab up`; use with -i for labs of other sizes than 3.",
            "all:",
            "  children:",
            "    decode:",
            "      hosts:",
        ]
        vllm_hosts, sglang_hosts = self.vllm_host_names(), self.sglang_host_names()
        for host in hosts:
            if host.name not in vllm_hosts | sglang_hosts:
                lines += [f"        {host.name}:", f"          ansible_host: {host.address}"]
        for group, members in (("vllm", vllm_hosts), ("sglang", sglang_hosts)):
            if members & {h.name for h in hosts}:
                lines += [f"    {group}:", "      hosts:"]
                for host in hosts:
                    if host.name in members:
                        lines += [f"        {host.name}:", f"          ansible_host: {host.address}"]
        _write(inv / "hosts.yml", "\n".join(lines) + "\n")
        default = paths.default_inventory() / "group_vars" / "all"
        shutil.copy2(default / "main.yml", inv / "group_vars" / "all" / "main.yml")
        if vllm_hosts:
            _write(inv / "group_vars" / "vllm.yml", self.vllm_group_vars())
        if sglang_hosts:
            _write(inv / "group_vars" / "sglang.yml", self.sglang_group_vars())
        else:
            (inv / "group_vars" / "sglang.yml").unlink(missing_ok=True)
        groups_yml = inv / "group_vars" / "all" / "groups.yml"
        if self.group_size():
            _write(groups_yml, self.groups_vars(len(hosts)))
        else:
            groups_yml.unlink(missing_ok=True)
        router_yml = inv / "group_vars" / "all" / "router.yml"
        model = self.router_model_dir()
        if model:
            from knobfleet.lab.router_lab import router_group_vars

            _write(router_yml, router_group_vars(model))
        else:
            router_yml.unlink(missing_ok=True)
        _write(inv / "group_vars" / "all" / "lab_ssh.yml", self.ssh_vars())
        if self.dir == (paths.state_dir() / "lab").resolve() and os.access(default, os.W_OK):
            _write(default / "lab_ssh.yml", self.ssh_vars())
        return inv

    def group_size(self) -> int:
        """The size of the lab's engine groups (0: every host runs its own engine)."""
        try:
            return int((self.dir / "group-size").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def vllm_host_names(self) -> set[str]:
        return self._host_names("vllm-hosts")

    def sglang_host_names(self) -> set[str]:
        """The lab hosts that run real SGLang (``lab up --sglang``)."""
        return self._host_names("sglang-hosts")

    def _host_names(self, file: str) -> set[str]:
        try:
            return {ln.strip() for ln in (self.dir / file).read_text().splitlines() if ln.strip()}
        except OSError:
            return set()

    def groups_vars(self, count: int) -> str:
        """The lab's engine groups (``knob_engine_groups``) and the stand-in's version file, as group vars."""
        import yaml

        doc = {
            "knob_engine_groups": hostfiles.lab_groups(count, self.group_size()),
            "knob_serve_version_file": hostfiles.SIM_VERSION_FILE,
        }
        return (
            "# Written by `knobfleet lab up --groups N`: each group of N hosts runs one multi-node engine (rank 0\n"
            "# serves the API, the others join it); knobfleet renders each rank's --nnodes/--node-rank/\n"
            "# --dist-init-addr.\n" + yaml.safe_dump(doc, sort_keys=False)
        )

    def vllm_group_vars(self) -> str:
        """Host vars of the lab's vLLM hosts (group ``vllm``): the engine, its service, launcher and model."""
        from knobfleet.lab import vllm_install

        inst = self.vllm or vllm_install.layout()
        env = "".join(f"  {k}: {v!r}\n" for k, v in sorted(hostfiles.VLLM_ENV.items()))
        return (
            "# Written by `knobfleet lab up --vllm`: these hosts run real vLLM (CPU build) on a tiny local model.\n"
            "knob_engine: vllm\n"
            f"knob_serve_service: {hostfiles.VLLM_SERVICE}\n"
            f"knob_serve_script_path: {hostfiles.VLLM_SCRIPT_PATH}\n"
            f"knob_serve_launcher: [{inst.vllm}]\n"
            f"knob_serve_model_path: {inst.model_dir}\n"
            f"knob_serve_port: {hostfiles.VLLM_PORT}\n"
            "knob_serve_readiness_path: ''\n"
            "knob_serve_readiness_timeout_s: 300\n"
            # Drain on SIGTERM (in-flight requests finish, up to 20 s); TimeoutStopSec covers it with a margin.
            "knob_serve_timeout_stop_s: 45\n"
            "knob_serve_host_args:\n  shutdown-timeout: '20'\n"
            f"knob_serve_host_env:\n{env}"
        )

    def sglang_group_vars(self) -> str:
        """Host vars of the lab's real-SGLang hosts (group ``sglang``): its service, launcher, model and flags."""
        import yaml

        from knobfleet.lab import sglang_install

        inst = self.sglang or sglang_install.layout()
        doc = {
            "knob_engine": "sglang",
            "knob_serve_service": hostfiles.SGLANG_SERVICE,
            "knob_serve_script_path": hostfiles.SGLANG_SCRIPT_PATH,
            "knob_serve_launcher": [str(inst.python), "-m", "sglang.launch_server"],
            "knob_serve_model_path": str(inst.model_dir),
            "knob_serve_port": hostfiles.SGLANG_PORT,
            # 40-100 s from start to ready on a loaded 2-core machine (imports dominate), more at --tp 2.
            "knob_serve_readiness_timeout_s": 300,
            "knob_serve_host_args": dict(hostfiles.SGLANG_HOST_ARGS),
            "knob_serve_host_env": dict(hostfiles.SGLANG_ENV),
        }
        return (
            "# Written by `knobfleet lab up --sglang`: these hosts run real SGLang 0.5.23 (CPU path, knobfleet's\n"
            "# placeholder sgl_kernel) on a tiny local model.\n" + yaml.safe_dump(doc, sort_keys=False)
        )

    # --- down -----------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every lab host found; leave no mounts and no processes behind."""
        from knobfleet.lab import monitoring

        monitoring.stop(self.dir)
        from knobfleet.lab.router_lab import LabRouter

        if LabRouter(self.dir).stop():
            self.notes.append("lab: stopped the router")
        (self.dir / "router-model").unlink(missing_ok=True)
        (self.dir / "router-kind").unlink(missing_ok=True)
        stopped = []
        hosts = self.known()
        for host in hosts:
            pid = self.pid(host)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20 + 0.5 * len(hosts)  # 64 hosts halting at once share 2 cores
        for host in hosts:
            while self.pid(host) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            pid = self.pid(host)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                time.sleep(0.5)
            self._cleanup(host)
            stopped.append(host.name)
        if not any(self.pid(h) is not None for h in self.known()):
            restored = limits.restore(self.dir / "run")
            if restored:
                self.notes.append(f"lab: put back {', '.join(restored)}")
        return stopped

    def _cleanup(self, host: LabHost) -> None:
        hdir = self.host_dir(host)
        kill_leftovers(cgroup_dirs(host))
        for mnt in (hdir / "root", hdir):
            if _mounted(mnt) and subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                _run(["umount", "-l", str(mnt)])
        if hdir.exists() and not _mounted(hdir):
            shutil.rmtree(hdir, ignore_errors=True)
        self.pid_file(host).unlink(missing_ok=True)
        remove_cgroups(cgroup_dirs(host))
        for leftover in (NSPAWN_RUN / sub / host.machine for sub in ("propagate", "unix-export")):
            if leftover.is_dir() and not leftover.is_symlink() and not _mounted_under(leftover):
                shutil.rmtree(leftover, ignore_errors=True)


def _mounted(path: Path) -> bool:
    target = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return any(line.split()[1] == target for line in fh)


def _mounted_under(path: Path) -> bool:
    prefix = str(path) + "/"
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return any(line.split()[1] == str(path) or line.split()[1].startswith(prefix) for line in fh)


def _port_open(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((address, port)) == 0


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"lab: `{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no console log)"
