"""Catalogs generated from the engines' own registries (``knobfleet catalog sync ENGINE``).

- vLLM: the installed engine itself (``vllm_venv`` provides it, cached): ``vllm_dump.py`` runs
  under its python and prints ``vllm.envs``' registry and the ``vllm serve`` parser as JSON;
- SGLang: its wheel from the package registry, read without importing it (``sglang_source``); or, with
  ``from_install=VENV_PYTHON``, an installed SGLang: ``sglang_dump.py`` runs under that python and prints the live
  ``Envs`` registry and the ``sglang serve`` parser as JSON, in the same shape (docs/sglang-catalog-diff.md);
- ``build`` turns either dump into a catalog (pure) and renders it as YAML.

``sync(engine, out_dir)`` writes ``out_dir/<engine>.yaml`` and returns its path.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from knobfleet.engines.sync import build
from knobfleet.errors import KnobfleetError

SGLANG_VERSION = "0.5.23"
ENGINES = ("vllm", "sglang")
_DUMP_SCRIPT = Path(__file__).resolve().parent / "vllm_dump.py"
_SGLANG_DUMP_SCRIPT = Path(__file__).resolve().parent / "sglang_dump.py"
# What an SGLang import needs here (its CPU engine; no hub, no network); the caller's SGLANG_*/SGL_ variables are
# dropped first, since they change what the registry reports (choices, deprecated-name rewrites).
SGLANG_DUMP_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SGLANG_DUMP_TIMEOUT_S = 600


def pinned_version(engine: str) -> str:
    if engine == "vllm":
        from knobfleet.engines.sync.vllm_venv import VLLM_VERSION

        return VLLM_VERSION
    if engine == "sglang":
        return SGLANG_VERSION
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def wheel_cache() -> Path:
    from knobfleet.engines.sync.vllm_venv import cache_root

    return cache_root() / "wheels"


def sglang_dump_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``sglang_dump.py`` runs in: ``base`` (default: ours) without SGLANG_*/SGL_, plus
    SGLANG_DUMP_ENV."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith(("SGLANG_", "SGL_"))}
    env.update(SGLANG_DUMP_ENV)
    return env


def dump_installed_sglang(python: Path, version: str | None = None) -> dict[str, Any]:
    """The registry dump of the SGLang installed for ``python`` (a venv's interpreter), read by importing it
    (sglang_dump.py). ``version`` (default: pinned) must be the installed one."""
    if not Path(python).exists():
        raise KnobfleetError(f"no python at {python}: name the python of a venv SGLang is installed in")
    try:
        proc = subprocess.run(
            [str(python), str(_SGLANG_DUMP_SCRIPT)],
            capture_output=True,
            text=True,
            env=sglang_dump_env(),
            timeout=SGLANG_DUMP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KnobfleetError(f"sglang_dump.py under {python}: no answer in {SGLANG_DUMP_TIMEOUT_S}s") from exc
    if proc.returncode != 0:
        raise KnobfleetError(f"sglang_dump.py failed under {python} (exit {proc.returncode}): {proc.stderr[-1500:]}")
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise KnobfleetError(f"sglang_dump.py under {python} printed no JSON dump: {exc}") from exc
    want = version or pinned_version("sglang")
    if str(data.get("version")) != want:
        raise KnobfleetError(
            f"{python} has sglang {data.get('version')}, not {want}: pass --version {data.get('version')} "
            "to generate that version's catalog"
        )
    return data


def dump(engine: str, version: str | None = None, from_install: Path | None = None) -> dict[str, Any]:
    """The engine's registry dump (see vllm_dump.py / sglang_source.py / sglang_dump.py) for ``version`` (default:
    pinned). ``from_install`` (SGLang only): the python of an SGLang venv to read the registry from, by import,
    instead of the wheel's source."""
    if from_install is not None:
        if engine != "sglang":
            raise ValueError(f"from_install is for sglang only ({engine} is always read from its install)")
        return dump_installed_sglang(from_install, version)
    version = version or pinned_version(engine)
    if engine == "vllm":
        from knobfleet.engines.sync import vllm_venv

        inst = vllm_venv.ensure_venv(version)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env["HF_HUB_OFFLINE"] = "1"
        proc = subprocess.run(
            [str(inst.python), str(_DUMP_SCRIPT)], capture_output=True, text=True, env=env, timeout=600, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"vllm_dump.py failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
        data: dict[str, Any] = json.loads(proc.stdout)
        return data
    if engine == "sglang":
        from knobfleet.engines.sync import sglang_source

        return sglang_source.dump_wheel(sglang_source.download_wheel(version, wheel_cache()))
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def render_dump(data: dict[str, Any]) -> str:
    """A dump as the generated catalog's YAML text."""
    catalog = build.build_catalog(data)
    return build.render(catalog, build.generated_header(catalog))


def sync(engine: str, out_dir: Path, version: str | None = None, from_install: Path | None = None) -> Path:
    """Regenerate ``out_dir/<engine>.yaml`` from the engine's own registry (``out_dir/<engine>@<version>.yaml`` for
    a version other than the pinned one: each synced version is kept); return its path. ``from_install``: see
    ``dump``.

    Writes only when the text changed (atomic rename), so an unchanged catalog keeps its mtime.
    """
    from knobfleet import safefile

    kept = version is not None and version != pinned_version(engine)  # another version: kept next to the pinned one
    path = out_dir / (f"{engine}@{version}.yaml" if kept else f"{engine}.yaml")
    try:  # before the dump's minutes: a planted symlink, FIFO or device at the output is refused, never followed
        safefile.check_output_dir(out_dir)
        safefile.check_output(path)
    except safefile.FileRefused as exc:
        from knobfleet.errors import KnobfleetError
        from knobfleet.rules import shown

        raise KnobfleetError(f"catalog sync: {shown(str(path))}: {exc}; nothing was written") from None
    text = render_dump(dump(engine, version, from_install))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:  # unchanged: keep its mtime (a regular file, read bounded; anything else is replaced below)
        if path.is_file() and safefile.read_text(path, len(text.encode()) + 1) == text:
            return path
    except safefile.FileRefused:
        pass
    safefile.write_text(path, text)  # atomic, through a random temp name in the folder
    return path
