"""``lab up --runtime podman`` and ``--runtime docker``: lab hosts whose stand-in engine runs in a container, started
by a hand-written ``podman run``/``docker run`` unit (the shape an operator writes: the run line in ExecStart, no
script), which the first apply adopts as generation 0.

Nothing is pulled, ever: the image is built here, from files, as a docker-archive (``build_image``: one layer
holding the folders a root needs and a marker file, a config with a fixed creation time), so its ID is the
sha256 of its config and known before any runtime sees it; each host loads it with ``podman load``/``docker load``
at boot (``knobfleet-lab-images.service``). The stand-in's code and Python come from the host itself, mounted
read-only (the way a cached install is mounted into a small image). Two images differ by their marker only:
``sim:1`` the one the hand-written unit and the inventory name, ``sim:2`` a second one for the tests (a retag, a
rollback).

Podman inside a systemd-nspawn host: the kernel keyring is not permitted there (``keyring = false``), cgroups
are not delegated (``--cgroups=disabled``: the container's processes stay in the unit's cgroup), and overlay
storage cannot nest (``vfs``).

Docker inside a systemd-nspawn host (``DAEMON_CONF``, ``NSPAWN_SETTINGS``): Debian's docker.service, docker.socket
and containerd.service (masked in every other lab host) with a daemon.json for nspawn. The cgroup controllers are
mounted read-only in the host, so the OCI runtime is crun with ``--cgroup-manager=disabled`` (runc always
creates one: ``mkdir /sys/fs/cgroup/cpuset/docker: read-only file system``); the container's processes stay in
containerd's cgroup. The host shares the machine's network, so dockerd creates no bridge, writes no iptables
rules and leaves IP forwarding alone (it cannot write ``/proc/sys`` there: with forwarding on it does not start).
Two things only a boot option gives, written as the machine's nspawn settings file (``/run/systemd/nspawn``,
trusted; docker labs only): CAP_NET_ADMIN, because even a ``--network=host`` container makes dockerd set up its
default sandbox, which brings ``lo`` up through netlink (``failed to create default sandbox: operation not
permitted`` without it), and the keyring system calls, because crun gives each container a session keyring
(``create keyring …: Operation not permitted`` under nspawn's system call filter).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from knobfleet.errors import LabError
from knobfleet.lab import hostfiles
from knobfleet.lab.hostfiles import LabHost

if TYPE_CHECKING:
    from knobfleet.lab.labview import LabView

RUNTIMES = ("systemd", "podman", "docker")
CONTAINER_RUNTIMES = ("podman", "docker")
IMAGE_DIR = "/var/lib/knobfleet-lab/images"
IMAGES = {"localhost/knobfleet-sim:1": "1", "localhost/knobfleet-sim:2": "2"}
MOUNTS = ("/usr", "/lib", "/lib64", "/bin", "/etc/alternatives")
VOLUMES = tuple(f"--volume={m}:{m}:ro" for m in MOUNTS)
OPTIONS = ("--cgroups=disabled", *VOLUMES)  # podman's run options in the lab
RUN_OPTIONS = {"podman": OPTIONS, "docker": VOLUMES}  # docker's cgroups are off in its daemon (DAEMON_CONF)
CONTAINERS_CONF = '[containers]\nkeyring = false\n\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
STORAGE_CONF = (
    '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n'
)
# dockerd in an nspawn host (/etc/docker/daemon.json); each setting is needed, see the module's docstring.
DAEMON_CONF = {
    "bridge": "none",  # no docker0 on the machine's network, which the host shares; the engine runs --network=host
    "iptables": False,  # no rules in the machine's iptables
    "ip6tables": False,  # nor in ip6tables (on by default in later dockers)
    "ip-forward": False,  # /proc/sys is read-only in the host: with forwarding on, dockerd does not start
    "data-root": "/var/lib/knobfleet-lab/docker",  # not the machine's /var/lib/docker, whose containers it restarts
    "storage-driver": "vfs",  # overlay cannot nest on the host's overlay root
    "exec-opts": ["native.cgroupdriver=cgroupfs"],  # never ask the host's systemd for a scope
    "default-runtime": "crun-lab",  # the controllers are read-only in the host: no cgroup per container
    "runtimes": {"crun-lab": {"path": "/usr/bin/crun", "runtimeArgs": ["--cgroup-manager=disabled"]}},
    "log-driver": "journald",  # the engine's output in the host's journal, not in a file growing in its tmpfs
}
DOCKER_UNITS = ("containerd.service", "docker.service", "docker.socket")  # masked in other lab hosts
DOCKER_TOOLS = {"/usr/sbin/dockerd": "docker.io", "/usr/bin/containerd": "containerd", "/usr/bin/crun": "crun"}
# A docker host's nspawn settings: trusted (read from /run/systemd/nspawn/<machine>.nspawn), docker labs only.
NSPAWN_SETTINGS_DIR = Path("/run/systemd/nspawn")
NSPAWN_SETTINGS = (
    "# Written by `knobfleet lab up --runtime docker` (lab/labruntime.py); removed by `knobfleet lab down`.\n"
    "[Exec]\n"
    "# dockerd brings lo up in its default sandbox, even for --network=host containers\n"
    "Capability=CAP_NET_ADMIN\n"
    "# crun gives each container a session keyring\n"
    "SystemCallFilter=@keyring\n"
)


def load_unit(runtime: str = "podman") -> str:
    """The unit that loads the lab's images into ``runtime`` at boot, before the engine's unit starts."""
    needs = "Requires=docker.service\nAfter=docker.service\n" if runtime == "docker" else ""
    return (
        "[Unit]\nDescription=Load the lab's local images (knobfleet lab; nothing is pulled)\n"
        f"{needs}Before={hostfiles.SERVICE}.service\n\n"
        "[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        f"ExecStart=/bin/sh -c 'for f in {IMAGE_DIR}/*.tar; do /usr/bin/{runtime} load --quiet --input \"$f\"; done'"
        "\n\n[Install]\nWantedBy=multi-user.target\n"
    )


LOAD_UNIT = load_unit("podman")


def check(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise LabError(f"lab up --runtime {runtime}: choose one of {', '.join(RUNTIMES)}")


def check_tools(runtime: str) -> None:
    """What a docker lab host runs, checked on this machine (the hosts' root is an overlay of its own)."""
    if runtime != "docker":
        return
    missing = {path: pkg for path, pkg in DOCKER_TOOLS.items() if not Path(path).exists()}
    if missing:
        raise LabError(
            f"lab up --runtime docker: {', '.join(missing)} not found; lab hosts run them from this machine's "
            f"root: apt-get install -y {' '.join(sorted(set(missing.values())))}"
        )


def recorded(lab_dir: Path) -> str:
    f = lab_dir / "runtime"
    return f.read_text().strip() if f.is_file() else "systemd"


def record(lab_dir: Path, runtime: str, running: set[str]) -> None:
    """The lab's runtime, checked against the hosts already running (another runtime: `lab down` first)."""
    check(runtime)
    if running and recorded(lab_dir) != runtime:
        raise LabError(
            f"lab up --runtime {runtime}: {', '.join(sorted(running))} already run under {recorded(lab_dir)}; "
            "`knobfleet lab down` first"
        )
    check_tools(runtime)
    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / "runtime").write_text(f"{runtime}\n")


