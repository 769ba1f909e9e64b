"""knob_gpu's preflight on GPU hosts, driven by files recorded on a real H100 host (tests/data/gpu/h100, see its
README): the recorded driver and CUDA versions parsed, images for a later CUDA refused and earlier ones accepted,
stale CDI specs (YAML and JSON) refused and matching ones accepted, a CPU host left alone, every refusal one line
naming the host, the file and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.module_utils import knob_gpu

DATA = Path(__file__).resolve().parents[2] / "data" / "gpu" / "h100"
PROC = (DATA / "proc_driver_nvidia_version.txt").read_text()
SMI = (DATA / "nvidia-smi.txt").read_text()
SMI_Q = (DATA / "nvidia-smi-q-head.txt").read_text()
QUERY = (DATA / "nvidia-smi-query.csv").read_text()
CDI_OK = (DATA / "cdi-nvidia.yaml").read_text()
CDI_STALE = (DATA / "cdi-nvidia-stale.yaml").read_text()
# nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv: a second, independent statement of the driver
RECORDED_DRIVER = QUERY.splitlines()[1].split(",")[1].strip()
STALE_DRIVER = "570.124.06"  # what cdi-nvidia-stale.yaml names
IMAGE = "vllm/vllm-openai@sha256:0123abcd"
SPEC = "/etc/cdi/nvidia.yaml"


def gpu(env: object = None, labels: dict[str, str] | None = None, cdi: dict[str, str] | None = None) -> list[str]:
    return knob_gpu.preflight("lab1", PROC, SMI, env, labels, cdi or {}, image=IMAGE)  # type: ignore[arg-type]


def test_the_recorded_driver_and_cuda_versions_are_read() -> None:
    assert knob_gpu.driver_version(PROC) == RECORDED_DRIVER
    assert knob_gpu.smi_driver_version(SMI) == RECORDED_DRIVER
    assert knob_gpu.smi_driver_version(SMI_Q) == RECORDED_DRIVER
    assert knob_gpu.smi_cuda_version(SMI) == (13, 0)
    assert knob_gpu.smi_cuda_version(SMI_Q) == (13, 0)
    assert knob_gpu.smi_mismatch(SMI) is None
    assert knob_gpu.mvc_major(RECORDED_DRIVER) == 13


def test_the_open_kernel_module_line_is_read_too() -> None:
    text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)  Tue\n"
    assert knob_gpu.driver_version(text) == "580.65.06"
    assert knob_gpu.driver_version("GCC version:  gcc version 13.3.0\n") is None


def test_the_recorded_host_with_no_image_nor_spec_is_accepted() -> None:
    assert gpu() == []


@pytest.mark.parametrize(
    ("env", "labels", "source"),
    [
        ({"CUDA_VERSION": "13.1.0"}, None, "its CUDA_VERSION"),
        (
            ["PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=13.1 brand=tesla,driver>=535,driver<536"],
            None,
            "its NVIDIA_REQUIRE_CUDA",
        ),
        (None, {"com.nvidia.cuda.version": "13.1.1"}, "its com.nvidia.cuda.version label"),
    ],
)
def test_an_image_for_cuda_13_1_is_refused(env: object, labels: dict[str, str] | None, source: str) -> None:
    (line,) = gpu(env, labels)
    assert line == (
        f"lab1: image {IMAGE} needs CUDA 13.1 ({source}) but the driver {RECORDED_DRIVER} "
        "(/proc/driver/nvidia/version) supports CUDA 13.0 (nvidia-smi); use an image built for CUDA <= 13.0, or "
        "upgrade the driver; nothing was stopped"
    )


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471"},
        {"CUDA_VERSION": "13.0.1"},
        ["CUDA_VERSION=13.0.0"],
        {"CUDA_VERSION": "11.8.0"},
    ],
)
def test_images_for_cuda_up_to_13_0_are_accepted(env: object) -> None:
    assert gpu(env) == []


@pytest.mark.parametrize("env", [None, {}, [], {"PATH": "/usr/bin"}, {"CUDA_VERSION": "latest"}, ["NOEQUALS"]])
def test_an_image_that_says_nothing_of_cuda_is_accepted_with_nothing_said(env: object) -> None:
    assert knob_gpu.image_cuda(env, {}) is None  # type: ignore[arg-type]
    assert gpu(env, {"org.opencontainers.image.version": "9.9"}) == []


def test_the_highest_requirement_of_an_image_is_the_one_checked() -> None:
    env = {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=13.2"}
    assert knob_gpu.image_cuda(env, {"com.nvidia.cuda.version": "12.8.1"}) == ((13, 2), "its NVIDIA_REQUIRE_CUDA")


def test_the_stale_cdi_spec_is_refused() -> None:
    assert knob_gpu.cdi_driver_versions(CDI_STALE) == [STALE_DRIVER]
    (line,) = gpu(cdi={SPEC: CDI_STALE})
    assert line == (
        f"lab1: /etc/cdi/nvidia.yaml names driver {STALE_DRIVER} but the loaded driver is {RECORDED_DRIVER} "
        "(/proc/driver/nvidia/version): containers started from it fail; regenerate it with nvidia-ctk cdi generate "
        "--output=/etc/cdi/nvidia.yaml; nothing was stopped"
    )


def test_the_matching_cdi_spec_is_accepted() -> None:
    assert knob_gpu.cdi_driver_versions(CDI_OK) == [RECORDED_DRIVER]
    assert knob_gpu.cdi_kind(CDI_OK) == "nvidia.com/gpu"
    assert gpu(cdi={SPEC: CDI_OK, "/var/run/cdi/nvidia.yaml": CDI_OK}) == []


def test_json_specs_are_read_the_same_way() -> None:
    stale = json.dumps(yaml.safe_load(CDI_STALE), indent=2)
    ok = json.dumps(yaml.safe_load(CDI_OK))  # one line, as json.Marshal writes it
    assert knob_gpu.cdi_kind(ok) == "nvidia.com/gpu"
    assert knob_gpu.cdi_driver_versions(ok) == [RECORDED_DRIVER]
    (line,) = gpu(cdi={"/var/run/cdi/nvidia.json": stale, "/etc/cdi/nvidia.json": ok})
    assert line.startswith(f"lab1: /var/run/cdi/nvidia.json names driver {STALE_DRIVER} ")
    assert "nvidia-ctk cdi generate --format=json --output=/var/run/cdi/nvidia.json;" in line


def test_versioned_non_driver_libraries_and_sonames_are_not_driver_versions() -> None:
    text = CDI_OK + (
        "  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1.1.19\n"
        "  - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so\n"
        "  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06.bak\n"
    )
    assert knob_gpu.cdi_driver_versions(text) == [RECORDED_DRIVER]


def test_another_vendors_spec_is_not_checked() -> None:
    other = CDI_STALE.replace("kind: nvidia.com/gpu", "kind: vendor.example.com/fpga")
    assert gpu(cdi={"/etc/cdi/fpga.yaml": other}) == []
    mgmt = CDI_STALE.replace("kind: nvidia.com/gpu", "kind: management.nvidia.com/gpu")
    assert len(gpu(cdi={"/etc/cdi/nvidia-mgmt.yaml": mgmt})) == 1


def test_a_cpu_host_gives_no_refusal() -> None:
    for proc, smi in ((None, None), ("", ""), (None, "  \n")):
        assert knob_gpu.preflight("cpu1", proc, smi, {"CUDA_VERSION": "13.1"}, {}, {SPEC: CDI_STALE}) == []


def test_without_nvidia_smi_the_minimum_driver_table_decides_the_major_family() -> None:
    def run(proc: str, cuda: str) -> list[str]:
        return knob_gpu.preflight("lab1", proc, None, {"CUDA_VERSION": cuda}, None, {})

    assert run(PROC, "13.1.0") == []  # 580: all of 13.x under minor-version compatibility
    (line,) = run(PROC, "14.0.0")
    assert "supports CUDA 13.x (NVIDIA's minimum-driver table; nvidia-smi gave no CUDA Version)" in line
    old = PROC.replace(RECORDED_DRIVER, "570.124.06")
    assert run(old, "12.9.1") == []
    (line,) = run(old, "13.0.0")
    assert "the driver 570.124.06 (/proc/driver/nvidia/version) supports CUDA 12.x" in line
    assert "use an image built for CUDA <= 12.x" in line


def test_the_smi_driver_is_used_when_the_proc_file_is_absent() -> None:
    (line,) = knob_gpu.preflight("lab1", None, SMI, {}, None, {SPEC: CDI_STALE})
    assert f"but the loaded driver is {RECORDED_DRIVER} (nvidia-smi)" in line


def test_a_driver_library_mismatch_is_refused() -> None:
    smi = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.200\n"
    lines = knob_gpu.preflight("lab1", PROC, smi, {"CUDA_VERSION": "12.4.1"}, None, {})
    assert lines == [
        f"lab1: nvidia-smi reports Driver/library version mismatch: the loaded kernel module is {RECORDED_DRIVER} "
        "(/proc/driver/nvidia/version) but the user-space driver is 580.200 (the driver was upgraded under a running "
        "module); reboot the host or reload the nvidia kernel modules; nothing was stopped"
    ]
    other = SMI.replace(f"Driver Version: {RECORDED_DRIVER}", "Driver Version: 580.999.01")
    assert "user-space driver is 580.999.01" in knob_gpu.preflight("lab1", PROC, other, None, None, {})[0]


def every_refusal() -> list[str]:
    smi_bad = "Failed to initialize NVML: Driver/library version mismatch\n"
    return [
        *gpu({"CUDA_VERSION": "13.1"}),
        *gpu(cdi={SPEC: CDI_STALE, "/var/run/cdi/nvidia.json": json.dumps(yaml.safe_load(CDI_STALE))}),
        *knob_gpu.preflight("lab1", PROC, None, {"CUDA_VERSION": "14.2"}, None, {}),
        *knob_gpu.preflight("lab1", PROC, smi_bad, None, None, {}),
    ]


def test_every_refusal_is_one_line_naming_host_file_and_fix() -> None:
    lines = every_refusal()
    assert len(lines) == 5
    for line in lines:
        assert "\n" not in line and "\r" not in line
        assert line.startswith("lab1: ") and line.endswith("; nothing was stopped")
        assert any(w in line for w in ("/proc/driver/nvidia/version", "nvidia-smi", "/etc/cdi/", "/var/run/cdi/"))
        assert any(w in line for w in ("upgrade the driver", "regenerate it with nvidia-ctk", "reboot the host"))


def test_names_carrying_newlines_still_give_one_line() -> None:
    lines = knob_gpu.preflight("lab\n1", PROC, SMI, {"CUDA_VERSION": "13.1"}, None, {"/etc/cdi/x\n.yaml": CDI_STALE})
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[1].startswith("lab?1: /etc/cdi/x?.yaml names driver")


def test_read_cdi_files_takes_only_regular_spec_files(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    (etc / "nvidia.yaml").write_text(CDI_STALE)
    (etc / "notes.txt").write_text("not a spec")
    (etc / "sub.json").mkdir()
    os.mkfifo(etc / "fifo.yaml")
    found = knob_gpu.read_cdi_files((str(etc), str(run)))
    assert found == {str(etc / "nvidia.yaml"): CDI_STALE}
    assert knob_gpu.read_text(str(tmp_path / "absent")) is None


versions = st.lists(st.integers(0, 999999), min_size=2, max_size=3).map(
    lambda parts: ".".join([str(parts[0])] + [f"{p:02d}" for p in parts[1:]])
)
cuda = st.tuples(st.integers(0, 999999), st.integers(0, 999999))


@settings(max_examples=300, deadline=None)
@given(versions)
def test_any_well_formed_driver_version_round_trips(version: str) -> None:
    proc = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n"
    assert knob_gpu.driver_version(proc) == version
    assert (
        knob_gpu.smi_driver_version(f"| NVIDIA-SMI {version}   Driver Version: {version}   CUDA Version: 13.0 |")
        == version
    )
    if int(version.split(".")[0]) >= 100:
        spec = f"kind: nvidia.com/gpu\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}\n"
        assert knob_gpu.cdi_driver_versions(spec) == [version]


@settings(max_examples=300, deadline=None)
@given(cuda, st.integers(0, 999))
def test_any_well_formed_cuda_version_round_trips(version: tuple[int, int], patch: int) -> None:
    text = knob_gpu.fmt_cuda(version)
    assert knob_gpu.cuda_version(text) == version
    assert knob_gpu.cuda_version(f"{text}.{patch}") == version
    assert knob_gpu.required_cuda(f"cuda>={text} brand=tesla,driver>=470,driver<471") == version
    assert knob_gpu.smi_cuda_version(f"Driver Version: 580.159.04     CUDA Version: {text}     |") == version


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=40))
def test_garbage_never_raises(text: str, name: str) -> None:
    for parse in (
        knob_gpu.driver_version,
        knob_gpu.smi_cuda_version,
        knob_gpu.smi_driver_version,
        knob_gpu.smi_mismatch,
        knob_gpu.cuda_version,
        knob_gpu.required_cuda,
        knob_gpu.cdi_kind,
        knob_gpu.cdi_driver_versions,
        knob_gpu.is_nvidia_spec,
    ):
        parse(text)
    lines = knob_gpu.preflight(
        name, text, text, {"CUDA_VERSION": text}, {"com.nvidia.cuda.version": text}, {name: text}
    )
    assert all("\n" not in line for line in lines)
    knob_gpu.preflight(name, PROC, SMI, [text], None, {SPEC: CDI_STALE + text})


def test_a_driver_older_than_the_table_refuses_any_cuda_11_image() -> None:
    old = PROC.replace(RECORDED_DRIVER, "440.33.01")
    (line,) = knob_gpu.preflight("lab1", old, None, {"CUDA_VERSION": "11.0.3"}, None, {})
    assert "supports CUDA older than 11.0 (NVIDIA's minimum-driver table" in line
    assert "use an image built for CUDA <= 10.x, or upgrade the driver" in line
    assert knob_gpu.preflight("lab1", old, None, {"CUDA_VERSION": "10.2"}, None, {}) == []
