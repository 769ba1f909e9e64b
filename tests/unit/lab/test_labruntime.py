"""knobfleet.lab.labruntime: the files a podman or docker lab host gets before it boots (a hand-written unit the
on-host reader takes apart like any other, the runtime's settings for nspawn, the images and their load unit), a
docker host's nspawn settings, the lab's runtime vars; the real hosts are tests/integration/test_containers.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from knobfleet.errors import LabError
from knobfleet.lab import hostfiles, labruntime
from knobfleet.lab.hostfiles import LabHost
from knobfleet.module_utils.knob_runtime import exec_start, split_run_line

HOST = LabHost(2, 1)


def masked_root(tmp_path: Path) -> Path:
    """A host root as ``labroot.prepare`` leaves it: docker's units masked, the serve script written."""
    root = tmp_path / "root"
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in labruntime.DOCKER_UNITS:
        (units / unit).symlink_to("/dev/null")
    script = root / hostfiles.SCRIPT_PATH.lstrip("/")
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/bash\n")
    return root


@pytest.mark.parametrize("runtime", labruntime.CONTAINER_RUNTIMES)
def test_the_hand_written_unit_runs_the_tagged_image_by_hand_and_stops_the_container(runtime: str) -> None:
    unit = labruntime.hand_written_unit(HOST, "/models/m", runtime)
    run = split_run_line(exec_start(unit))
    assert run is not None and run["runtime"] == runtime and run["image"] == "localhost/knobfleet-sim:1"
    assert run["name"] == hostfiles.SERVICE and run["restart"] is None
    assert run["env_pairs"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "256"
    assert run["engine"][:3] == ["/usr/bin/python3", "-m", "sglang_sim.launch_server"]
    assert f"--host {HOST.address} --port 30000" in unit
    assert f"ExecStop=/usr/bin/{runtime} stop -t 10 {hostfiles.SERVICE}\n" in unit
    assert f"ExecStartPre=-/usr/bin/{runtime} rm --force {hostfiles.SERVICE}\n" in unit
    if runtime == "docker":  # its daemon first; a missing image is never pulled (docker's default pulls it)
        assert run["pull"] == "never" and "--cgroups=disabled" not in run["options"]
        assert "Requires=docker.service\n" in unit and "After=network.target docker.service " in unit
    else:
        assert run["pull"] is None and "--cgroups=disabled" in run["options"] and "docker" not in unit


def test_a_docker_host_gets_the_daemons_settings_its_units_unmasked_the_images_and_no_serve_script(
    tmp_path: Path,
) -> None:
    root = masked_root(tmp_path)
    unit = labruntime.prepare(root, HOST, "/models/m", "docker")
    assert unit == labruntime.hand_written_unit(HOST, "/models/m", "docker")
    conf = json.loads((root / "etc/docker/daemon.json").read_text())
    assert conf["bridge"] == "none" and conf["iptables"] is False and conf["ip-forward"] is False
    assert conf["storage-driver"] == "vfs" and conf["data-root"] != "/var/lib/docker"
    assert conf["runtimes"][conf["default-runtime"]]["runtimeArgs"] == ["--cgroup-manager=disabled"]
    assert not {"registry-mirrors", "hosts"} & set(conf)  # nothing to pull from; docker.service's -H fd:// stays
    units = root / "etc/systemd/system"
    assert not any((units / u).is_symlink() for u in labruntime.DOCKER_UNITS)
    load = (units / "knobfleet-lab-images.service").read_text()
    assert "/usr/bin/docker load --quiet --input" in load and "Requires=docker.service\nAfter=docker.service\n" in load
    assert (units / "multi-user.target.wants/knobfleet-lab-images.service").is_symlink()
    images = sorted(p.name for p in (root / labruntime.IMAGE_DIR.lstrip("/")).iterdir())
    assert images == ["knobfleet-sim-1.tar", "knobfleet-sim-2.tar"]
    assert not (root / hostfiles.SCRIPT_PATH.lstrip("/")).exists() and not (root / "etc/containers").exists()


def test_a_podman_host_keeps_dockers_units_masked(tmp_path: Path) -> None:
    root = masked_root(tmp_path)
    unit = labruntime.prepare(root, HOST, "/models/m")
    assert unit == labruntime.hand_written_unit(HOST, "/models/m", "podman")
    assert "keyring = false" in (root / "etc/containers/containers.conf").read_text()
    assert all((root / "etc/systemd/system" / u).readlink() == Path("/dev/null") for u in labruntime.DOCKER_UNITS)
    assert (root / "etc/systemd/system/knobfleet-lab-images.service").read_text() == labruntime.LOAD_UNIT
    assert "docker" not in labruntime.LOAD_UNIT and not (root / "etc/docker").exists()


def test_an_unmask_removes_knobfleets_masks_only(tmp_path: Path) -> None:
    root = masked_root(tmp_path)
    own = root / "etc/systemd/system/docker.service"
    own.unlink()
    own.write_text("[Service]\nExecStart=/usr/sbin/dockerd\n")  # an operator's own unit stays
    labruntime.prepare(root, HOST, "/models/m", "docker")
    assert own.read_text() == "[Service]\nExecStart=/usr/sbin/dockerd\n"


def fake_lab(tmp_path: Path, runtime: str, vllm_hosts: tuple[str, ...] = ()) -> SimpleNamespace:
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "runtime").write_text(f"{runtime}\n")
    return SimpleNamespace(
        dir=lab_dir,
        vllm_hosts=set(vllm_hosts),
        vllm=object() if vllm_hosts else None,
        sglang_hosts=set(),
        sglang=None,
        router_model=None,
        host_dir=lambda host: tmp_path,
    )