def build_image(tag: str, marker: str) -> tuple[bytes, str]:
    """A docker-archive of a minimal image (what ``podman load`` and ``docker load`` read) and its ID: one layer with
    a root's folders and ``/etc/knobfleet-image`` holding ``marker``; everything dated 0, so the same inputs give
    the same bytes and the same ID."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, mode in (("etc", 0o755), ("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755),
                           ("run", 0o755), ("root", 0o700), ("var", 0o755), ("var/tmp", 0o1777)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            t.addfile(info)
        body = f"knobfleet lab image {tag}: {marker}\n".encode()
        info = tarfile.TarInfo("etc/knobfleet-image")
        info.size, info.mode, info.mtime = len(body), 0o644, 0
        t.addfile(info, io.BytesIO(body))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Labels": {"org.knobfleet.lab.image": marker},
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "knobfleet lab (from files)"}],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    digest = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{digest}.json", "RepoTags": [tag], "Layers": [f"{diff_id[7:]}/layer.tar"]}])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in ((f"{digest}.json", config), (f"{diff_id[7:]}/layer.tar", layer_bytes),
                           ("manifest.json", manifest.encode())):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return out.getvalue(), "sha256:" + digest


def image_id(tag: str = "localhost/knobfleet-sim:1") -> str:
    return build_image(tag, IMAGES[tag])[1]


SIM_ENV = (("SGLANG_SIM_GPU", "rtx-pro-6000"), ("SGLANG_SIM_STARTUP_S", "1.5"), ("SGLANG_SIM_TIME_SCALE", "0.25"),
           ("SGLANG_SM120_MMA_TARGET_CTAS", "256"), ("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "0"))  # fmt: skip


def install_mounts(python: Path, root: Path) -> tuple[str, ...]:
    """The folders a real engine's cached install needs inside its container, mounted read-only at the same paths:
    the install's own folder (its venv and model) and the Python its venv was made from (``pyvenv.cfg``'s
    ``home``), unless a folder the image already mounts (``MOUNTS``) holds it."""
    folders = [str(root)]
    cfg = python.parent.parent / "pyvenv.cfg"
    home = next((line.split("=", 1)[1].strip() for line in (cfg.read_text().splitlines() if cfg.is_file() else [])
                 if line.split("=", 1)[0].strip() == "home"), "")  # fmt: skip
    if home:
        prefix = str(Path(home).parent)
        if not any(prefix == m or prefix.startswith(m + "/") for m in MOUNTS):
            folders.append(prefix)
    return tuple(folders)


def hand_written_unit(
    host: LabHost,
    model_path: str,
    runtime: str = "podman",
    engine: tuple[str, str, tuple[tuple[str, str], ...], tuple[str, ...]] | None = None,
) -> str:
    """The unit an operator wrote before knobfleet: ``podman run``/``docker run`` in ExecStart, knobs as ``-e``, by
    tag. docker's waits for its daemon and never pulls (its default pulls an image it does not have). ``engine``:
    a real engine's (service, command after the image, env, extra read-only mounts) instead of the stand-in's."""
    service, command, env_items, extra = engine or (
        hostfiles.SERVICE,
        f"/usr/bin/python3 -m sglang_sim.launch_server --model-path {model_path} \\\n"
        f"    --host {host.address} --port 30000 --tp 2 --trust-remote-code --disable-overlap-schedule",
        SIM_ENV,
        (),
    )
    env = " ".join(f"-e {k}={v}" for k, v in env_items)
    mounts = " ".join(f"-v {m}:{m}:ro" for m in (*MOUNTS, *extra))
    binary = f"/usr/bin/{runtime}"
    if runtime == "docker":
        after, needs, run_options = " docker.service", "Requires=docker.service\n", "--pull=never"
    else:
        after, needs, run_options = "", "", "--cgroups=disabled"
    what = "SGLang DSv4 decode server" if engine is None else f"{service} server"
    return (
        f"[Unit]\nDescription={what} ({runtime})\n"
        f"After=network.target{after} knobfleet-lab-images.service\n{needs}Wants=knobfleet-lab-images.service\n\n"
        "[Service]\n"
        f"ExecStartPre=-{binary} rm --force {service}\n"
        f"ExecStart={binary} run --rm --name {service} --network host {run_options} \\\n"
        f"    {env} \\\n    {mounts} \\\n    localhost/knobfleet-sim:1 \\\n"
        f"    {command}\n"
        f"ExecStop={binary} stop -t 10 {service}\n"
        "Restart=always\nRestartSec=3\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def sglang_unit(host: LabHost, python: Path, root: Path, model: Path, runtime: str) -> str:
    """The hand-written unit of a real-SGLang host in a container lab: the cached install mounted read-only into the
    lab's small image (``install_mounts``), the lab's SGLang env and flags, as an operator would write it."""
    flags = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in hostfiles.SGLANG_HOST_ARGS.items())
    command = (f"{python} -m sglang.launch_server --model-path {model} --host {host.address} "
               f"--port {hostfiles.SGLANG_PORT} \\\n    {flags}")  # fmt: skip
    engine = (hostfiles.SGLANG_SERVICE, command, tuple(sorted(hostfiles.SGLANG_ENV.items())),
              install_mounts(python, root))  # fmt: skip
    return hand_written_unit(host, str(model), runtime, engine)


def prepare(
    root: Path,
    host: LabHost,
    model_path: str,
    runtime: str = "podman",
    unit: str | None = None,
    script: str = hostfiles.SCRIPT_PATH,
) -> str:
    """A container host's own files under its ``root`` before it boots: the runtime's settings for nspawn, the
    images and the unit that loads them, the hand-written unit; returns that unit's text (no serve script: it runs
    by hand). docker's units are unmasked (``labroot.mask_units`` masks them: call this after it). ``unit`` and
    ``script``: a real engine's hand-written unit (``sglang_unit``) and the serve script it replaces."""

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    unit_dir = root / "etc/systemd/system"
    if runtime == "docker":
        write(root / "etc/docker/daemon.json", json.dumps(DAEMON_CONF, indent=2) + "\n")
        for name in DOCKER_UNITS:
            mask = unit_dir / name
            if mask.is_symlink() and str(mask.readlink()) == "/dev/null":
                mask.unlink()
    else:
        write(root / "etc/containers/containers.conf", CONTAINERS_CONF)
        write(root / "etc/containers/storage.conf", STORAGE_CONF)
    for tag, marker in IMAGES.items():
        data, _ = build_image(tag, marker)
        path = root / IMAGE_DIR.lstrip("/") / f"{tag.rsplit('/', 1)[-1].replace(':', '-')}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    write(unit_dir / "knobfleet-lab-images.service", load_unit(runtime))
    wants = unit_dir / "multi-user.target.wants" / "knobfleet-lab-images.service"
    wants.parent.mkdir(parents=True, exist_ok=True)
    wants.unlink(missing_ok=True)
    wants.symlink_to("/etc/systemd/system/knobfleet-lab-images.service")
    (root / script.lstrip("/")).unlink(missing_ok=True)
    return unit if unit is not None else hand_written_unit(host, model_path, runtime)


