"""A lab host's root, built before it boots: its tmpfs and the overlay of this machine's root, the files the host
gets of its own (hostname, machine id, sshd config and host key, the lab's key, the engine's script and unit), the
units masked, and the stand-in installed. ``nspawn.Lab.up`` calls ``prepare`` for each new host; ``run``, ``write``
and ``link`` are the lab's own file and command helpers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from knobfleet.errors import LabError
from knobfleet.lab import hostfiles, labruntime, sim
from knobfleet.lab.cgroups import cgroup_dirs, join_cgroups
from knobfleet.lab.hostfiles import LabHost

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView

TMPFS_SIZE = "512m"


def prepare(lab: LabView, host: LabHost) -> None:
    """The host's root under its own tmpfs: an overlay of this machine's root with the host's own files on top
    (hostname, machine id, sshd config and host key, the lab's key, a stock root shell, the engine's script and
    unit), the units a lab host does without masked, and the stand-in installed."""
    hdir = lab.host_dir(host)
    hdir.mkdir(parents=True, exist_ok=True)
    run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", host.machine, str(hdir)])
    for sub in ("upper", "work", "root"):
        (hdir / sub).mkdir()
    run(
        [
            "mount",
            "-t",
            "overlay",
            host.machine,
            "-o",
            f"lowerdir=/,upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
            str(hdir / "root"),
        ]
    )
    root = hdir / "root"
    write(root / "etc/hostname", f"{host.name}\n")
    # The host's /tmp is this machine's /tmp under the overlay (``nspawn.Lab._boot``); Debian's tmpfiles.d/tmp.conf says
    # `D /tmp`, which empties it at boot, and in an overlay that whiteouts every file below, a checkout under
    # /tmp included (the machine's own /tmp is never touched: whiteouts live in the host's upper layer).
    # Same name in /etc overrides it: create, do not clean.
    write(
        root / "etc/tmpfiles.d/tmp.conf",
        "# Written by `knobfleet lab up`: keep /tmp at boot\nd /tmp 1777 root root -\n",
    )
    write(root / "etc/machine-id", os.urandom(16).hex() + "\n")
    write(root / "etc/ssh/sshd_config.d/knobfleet-lab.conf", hostfiles.sshd_config(host))
    key = root / "etc/ssh/ssh_host_ed25519_key"
    for old in (key, key.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(key)])
    write(root / "root/.ssh/authorized_keys", lab.key.with_suffix(".pub").read_text(), 0o600)
    # A stock root shell: the overlay would otherwise give each host this machine's own ~/.bashrc, which bash
    # sources for every ssh command (a developer's pyenv init there costs ~0.1 s of CPU per command).
    for rc in (".bashrc", ".profile"):
        skel = Path("/etc/skel") / rc
        write(root / "root" / rc, skel.read_text() if skel.is_file() else "", 0o644)
    os.chmod(root / "root/.ssh", 0o700)
    unit_dir = root / "etc/systemd/system"
    if host.name in lab.vllm_hosts and lab.vllm is not None:
        script = hostfiles.vllm_serve_script(host, str(lab.vllm.vllm), str(lab.vllm.model_dir))
        service, unit = hostfiles.VLLM_SERVICE, hostfiles.vllm_serve_unit()
        write(root / hostfiles.VLLM_SCRIPT_PATH.lstrip("/"), script, 0o755)
    elif host.name in lab.sglang_hosts and lab.sglang is not None:
        script = hostfiles.sglang_serve_script(host, str(lab.sglang.python), str(lab.sglang.model_dir))
        service, unit = hostfiles.SGLANG_SERVICE, hostfiles.sglang_serve_unit()
        write(root / hostfiles.SGLANG_SCRIPT_PATH.lstrip("/"), script, 0o755)
        if labruntime.recorded(lab.dir) == "podman":  # real SGLang in a container: its cached install mounted
            inst = lab.sglang
            own = labruntime.sglang_unit(host, inst.python, inst.root, inst.model_dir, "podman")
            unit = labruntime.prepare(root, host, "", "podman", own, hostfiles.SGLANG_SCRIPT_PATH)
    else:
        service, unit = hostfiles.SERVICE, hostfiles.serve_unit()
        model = lab.router_model or hostfiles.SIM_MODEL_PATH
        script = hostfiles.serve_script(host, model, lab.group_size())
        write(root / hostfiles.SCRIPT_PATH.lstrip("/"), script, 0o755)
        if labruntime.recorded(lab.dir) == "podman":  # the stand-in in a container, by a hand-written podman unit
            unit = labruntime.prepare(root, host, model)
    write(unit_dir / f"{service}.service", unit)
    link(unit_dir / "multi-user.target.wants" / f"{service}.service", f"/etc/systemd/system/{service}.service")
    mask_units(root)
    install_sim(root)
    for stale in ("var/lib/knobfleet", "run/nologin", "etc/nologin"):
        p = root / stale
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def mask_units(root: Path) -> None:
    """Mask what this machine would start in the host besides sshd and the engine (``hostfiles.MASKED_UNITS`` and
    every unit its targets want but ``hostfiles.KEEP_WANTS``)."""
    unit_dir = root / "etc/systemd/system"
    masks = set(hostfiles.MASKED_UNITS)
    for wants in (
        "multi-user.target.wants",
        "timers.target.wants",
        "sysinit.target.wants",
        "getty.target.wants",
        "sockets.target.wants",
        "graphical.target.wants",
        "default.target.wants",  # podman's own services (podman, podman-restart, podman-auto-update) want it
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


def install_sim(root: Path) -> None:
    """The stand-in engine (``sim/``, the wave model and its data, a VERSION) under the host's site folder."""
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


def run(cmd: list[str]) -> None:
    """Run ``cmd``; a failure is a LabError with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"lab: `{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")


def write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` with ``mode`` (a symlink there is replaced, never followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def link(path: Path, target: str) -> None:
    """``path`` as a symlink to ``target`` (whatever was there is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def boot(lab: LabView, host: LabHost) -> None:
    """Start the host's systemd-nspawn in its own session and cgroups, its console to the lab's run log."""
    (lab.dir / "run").mkdir(parents=True, exist_ok=True)
    log = open(lab.dir / "run" / f"{host.name}.log", "wb")  # noqa: SIM115 - handed to the child
    cmd = [
        "systemd-nspawn",
        "--boot",
        f"--directory={lab.host_dir(host) / 'root'}",
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
    lab.pid_file(host).write_text(f"{proc.pid}\n")
