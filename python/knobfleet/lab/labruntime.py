"""``lab up --runtime podman``: lab hosts whose stand-in engine runs in a container, started by a hand-written
``podman run`` unit (the shape an operator writes: the run line in ExecStart, no script), which the first apply
adopts as generation 0.

Nothing is pulled, ever: the image is built here, from files, as a docker-archive (``build_image``: one layer
holding the folders a root needs and a marker file, a config with a fixed creation time), so its ID is the
sha256 of its config and known before any runtime sees it; each host loads it with ``podman load`` at boot
(``knobfleet-lab-images.service``). The stand-in's code and Python come from the host itself, mounted read-only
(the way a cached install is mounted into a small image). Two images differ by their marker only: ``sim:1`` the
one the hand-written unit and the inventory name, ``sim:2`` a second one for the tests (a retag, a rollback).

Podman inside a systemd-nspawn host: the kernel keyring is not permitted there (``keyring = false``), cgroups
are not delegated (``--cgroups=disabled``: the container's processes stay in the unit's cgroup), and overlay
storage cannot nest (``vfs``). docker's daemon cannot create its network sandbox inside nspawn (EPERM), so
``--runtime docker`` is refused for the lab; the docker runtime is proven by the contract tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from knobfleet.errors import LabError
from knobfleet.lab import hostfiles
from knobfleet.lab.hostfiles import LabHost

RUNTIMES = ("systemd", "podman")
IMAGE_DIR = "/var/lib/knobfleet-lab/images"
IMAGES = {"localhost/knobfleet-sim:1": "1", "localhost/knobfleet-sim:2": "2"}
MOUNTS = ("/usr", "/lib", "/lib64", "/bin", "/etc/alternatives")
OPTIONS = ("--cgroups=disabled", *(f"--volume={m}:{m}:ro" for m in MOUNTS))
CONTAINERS_CONF = '[containers]\nkeyring = false\n\n[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
STORAGE_CONF = (
    '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n'
)
LOAD_UNIT = (
    "[Unit]\nDescription=Load the lab's local images (knobfleet lab; nothing is pulled)\n"
    f"Before={hostfiles.SERVICE}.service\n\n"
    "[Service]\nType=oneshot\nRemainAfterExit=yes\n"
    f"ExecStart=/bin/sh -c 'for f in {IMAGE_DIR}/*.tar; do /usr/bin/podman load --quiet --input \"$f\"; done'\n\n"
    "[Install]\nWantedBy=multi-user.target\n"
)


def check(runtime: str) -> None:
    if runtime == "docker":
        raise LabError(
            "lab up --runtime docker: docker's daemon cannot create its network sandbox inside a systemd-nspawn "
            "host (operation not permitted); use --runtime podman (the docker runtime is covered by the contract "
            "tests, tests/unit/test_runtimes.py)"
        )
    if runtime not in RUNTIMES:
        raise LabError(f"lab up --runtime {runtime}: choose one of {', '.join(RUNTIMES)}")


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


def hand_written_unit(host: LabHost, model_path: str) -> str:
    """The unit an operator wrote before knobfleet: ``podman run`` in ExecStart, knobs as ``-e``, by tag."""
    env = " ".join(f"-e {k}={v}" for k, v in (("SGLANG_SIM_GPU", "rtx-pro-6000"), ("SGLANG_SIM_STARTUP_S", "1.5"),
                   ("SGLANG_SIM_TIME_SCALE", "0.25"), ("SGLANG_SM120_MMA_TARGET_CTAS", "256"),
                   ("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", "0")))  # fmt: skip
    mounts = " ".join(f"-v {m}:{m}:ro" for m in MOUNTS)
    return (
        "[Unit]\nDescription=SGLang DSv4 decode server (podman)\n"
        "After=network.target knobfleet-lab-images.service\nWants=knobfleet-lab-images.service\n\n"
        "[Service]\n"
        f"ExecStartPre=-/usr/bin/podman rm --force {hostfiles.SERVICE}\n"
        f"ExecStart=/usr/bin/podman run --rm --name {hostfiles.SERVICE} --network host --cgroups=disabled \\\n"
        f"    {env} \\\n    {mounts} \\\n    localhost/knobfleet-sim:1 \\\n"
        f"    /usr/bin/python3 -m sglang_sim.launch_server --model-path {model_path} \\\n"
        f"    --host {host.address} --port 30000 --tp 2 --trust-remote-code --disable-overlap-schedule\n"
        f"ExecStop=/usr/bin/podman stop -t 10 {hostfiles.SERVICE}\n"
        "Restart=always\nRestartSec=3\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def prepare(root: Path, host: LabHost, model_path: str) -> str:
    """A podman host's own files under its ``root`` before it boots: podman's settings for nspawn, the images and
    the unit that loads them, the hand-written unit; returns that unit's text (no serve script: it runs by hand)."""

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write(root / "etc/containers/containers.conf", CONTAINERS_CONF)
    write(root / "etc/containers/storage.conf", STORAGE_CONF)
    for tag, marker in IMAGES.items():
        data, _ = build_image(tag, marker)
        path = root / IMAGE_DIR.lstrip("/") / f"{tag.rsplit('/', 1)[-1].replace(':', '-')}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    unit_dir = root / "etc/systemd/system"
    write(unit_dir / "knobfleet-lab-images.service", LOAD_UNIT)
    wants = unit_dir / "multi-user.target.wants" / "knobfleet-lab-images.service"
    wants.parent.mkdir(parents=True, exist_ok=True)
    wants.unlink(missing_ok=True)
    wants.symlink_to("/etc/systemd/system/knobfleet-lab-images.service")
    (root / hostfiles.SCRIPT_PATH.lstrip("/")).unlink(missing_ok=True)
    return hand_written_unit(host, model_path)


def group_vars(lab_dir: Path) -> str | None:
    """The inventory's runtime vars for a podman lab (None for systemd): the runtime, the image by ID, the run
    options the lab needs (cgroups off, the host's Python and the stand-in mounted read-only)."""
    if recorded(lab_dir) != "podman":
        return None
    options = "".join(f"  - {o}\n" for o in OPTIONS)
    return (
        "# Written by `knobfleet lab up --runtime podman` (lab/labruntime.py): the engine runs in a container.\n"
        f"knob_serve_runtime: podman\nknob_serve_image: {image_id()}\nknob_serve_container_options:\n{options}"
    )
