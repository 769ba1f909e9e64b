"""Boot, inspect and tear down lab hosts: systemd-nspawn containers over an overlay of this machine's root.

Layout under the lab's folder (``.state/lab`` in a checkout for the default lab, ``.state/labs/<id>`` for lab
``--id <id>``; git-ignored)::

    identity.json         the lab's id and slot (``identity``: its addresses, machine names, cgroups and ports)

    ssh/id_ed25519[.pub]  ssh/known_hosts      the lab's key pair and host keys (strict checking)
    hosts/labN/           a tmpfs holding upper/ work/ root/ (root = the overlay the container boots)
    run/labN.pid          the systemd-nspawn process, run/labN.log its console
    inventory/            an Ansible inventory for the hosts that are up

Only this module runs nspawn and umount, and mount with ``labroot`` (a host's root: its tmpfs, the overlay and the
files on top). The lab's inventory is ``labinventory``, its router and Prometheus ``labservices``, ``lab speed``
``labspeed``: ``Lab``'s methods of the same names call them. Each of those sees the lab as ``labview.LabView`` (the
part of ``Lab`` it uses), so none imports this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from knobfleet import labid, paths
from knobfleet.errors import LabError
from knobfleet.lab import (
    hostfiles,
    labinventory,
    labroot,
    labruntime,
    labservices,
    labspeed,
    limits,
    neighbours,
    options,
    slots,
)
from knobfleet.lab.cgroups import cgroup_dirs, kill_leftovers, remove_cgroups
from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.labroot import run as _run
from knobfleet.lab.labroot import write as _write
from knobfleet.lab.labservices import Service
from knobfleet.lab.labview import HostStatus

BOOT_TIMEOUT_S = 90.0
MAX_HOSTS = options.MAX_HOSTS
# What systemd-nspawn keeps per machine under /run; it refuses to remove it when /run is not a tmpfs
# ("Attempted to remove disk file system under ..."), so `lab down` removes what is left of its own machines.
NSPAWN_RUN = Path("/run/systemd/nspawn")


class Lab:
    def __init__(self, state: Path | None = None) -> None:
        """The lab in the folder ``state``; by default the one a command means (``labid.selected``)."""
        self.dir = (state or labid.selected(paths.state_dir())).resolve()
        self.vllm: Any = None  # a vllm_venv.VllmInstall while booting vLLM hosts
        self.vllm_hosts: set[str] = set()
        self.sglang: Any = None  # a sglang_install.SglangInstall while booting real-SGLang hosts
        self.sglang_hosts: set[str] = set()
        self.router_model: str | None = None  # `up --router`: the local model dir the stand-ins report
        self.ssh_dir = self.dir / "ssh"
        self.key = self.ssh_dir / "id_ed25519"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.notes: list[str] = []  # what up/down changed outside the lab (kernel limits), for the operator

    # --- queries --------------------------------------------------------------------------------

    @property
    def identity(self) -> labid.Identity:
        """The lab's id and slot as its folder records them (read each time: ``up`` in another process may claim)."""
        return labid.of(self.dir)

    def host(self, index: int) -> LabHost:
        """Host ``index`` of this lab (lab1 is 1), at this lab's addresses."""
        return LabHost(index, self.identity.slot)

    def named(self, name: str) -> LabHost:
        """The host of this lab called ``name`` (lab1, lab2, …); ValueError for any other name."""
        if not (name.startswith("lab") and name[3:].isdigit()):
            raise ValueError(f"{name!r} is not a lab host name (lab1, lab2, …)")
        return self.host(int(name[3:]))

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
        return [self.host(i) for i in sorted(found)]

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
        """The router (with its metrics URL) and Prometheus, where this lab started them (``labservices``)."""
        return labservices.services(self)

    @staticmethod
    def _router_kind(router: bool | str) -> str:
        return router if isinstance(router, str) else "sglang-router"

    def router_kind(self) -> str:
        """The router `lab up --router` started: sglang-router (the default) or smg."""
        return labservices.router_kind(self)

    def host_speed(self, name: str) -> float:
        """The speed factor a running lab host's engine reads (1.0 when none is set; ``labspeed``)."""
        return labspeed.host_speed(self, name)

    def set_host_speed(self, name: str, factor: float) -> float:
        """Write the host-level speed file inside ``name`` (the engine re-reads it every second); 1.0 removes it."""
        return labspeed.set_host_speed(self, name, factor)

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
        runtime: str = "systemd",
    ) -> list[HostStatus]:
        """Boot lab1..labN; hosts already running are kept, leftovers of crashed runs are cleaned. Hosts named
        in ``vllm`` run real vLLM (CPU build, tiny model; installed once, cached) instead of the stand-in.
        ``router``: SGLang's router in front of every host's engine (``router_lab``), on loopback only: True or
        ``"sglang-router"`` for sglang-router 0.3.2, ``"smg"`` for SMG 1.13.
        Hosts named in ``sglang`` run real SGLang 0.5.23 (CPU path, the same tiny model; ``sglang_install``).
        ``group_size``: engine groups of that many consecutive hosts (``hostfiles.lab_groups``). ``runtime``: podman
        or docker runs each stand-in in a container (``labruntime``)."""
        options.hosts_to_boot(count, vllm, router, group_size, sglang)  # the options, checked before anything changes
        self.preflight()
        self.claim()
        hosts = options.hosts_to_boot(count, vllm, router, group_size, sglang, self.identity.slot)
        neighbours.check_free(hosts, self.dir)  # before anything here or in another checkout's lab changes
        self.ensure_keys()
        self._install_engines(vllm, router, sglang)
        running = {h.name for h in hosts if self.pid(h) is not None}
        labruntime.record(self.dir, runtime, running)
        self._record_layout(running, vllm, router, group_size, sglang)
        self._boot_new([h for h in hosts if h.name not in running])
        self._write_known_hosts(hosts)
        self._wait_ssh(hosts)
        if router:
            (self.dir / "router-model").write_text(f"{self.router_model}\n")
            (self.dir / "router-kind").write_text(f"{self._router_kind(router)}\n")
        self.write_inventory(hosts)
        if router:
            self.start_router(hosts)
        return self.status()

    def claim(self) -> labid.Identity:
        """This lab's slot on the machine (``slots.claim``): the one it holds, else a free one, recorded."""
        return slots.claim(self.dir, self.identity.id, slots.taken_slots(self.dir))

    def _install_engines(self, vllm: tuple[str, ...], router: bool | str, sglang: tuple[str, ...]) -> None:
        """The real engines and the router ``up`` needs, installed (once, cached) before any host boots."""
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

    def _record_layout(
        self, running: set[str], vllm: tuple[str, ...], router: bool | str, group_size: int, sglang: tuple[str, ...]
    ) -> None:
        """Which hosts run vLLM or SGLang and the engine groups' size, checked against the hosts already
        ``running`` (another router model or group size: `lab down` first) and written to the state dir."""
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

    def _boot_new(self, new: list[LabHost]) -> None:
        """Boot the hosts that are not running yet: the kernel limits they need raised, each one's leftovers cleaned,
        its root prepared (``labroot``) and systemd-nspawn started."""
        try:
            with slots.locked():  # the record is machine-wide: the last lab down puts the limits back
                self.notes += [c.message() for c in limits.raise_for(len(new), slots.REGISTRY)]
        except OSError as exc:
            raise LabError(
                f"lab up: cannot raise the inotify limits {len(new)} hosts need ({exc}); raise "
                f"{limits.INSTANCES} to at least {limits.needed(len(new), *limits.usage())[limits.INSTANCES]}"
            ) from None
        started: list[LabHost] = []
        for host in new:
            self._cleanup(host)
            if _port_open(host.address, 22):
                holder = neighbours.foreign(self.dir).get(host.machine)
                raise LabError(f"lab up: {hostfiles.port_taken(host.address, holder)}")
            labroot.prepare(self, host)
            labruntime.prepare_docker(self, host)  # a docker lab: docker's files and the host's nspawn settings
            labroot.boot(self, host)
            started.append(host)

    def worker_urls(self, hosts: list[LabHost]) -> list[str]:
        """The engine URL of each host, as the router fronts it."""
        return labservices.worker_urls(self, hosts)

    def start_router(self, hosts: list[LabHost]) -> None:
        """Start the lab's router in front of ``hosts``' engines (``labservices``)."""
        labservices.start_router(self, hosts)

    def router_model_dir(self) -> str | None:
        try:
            return (self.dir / "router-model").read_text().strip() or None
        except OSError:
            return None

    def _install_sim(self, root: Path) -> None:
        """The stand-in engine under the host's site folder (``labroot.install_sim``)."""
        labroot.install_sim(root)

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
        """Connection vars for Ansible and testinfra: literal paths, no templating needed (``labinventory``)."""
        return labinventory.ssh_vars(self)

    def write_inventory(self, hosts: list[LabHost]) -> Path:
        """An inventory for exactly the hosts that are up (``labinventory.write_inventory``)."""
        return labinventory.write_inventory(self, hosts)

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
        """The lab's engine groups and the stand-in's version file, as group vars (``labinventory``)."""
        return labinventory.groups_vars(self, count)

    def vllm_group_vars(self) -> str:
        """Host vars of the lab's vLLM hosts (group ``vllm``; ``labinventory``)."""
        return labinventory.vllm_group_vars(self)

    def sglang_group_vars(self) -> str:
        """Host vars of the lab's real-SGLang hosts (group ``sglang``; ``labinventory``)."""
        return labinventory.sglang_group_vars(self)

    # --- down -----------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every lab host found; leave no mounts and no processes behind."""
        from knobfleet.lab import monitoring

        monitoring.stop(self.dir, forget=True)  # the next lab in this folder starts with no series of this one
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
        others = neighbours.foreign(self.dir)
        for host in hosts:
            while self.pid(host) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            pid = self.pid(host)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                time.sleep(0.5)
            if host.machine in others:  # another checkout's lab runs this machine: only what is ours goes
                self.notes.append(f"lab: {host.name} also runs in another checkout's lab ({others[host.machine]}); "
                                  "its processes and cgroups were left alone")  # fmt: skip
            self._cleanup(host, shared=host.machine not in others)
            stopped.append(host.name)
        if not any(self.pid(h) is not None for h in self.known()):
            slots.release(self.dir)
            self.notes += slots.put_limits_back(self.dir)
        return stopped

    def _cleanup(self, host: LabHost, shared: bool = True) -> None:
        """What is left of ``host`` here: its mounts, folder and PID file; with ``shared``, also the processes in its
        cgroups, the cgroups and nspawn's leftovers under /run, which carry the machine's name in every checkout
        (so not while another checkout's lab runs it)."""
        hdir = self.host_dir(host)
        if shared:
            kill_leftovers(cgroup_dirs(host))
        for mnt in (hdir / "root", hdir):
            if _mounted(mnt) and subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                _run(["umount", "-l", str(mnt)])
        if hdir.exists() and not _mounted(hdir):
            shutil.rmtree(hdir, ignore_errors=True)
        self.pid_file(host).unlink(missing_ok=True)
        if not shared:
            return
        remove_cgroups(cgroup_dirs(host))
        labruntime.nspawn_settings(host).unlink(missing_ok=True)  # a docker host's (any lab boots without it)
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


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no console log)"
