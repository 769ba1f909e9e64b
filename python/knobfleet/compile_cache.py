"""Pure: why an engine's compile cache will be cold after a change on a host (docs/CACHES.md).

The engines key their own cache entries: vLLM hashes its config and its version under ``VLLM_CACHE_ROOT``, SGLang its
compile config under ``SGLANG_CACHE_DIR``, Triton and TorchInductor the kernel source and their versions, FlashInfer's
autotune results sit under its version. A stale entry is never served; a change to any of these is a cold start, which
``plan`` names beside the restart it prints: ``invalidations(engine, before, after)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knobfleet.engines.adapter import Engine


@dataclass(frozen=True)
class Side:
    """One side of a change on a host: the engine version it runs (None: unknown), the env its serve script exports
    and the flags its engine is launched with (by the engine's canonical names; values as they run)."""

    version: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else value


def invalidations(engine: Engine, before: Side, after: Side) -> list[str]:
    """Why the engine's compile cache will be cold once ``after`` runs where ``before`` ran, one reason a line, in
    this order: the engine version changed; the cache folder moved (a catalog cache variable, ``serve.compile_caches``,
    points elsewhere, not only because of the version's own folder); a knob the catalog puts in the compile key
    (``serve.compile_caches.key``) changed. Empty: the cache stays warm, or no cache is kept (an engine without
    ``serve.compile_caches``, or a host whose script exports none of its variables: ``knob_serve_compile_cache:
    false``). An unknown version on either side is not a change."""
    caches = engine.compile_caches
    if not caches or not any(name in after.env for name in caches):
        return []
    out: list[str] = []
    moved_by_version = False
    if before.version and after.version and before.version != after.version:
        out.append(f"engine version changes from {before.version} to {after.version}")
        moved_by_version = True
    for name in sorted(caches):
        was, now = before.env.get(name), after.env.get(name)
        if was == now:
            continue
        if moved_by_version and was and now and was.replace(f"@{before.version}", f"@{after.version}") == now:
            continue  # the pinned version's own folder: said above
        out.append(f"the compile cache moves: {name} {_shown(was)} → {_shown(now)}")
        break  # one line: the folder moved
    env_names = set(engine.known_env)
    for name in engine.compile_key:
        side_b, side_a = (before.env, after.env) if name in env_names else (before.flags, after.flags)
        was, now = side_b.get(name), side_a.get(name)
        if was != now:
            label = name if name in env_names else f"--{name}"
            out.append(f"{label} changes ({_shown(was)} → {_shown(now)}): it enters the compile key")
    return out
