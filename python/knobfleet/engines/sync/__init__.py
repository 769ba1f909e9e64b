"""Catalogs generated from the engines' own registries (``knobfleet catalog sync ENGINE``).

- vLLM: the installed engine itself (``vllm_venv`` provides it, cached): ``vllm_dump.py`` runs
  under its python and prints ``vllm.envs``' registry and the ``vllm serve`` parser as JSON;
- SGLang: its wheel from the package registry, read without importing it (``sglang_source``);
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

SGLANG_VERSION = "0.5.23"
ENGINES = ("vllm", "sglang")
_DUMP_SCRIPT = Path(__file__).resolve().parent / "vllm_dump.py"


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


def dump(engine: str, version: str | None = None) -> dict[str, Any]:
    """The engine's registry dump (see vllm_dump.py / sglang_source.py) for ``version`` (default: pinned)."""
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


def sync(engine: str, out_dir: Path, version: str | None = None) -> Path:
    """Regenerate ``out_dir/<engine>.yaml`` from the engine's own registry; return its path.

    Writes only when the text changed (atomic rename), so an unchanged catalog keeps its mtime.
    """
    text = render_dump(dump(engine, version))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{engine}.yaml"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return path
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
