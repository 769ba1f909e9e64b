"""The GPU preflight as the on-host transaction runs it (knob_guards.check_gpu): before anything stops on a container
host, the image's CUDA version, the driver and the CDI specs are read from the host and a problem is refused in one
line; a CPU host (no driver file, no nvidia-smi) is passed. The host's files are the test's own (tmp_path), shaped
like tests/data/gpu/h100 (see its README: hand-written, the device could not be had)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_guards, knob_runtime

DATA = Path(__file__).resolve().parents[2] / "data" / "gpu" / "h100"
RUN = {"runtime": "podman", "image": "sha256:" + "ab" * 32}


class Refused(Exception):
    pass


class Module:
    def fail_json(self, **kw: Any) -> None:
        raise Refused(kw)


def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool, cdi: str | None, env: list[str]) -> dict[str, Any]:
    proc = tmp_path / "version"
    if gpu:
        proc.write_text((DATA / "proc_driver_nvidia_version.txt").read_text())
    smi = tmp_path / "nvidia-smi"
    if gpu:
        smi.write_text(f"#!/bin/sh\ncat {DATA / 'nvidia-smi.txt'}\n")
        smi.chmod(0o755)
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    if cdi:
        (cdi_dir / "nvidia.yaml").write_text((DATA / cdi).read_text())
    monkeypatch.setattr(knob_runtime, "image_config", lambda runtime, ref: {"Env": env})
    return {"smi": str(smi), "proc": str(proc), "cdi_dirs": (str(cdi_dir),)}


@pytest.mark.parametrize(
    ("gpu", "cdi", "env", "refused"),
    [
        (True, "cdi-nvidia.yaml", ["CUDA_VERSION=12.4.1"], None),
        (True, "cdi-nvidia.yaml", ["CUDA_VERSION=13.1.0"], "needs CUDA 13.1"),
        (True, "cdi-nvidia-stale.yaml", ["CUDA_VERSION=12.4.1"], "regenerate it with nvidia-ctk cdi generate"),
        (False, "cdi-nvidia-stale.yaml", ["CUDA_VERSION=13.1.0"], None),  # a CPU host: nothing is said
    ],
)
def test_the_gpu_preflight_refuses_in_one_line_before_anything_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool, cdi: str, env: list[str], refused: str | None
) -> None:
    where = host(tmp_path, monkeypatch, gpu, cdi, env)
    if refused is None:
        knob_guards.check_gpu(Module(), RUN, **where)
        return
    with pytest.raises(Refused) as exc:
        knob_guards.check_gpu(Module(), RUN, **where)
    msg = exc.value.args[0]["msg"]
    assert refused in msg and msg.endswith("nothing was stopped") and "\n" not in msg
