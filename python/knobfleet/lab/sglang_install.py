"""Install real SGLang (0.5.23, CPU path) and the tiny offline model for the lab: idempotent and cached.

Layout, as for vLLM (``vllm_install``)::

    /var/cache/knobfleet/sglang-0.5.23/
        venv/                 its own virtualenv: torch 2.14.1, the packages of sglang-0.5.23.lock, sglang --no-deps,
                              and knobfleet's placeholder sgl_kernel (lab/sgl_kernel_placeholder.py)
        model/tiny-llama/     the same seeded tiny Llama as the vLLM install, built by this venv's python
        installed.json        the stamp: written last, so a half-built install is rebuilt, never used
        install.log           pip's output from the last build

SGLang's wheel asks for CUDA-only packages (sglang-kernel, flashinfer, cuda-python, ...), so it is installed with
``--no-deps`` after a hand-picked, locked list. Its compiled kernel package has no CPU build on any registry; on a
CPU without AMX SGLang calls none of its ops, so a placeholder whose every op raises (naming itself) stands in.
The venv is ~6.4 GB (the CUDA build of torch brings 3.2 GB of nvidia libraries that ``import torch`` needs) and
builds in ~3 min. Build it before ``lab up``: a lab host writes into its own upper layer.

``python -m knobfleet.lab.sglang_install`` installs (or finds) it and prints where things are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from knobfleet.engines.sync.vllm_venv import (
    base_python,
    built_once,
    cache_root,
    report,
    run_step,
    site_packages,
    write_stamp,
)
from knobfleet.errors import LabError

SGLANG_VERSION = "0.5.23"
MODEL_NAME = "tiny-llama"
_HERE = Path(__file__).resolve().parent
_PLACEHOLDER = _HERE / "sgl_kernel_placeholder.py"
_MODEL_SCRIPT = _HERE / "vllm_tiny_model.py"
# Free space the build needs (the venv is ~6.4 GB; pip unpacks wheels next to it).
NEED_FREE_BYTES = 9 * 1024**3
# The probe: SGLang's CPU platform, its server, scheduler and Llama modules import beside the placeholder.
PROBE = (
    "import importlib.metadata as m, torch, transformers, sgl_kernel; "
    "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.llama; "
    "from sglang.srt.utils import is_cpu; assert is_cpu(), 'SGLANG_USE_CPU_ENGINE not honoured'; "
    "print(m.version('sglang'), torch.__version__, transformers.__version__, sgl_kernel.__version__)"
)


@dataclass(frozen=True)
class SglangInstall:
    version: str
    root: Path
    venv: Path
    python: Path
    model_dir: Path

    def as_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def requirements(version: str = SGLANG_VERSION) -> Path:
    """The lock of what SGLang needs here, else the hand-picked list it was made from."""
    lock = _HERE / f"sglang-{version}.lock"
    return lock if lock.exists() else _HERE / f"sglang-{version}.in"


def recipe(version: str = SGLANG_VERSION) -> str:
    """Hash of everything the venv is made of: a changed list, placeholder or model builder means a rebuild."""
    h = hashlib.sha256(version.encode())
    for path in (requirements(version), _PLACEHOLDER, _MODEL_SCRIPT):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def layout(version: str = SGLANG_VERSION, root: Path | None = None) -> SglangInstall:
    base = (root or cache_root()) / f"sglang-{version}"
    venv = base / "venv"
    return SglangInstall(version, base, venv, venv / "bin" / "python", base / "model" / MODEL_NAME)


def _stamp(inst: SglangInstall) -> Path:
    return inst.root / "installed.json"


def is_installed(inst: SglangInstall) -> bool:
    try:
        data = json.loads(_stamp(inst).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("version") == inst.version
        and data.get("recipe") == recipe(inst.version)
        and inst.python.exists()
        and (inst.model_dir / "config.json").exists()
    )


def _check_space(inst: SglangInstall) -> None:
    probe = inst.root
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < NEED_FREE_BYTES:
        raise LabError(
            f"sglang install: {free / 1024**3:.1f} GiB free under {probe}; the SGLang venv needs "
            f"{NEED_FREE_BYTES / 1024**3:.0f} GiB (free some space, or set $KNOBFLEET_VLLM_CACHE to a larger disk)"
        )


def _build(inst: SglangInstall, log: Path, say: Callable[[str], None]) -> None:
    if inst.root.exists():
        shutil.rmtree(inst.root)
    inst.root.mkdir(parents=True)
    log.write_text("")
    t0 = time.monotonic()
    _step([base_python(), "-m", "venv", str(inst.venv)], log)
    pip = [str(inst.python), "-m", "pip", "--disable-pip-version-check", "install", "--no-input"]
    say(f"sglang install: pip install torch and {requirements(inst.version).name} into {inst.venv} (~3 min, ~6.4 GB)")
    _step([*pip, "-r", str(requirements(inst.version))], log)
    _step([*pip, "--no-deps", f"sglang=={inst.version}"], log)
    kernel = site_packages(inst.venv, "sglang install") / "sgl_kernel"
    kernel.mkdir()
    shutil.copyfile(_PLACEHOLDER, kernel / "__init__.py")
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _step([str(inst.python), "-c", PROBE], log, env, timeout=600)
    say(f"sglang install: venv ready in {time.monotonic() - t0:.0f}s")
    tmp = inst.model_dir.with_name(inst.model_dir.name + ".partial")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _step([str(inst.python), str(_MODEL_SCRIPT), str(tmp)], log, env, timeout=600)
    tmp.rename(inst.model_dir)
    say(f"sglang install: model {inst.model_dir} built")


def _step(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1800.0) -> None:
    run_step(cmd, log, timeout=timeout, env=env, what="sglang install")


def ensure(
    version: str = SGLANG_VERSION, root: Path | None = None, say: Callable[[str], None] | None = None
) -> SglangInstall:
    """Install SGLang ``version`` and the tiny model under the cache folder unless already there; return where.

    A file lock serialises builds. Raises LabError with one line saying what is missing (space, a package the
    registry does not serve) and the tail of pip's log.
    """
    inst = layout(version, root)

    def build(emit: Callable[[str], None]) -> None:
        _check_space(inst)
        log = inst.root.parent / f"sglang-{version}-install.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        _build(inst, log, emit)
        shutil.copyfile(log, inst.root / "install.log")
        write_stamp(_stamp(inst), {"version": version, "recipe": recipe(version)})

    return built_once(inst, is_installed, inst.root.parent / f".sglang-{version}.lock", build, say)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knobfleet.lab.sglang_install", description=__doc__.split("\n")[0])
    ap.add_argument("--version", default=SGLANG_VERSION, help=f"SGLang version (default {SGLANG_VERSION})")
    ap.add_argument(
        "--cache", type=Path, default=None, help="cache folder (default $KNOBFLEET_VLLM_CACHE or /var/cache/knobfleet)"
    )
    ap.add_argument("--json", action="store_true", help="print the paths as one JSON object")
    ns = ap.parse_args(argv)
    return report(
        lambda: ensure(ns.version, ns.cache), ns.json, lambda i: [f"python  {i.python}", f"model   {i.model_dir}"]
    )


if __name__ == "__main__":
    raise SystemExit(main())
