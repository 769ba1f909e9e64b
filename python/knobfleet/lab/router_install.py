"""Install the lab's routers for the lab: pinned, cached, idempotent, offline after the first install. Two kinds,
both a Rust binary behind a small Python launcher with the same ``launch`` command line and worker API:

- ``sglang-router`` 0.3.2 (2026-01), SGLang's router as it was published under that name;
- ``smg`` 1.13.0 (2026-10), the same router renamed the SGLang Model Gateway, then SMG: what SGLang users run today.

Layout (outside /tmp, next to the lab's vLLM: ``knobfleet.lab.vllm_install``)::

    /var/cache/knobfleet/sglang-router-0.3.2/   (or smg-1.13.0/)
        venv/             its own virtualenv (never the project's): sglang-router and its launcher's deps
        installed.json    the stamp: written last, so a half-built install is rebuilt, never used
        install.log       pip's output from the last build

The router needs no torch and no GPU. ``python -m knobfleet.lab.router_install`` installs (or finds) it and
prints where it is; ``make router`` runs exactly that.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from knobfleet.engines.sync.vllm_venv import base_python, built_once, cache_root
from knobfleet.errors import LabError

ROUTER_VERSION = "0.3.2"
PIP_PACKAGE = "sglang-router"
# kind -> (pip package, pinned version, console script)
KINDS = {"sglang-router": ("sglang-router", "0.3.2", "sglang-router"), "smg": ("smg", "1.13.0", "smg")}
DEFAULT_KIND = "sglang-router"
# Bump when the venv recipe changes: an existing install with another recipe is rebuilt.
RECIPE = 1
PIP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class RouterInstall:
    version: str
    root: Path
    venv: Path
    python: Path
    router: Path
    package: str = PIP_PACKAGE

    def as_json(self) -> dict[str, str]:
        return {k: str(getattr(self, k)) for k in ("package", "version", "root", "venv", "python", "router")}


def layout(version: str | None = None, root: Path | None = None, kind: str = DEFAULT_KIND) -> RouterInstall:
    """Where an install of ``kind`` at ``version`` (default: the pinned one) lives (whether or not it exists)."""
    if kind not in KINDS:
        raise LabError(f"lab router: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    package, pinned, script = KINDS[kind]
    version = version or pinned
    base = (root or cache_root()) / f"{package}-{version}"
    venv = base / "venv"
    return RouterInstall(version, base, venv, venv / "bin" / "python", venv / "bin" / script, package)


def stamp(inst: RouterInstall) -> dict[str, object]:
    """What ``installed.json`` must hold for ``inst`` to count as installed."""
    return {"package": inst.package, "version": inst.version, "recipe": RECIPE}


def is_installed(inst: RouterInstall) -> bool:
    try:
        data = json.loads((inst.root / "installed.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(data == stamp(inst) and inst.python.exists() and inst.router.exists())


def _run(cmd: list[str], log: Path, timeout: float = PIP_TIMEOUT_S) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise LabError(
                f"router install: `{' '.join(cmd[:4])} …` timed out after {timeout:.0f}s; see {log}"
            ) from exc
    if proc.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        raise LabError(f"router install: `{' '.join(cmd[:6])} …` exited {proc.returncode}; see {log}\n{tail}")


def ensure(
    version: str | None = None,
    root: Path | None = None,
    say: Callable[[str], None] | None = None,
    kind: str = DEFAULT_KIND,
) -> RouterInstall:
    """Install ``kind`` (its pinned version, or ``version``) under the cache folder unless it is there; return
    where. A file lock serialises concurrent builds; LabError (with the tail of pip's log) when it is impossible."""
    inst = layout(version, root, kind)
    lock = inst.root.parent / f".{inst.package}-{inst.version}.lock"
    return built_once(inst, is_installed, lock, lambda emit: _build(inst, emit), say)


def _build(inst: RouterInstall, emit: Callable[[str], None]) -> None:
    inst.root.mkdir(parents=True, exist_ok=True)
    (inst.root / "installed.json").unlink(missing_ok=True)
    log = inst.root / "install.log"
    log.write_text("")
    t0 = time.monotonic()
    if inst.venv.exists():
        import shutil

        shutil.rmtree(inst.venv)
    _run([base_python(), "-m", "venv", str(inst.venv)], log)
    emit(f"router install: pip install {inst.package}=={inst.version} into {inst.venv}")
    _run([str(inst.python), "-m", "pip", "--disable-pip-version-check", "install", "--no-input",
          f"{inst.package}=={inst.version}"], log)  # fmt: skip
    _run([str(inst.router), "launch", "--help"], log, timeout=60)
    tmp = inst.root / "installed.json.tmp"
    tmp.write_text(json.dumps(stamp(inst), sort_keys=True) + "\n")
    tmp.replace(inst.root / "installed.json")
    emit(f"router install: ready in {time.monotonic() - t0:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knobfleet.lab.router_install", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=sorted(KINDS), action="append", help="router kind (default: every kind)")
    ap.add_argument("--version", default=None, help="version (default: the kind's pinned one)")
    ap.add_argument("--cache", type=Path, default=None, help="cache folder (default $KNOBFLEET_VLLM_CACHE or "
                    "/var/cache/knobfleet)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the paths as one JSON object")
    ns = ap.parse_args(argv)
    for kind in ns.kind or list(KINDS):
        try:
            inst = ensure(ns.version, ns.cache, kind=kind)
        except LabError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(json.dumps(inst.as_json(), sort_keys=True) if ns.json else f"router  {kind:<14} {inst.router}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