@pytest.mark.parametrize(
    ("runtime", "vllm_hosts", "docker"),
    [("docker", (), True), ("podman", (), False), ("systemd", (), False), ("docker", ("lab2",), False)],
)
def test_only_a_docker_labs_stand_in_host_gets_dockers_files_and_nspawn_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str, vllm_hosts: tuple[str, ...], docker: bool
) -> None:
    monkeypatch.setattr(labruntime, "NSPAWN_SETTINGS_DIR", tmp_path / "run/systemd/nspawn")
    root = masked_root(tmp_path)
    labruntime.prepare_docker(fake_lab(tmp_path, runtime, vllm_hosts), HOST)  # type: ignore[arg-type]
    settings = labruntime.nspawn_settings(HOST)
    assert settings.name == f"{HOST.machine}.nspawn"
    assert settings.is_file() is docker and (root / "etc/docker/daemon.json").is_file() is docker
    if docker:
        assert "[Exec]\n" in settings.read_text()
        assert "\nCapability=CAP_NET_ADMIN\n" in settings.read_text()
        assert "\nSystemCallFilter=@keyring\n" in settings.read_text()
        unit = (root / "etc/systemd/system" / f"{hostfiles.SERVICE}.service").read_text()
        assert unit == labruntime.hand_written_unit(HOST, hostfiles.SIM_MODEL_PATH, "docker")


@pytest.mark.parametrize("runtime", labruntime.RUNTIMES)
def test_the_inventory_names_the_runtime_the_image_by_id_and_the_labs_run_options(tmp_path: Path, runtime: str) -> None:
    (tmp_path / "runtime").write_text(f"{runtime}\n")
    got = labruntime.group_vars(tmp_path)
    if runtime == "systemd":
        assert got is None
        return
    assert got is not None and f"knob_serve_runtime: {runtime}\n" in got
    assert f"knob_serve_image: {labruntime.image_id()}\n" in got
    assert ("  - --cgroups=disabled\n" in got) is (runtime == "podman")
    assert all(f"  - --volume={m}:{m}:ro\n" in got for m in labruntime.MOUNTS)


def test_a_lab_without_a_runtime_file_is_a_systemd_lab(tmp_path: Path) -> None:
    assert labruntime.recorded(tmp_path) == "systemd" and labruntime.group_vars(tmp_path) is None


def test_the_runtime_is_recorded_and_another_one_is_refused_while_hosts_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(labruntime, "DOCKER_TOOLS", {})
    labruntime.record(tmp_path, "docker", set())
    assert labruntime.recorded(tmp_path) == "docker"
    with pytest.raises(LabError, match=r"lab1 already run under docker; `knobfleet lab down` first"):
        labruntime.record(tmp_path, "podman", {"lab1"})
    with pytest.raises(LabError, match="choose one of systemd, podman, docker"):
        labruntime.record(tmp_path, "containerd", set())


