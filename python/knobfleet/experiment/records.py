"""Experiment records on the controller: one JSON document per canary under ``<state>/canaries/``.

A record is written when the canary starts measuring and rewritten after every window (atomically, through
``safefile``), so an interrupted canary still leaves what it saw. ``history --canaries`` lists them and the
report renders one again. Reads are bounded, and a corrupt record or one from a newer knobfleet is one line
naming the file, never a traceback.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet import paths, safefile
from knobfleet.errors import KnobfleetError

SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 8 * 1024 * 1024
MAX_LISTED = 1000  # newest first; older records stay on disk


class RecordError(KnobfleetError):
    """A record that cannot be read: corrupt, too large, or from a newer knobfleet."""


def canary_dir() -> Path:
    return paths.state_dir() / "canaries"


def new_path(profile: str, started: float, folder: Path | None = None) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in profile)[:64]
    return (folder or canary_dir()) / f"{stamp}-{safe}.json"


def write(path: Path, kind: str, body: dict[str, Any]) -> None:
    from knobfleet.report_text import finite

    doc = {"schema_version": SCHEMA_VERSION, "kind": kind} | finite(body)
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    size = len(text.encode("utf-8"))
    if size > MAX_RECORD_BYTES:  # the writer refuses what its reader would: a record nobody could read back
        raise RecordError(
            f"{paths.display(path)}: a {kind} record of {size / 1024 / 1024:.1f} MiB, more than the "
            f"{MAX_RECORD_BYTES // 1024 // 1024} MiB a record may hold; not written (the earlier version stays)"
        )
    safefile.write_text(path, text, mode=0o600)


def read(path: Path) -> dict[str, Any]:
    try:
        text = safefile.read_text(path, MAX_RECORD_BYTES, "record")
    except safefile.FileRefused as exc:
        raise RecordError(f"{paths.display(path)}: {exc}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{paths.display(path)}: not a knobfleet record ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema_version"), int):
        raise RecordError(f"{paths.display(path)}: not a knobfleet record (no schema_version)")
    if doc["schema_version"] > SCHEMA_VERSION:
        raise RecordError(
            f"{paths.display(path)}: record schema {doc['schema_version']} is newer than this knobfleet reads "
            f"({SCHEMA_VERSION}); upgrade knobfleet to read it"
        )
    return doc


@dataclass(frozen=True)
class Listed:
    path: Path
    doc: dict[str, Any] | None  # None: unreadable (``error`` says why)
    error: str = ""


def list_canaries(folder: Path | None = None) -> list[Listed]:
    """Every canary record, newest first (at most ``MAX_LISTED``); unreadable ones are listed with the reason."""
    base = folder or canary_dir()
    try:
        names = sorted((p for p in base.iterdir() if p.suffix == ".json"), reverse=True)[:MAX_LISTED]
    except OSError:
        return []
    out = []
    for p in names:
        try:
            out.append(Listed(p, read(p)))
        except KnobfleetError as exc:
            out.append(Listed(p, None, str(exc)))
    return out
