"""One builder for the probe documents the unit tests hand the live rule and the read path.

``probe_doc`` gives what ``knob_observe.observe`` returns for a running, healthy engine that knobfleet installed
(schema 1): the unit active and running, the files the generation holds, no lock, no generation listed. A test
names only what its case is about: the processes (in cgroup order), the unit's properties it changes, and any
top-level key (``files``, ``health``, ``engine_version``, ...) it replaces.
"""

from __future__ import annotations

import copy
from typing import Any

MAIN = {
    "pid": 10,
    "comm": "python3",
    "cmdline": ["/bin/e", "--tp=2", "--flag"],
    "env": {"K": "1"},
    "start_epoch": 100.0,
}
FILES = {
    "script": {"exists": True, "sha256": "s", "mtime": 50.0, "path": "/s", "content": "a\n"},
    "unit": {"exists": True, "sha256": "u", "mtime": 50.0, "path": "/u", "content": "u\n"},
}
PROPS = {"ActiveState": "active", "SubState": "running", "MainPID": "10", "NeedDaemonReload": "no"}


def probe_doc(*procs: dict[str, Any], props: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A probe document: ``procs`` the unit's processes (default: one main process, ``MAIN``), ``props`` over
    the unit's properties, ``extra`` over the top-level keys."""
    doc: dict[str, Any] = {
        "schema_version": 1,
        "unit": "e.service",
        "unit_props": {**PROPS, **(props or {})},
        "health": 200,
        "health_url": "http://127.0.0.1:1/health",
        "files": copy.deepcopy(FILES),
        "processes": list(procs) if procs else [dict(MAIN)],
        "generations": {"lock": None, "list": []},
    }
    doc.update(extra)
    return doc
