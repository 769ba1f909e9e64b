"""The compile cache's state on the host, before the engine starts (standard library only, no other import: the
on-host modules load it on the restart path). docs/CACHES.md."""

from __future__ import annotations

import os

# How many folder entries a look reads at most before it answers "cold": a cache holds its first file within a few
# folders; a folder tree of empty folders this large is no warm cache.
MAX_ENTRIES = 10000


def cache_state(root: str | None) -> str:
    """``"off"``, ``"cold"`` or ``"warm"``: what a start of the engine will find in its compile cache.

    ``root``: the engine's cache folder the serve script points its cache variables into (the ``dir`` of
    ``render.compile_cache_of`` / the role's ``knob_serve_cache.dir``: ``<cache root>/<engine>`` or, where the profile
    pins the engine version, ``<cache root>/<engine>@<version>``, so a version change finds a fresh folder).

    - ``"off"``: no cache is kept (``root`` is None or empty: ``knob_serve_compile_cache: false``, or an engine whose
      catalog names no ``serve.compile_caches``);
    - ``"warm"``: ``root`` is a folder holding at least one regular file, anywhere below it;
    - ``"cold"``: anything else: no such folder, only empty folders, a root that cannot be read, or no file within
      the first ``MAX_ENTRIES`` entries (a folder below the root that cannot be read is skipped).

    Read-only and never raises. ``root`` itself may be a symlink (the engine follows it too); no symlink below it is
    followed or counted. "warm" says some entry exists, not that this start's keys hit: the
    engines key their own entries (``compile_cache.invalidations`` says when a change misses them)."""
    if not root:
        return "off"
    seen = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        return "cold"
                    if entry.is_file(follow_symlinks=False):
                        return "warm"
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            if folder == root:
                return "cold"
            continue
    return "cold"