def nspawn_settings(host: LabHost) -> Path:
    """The machine's nspawn settings file, which systemd-nspawn reads when ``host`` boots (see NSPAWN_SETTINGS)."""
    return NSPAWN_SETTINGS_DIR / f"{host.machine}.nspawn"


def prepare_docker(lab: LabView, host: LabHost) -> None:
    """In a docker lab, after ``labroot.prepare`` (which writes a podman host's files only, and masks docker's
    units): a stand-in host's docker files and hand-written unit, and its nspawn settings (the capability and the
    system calls dockerd and crun need). Nothing for other labs, nor for a host that runs real vLLM or SGLang."""
    if recorded(lab.dir) != "docker" or (host.name in lab.vllm_hosts and lab.vllm is not None):
        return
    root = lab.host_dir(host) / "root"
    if host.name in lab.sglang_hosts and lab.sglang is not None:  # real SGLang, its cached install mounted
        inst = lab.sglang
        own = sglang_unit(host, inst.python, inst.root, inst.model_dir, "docker")
        unit = prepare(root, host, "", "docker", own, hostfiles.SGLANG_SCRIPT_PATH)
        service = hostfiles.SGLANG_SERVICE
    else:
        unit = prepare(root, host, lab.router_model or hostfiles.SIM_MODEL_PATH, "docker")
        service = hostfiles.SERVICE
    (root / "etc/systemd/system" / f"{service}.service").write_text(unit)
    NSPAWN_SETTINGS_DIR.mkdir(parents=True, exist_ok=True)
    nspawn_settings(host).write_text(NSPAWN_SETTINGS)


def engine_group_vars(lab_dir: Path, python: Path, root: Path) -> dict[str, object]:
    """What a real engine's group vars add in a container lab (none in a systemd lab): its run options, with its
    cached install mounted read-only (``install_mounts``)."""
    runtime = recorded(lab_dir)
    if runtime not in CONTAINER_RUNTIMES:
        return {}
    mounts = tuple(f"--volume={m}:{m}:ro" for m in install_mounts(python, root))
    return {"knob_serve_container_options": [*RUN_OPTIONS[runtime], *mounts]}


def group_vars(lab_dir: Path) -> str | None:
    """The inventory's runtime vars for a podman or docker lab (None for systemd): the runtime, the image by ID, the
    run options the lab needs (podman: cgroups off; both: the host's Python and the stand-in mounted read-only)."""
    runtime = recorded(lab_dir)
    if runtime not in CONTAINER_RUNTIMES:
        return None
    options = "".join(f"  - {o}\n" for o in RUN_OPTIONS[runtime])
    return (
        f"# Written by `knobfleet lab up --runtime {runtime}` (lab/labruntime.py): the engine runs in a container.\n"
        f"knob_serve_runtime: {runtime}\nknob_serve_image: {image_id()}\nknob_serve_container_options:\n{options}"
    )