def test_a_docker_lab_names_what_this_machine_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = {str(tmp_path / "dockerd"): "docker.io", str(tmp_path / "crun"): "crun"}
    monkeypatch.setattr(labruntime, "DOCKER_TOOLS", tools)
    (tmp_path / "dockerd").touch()
    with pytest.raises(LabError, match=rf"{tmp_path}/crun not found; .*apt-get install -y crun$"):
        labruntime.record(tmp_path / "lab", "docker", set())
    assert not (tmp_path / "lab" / "runtime").exists()
    labruntime.check_tools("podman")  # nothing asked of a podman lab


def test_the_image_is_the_same_bytes_and_id_for_the_same_inputs() -> None:
    data, image = labruntime.build_image("localhost/knobfleet-sim:1", "1")
    assert (data, image) == labruntime.build_image("localhost/knobfleet-sim:1", "1")
    assert image == labruntime.image_id() != labruntime.image_id("localhost/knobfleet-sim:2")


def fake_install(tmp_path: Path, home: str) -> SimpleNamespace:
    """A cached engine install as sglang_install lays it out: a venv made from the Python at ``home``, a model."""
    root = tmp_path / "cache" / "sglang-0.5.23"
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\n")
    return SimpleNamespace(root=root, python=root / "venv/bin/python", model_dir=root / "model/tiny-llama")


@pytest.mark.parametrize(
    ("home", "extra"),
    [
        ("/root/.pyenv/versions/3.11.7/bin", ["/root/.pyenv/versions/3.11.7"]),  # a pyenv Python: mounted too
        ("/usr/bin", []),  # the system's: /usr is mounted already
        ("/usr/local/bin", []),
    ],
)
def test_a_real_engines_install_is_mounted_read_only_with_the_python_its_venv_was_made_from(
    tmp_path: Path, home: str, extra: list[str]
) -> None:
    inst = fake_install(tmp_path, home)
    assert labruntime.install_mounts(inst.python, inst.root) == (str(inst.root), *extra)
    (inst.root / "venv" / "pyvenv.cfg").unlink()  # no pyvenv.cfg: the install's folder alone
    assert labruntime.install_mounts(inst.python, inst.root) == (str(inst.root),)


@pytest.mark.parametrize("runtime", labruntime.CONTAINER_RUNTIMES)
def test_a_real_sglang_hosts_hand_written_unit_runs_its_cached_install_in_the_labs_image(
    tmp_path: Path, runtime: str
) -> None:
    inst = fake_install(tmp_path, "/opt/python/bin")
    unit = labruntime.sglang_unit(HOST, inst.python, inst.root, inst.model_dir, runtime)
    run = split_run_line(exec_start(unit))
    assert run is not None and run["runtime"] == runtime and run["image"] == "localhost/knobfleet-sim:1"
    assert run["name"] == hostfiles.SGLANG_SERVICE and run["restart"] is None
    assert run["engine"][:3] == [str(inst.python), "-m", "sglang.launch_server"]
    assert run["env_pairs"] == hostfiles.SGLANG_ENV  # offline, the CPU engine
    for folder in (str(inst.root), "/opt/python", "/usr"):
        assert f"-v {folder}:{folder}:ro" in unit
    assert f"--host {HOST.address} --port {hostfiles.SGLANG_PORT}" in unit and "--enable-metrics" in unit
    assert f"ExecStop=/usr/bin/{runtime} stop -t 10 {hostfiles.SGLANG_SERVICE}\n" in unit


@pytest.mark.parametrize("runtime", labruntime.RUNTIMES)
def test_a_real_engines_group_vars_add_its_mounts_in_a_container_lab_only(tmp_path: Path, runtime: str) -> None:
    inst = fake_install(tmp_path, "/usr/bin")
    (tmp_path / "lab").mkdir()
    labruntime.record(tmp_path / "lab", runtime, set())
    got = labruntime.engine_group_vars(tmp_path / "lab", inst.python, inst.root)
    if runtime == "systemd":
        assert got == {}
    else:
        assert got == {"knob_serve_container_options": [*labruntime.RUN_OPTIONS[runtime],
                                                        f"--volume={inst.root}:{inst.root}:ro"]}  # fmt: skip
