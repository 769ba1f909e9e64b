"""The machine-wide registry of lab slots (``labid``: what a slot picks): claimed by ``lab up`` under a lock,
given back by ``lab down``.

The registry is ``REGISTRY``, a folder on /run (a tmpfs, root's: labs do not outlive a reboot), one
``slot-<n>.json`` per claimed slot naming the lab's folder, id and the claiming process. A claim whose lab runs no
host and whose claiming process is gone is stale and taken over. The default id takes slot 0 only; any other id the
first free slot from 1. The kernel limits ``lab up`` raises are recorded here too (``limits``), under the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from knobfleet import labid
from knobfleet.errors import LabError
from knobfleet.lab import limits, neighbours
from knobfleet.labid import DEFAULT_ID, ENV, IDENTITY_FILE, MAX_SLOTS, Identity

REGISTRY = Path("/run/knobfleet/labs")


@contextlib.contextmanager
def locked(registry: Path = REGISTRY) -> Iterator[None]:
    """The registry's lock, held for the block: slots are claimed and kernel limits changed under it."""
    registry.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(registry / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _claim_file(registry: Path, slot: int) -> Path:
    return registry / f"slot-{slot}.json"


def _holder(registry: Path, slot: int) -> dict[str, object] | None:
    try:
        doc = json.loads(_claim_file(registry, slot).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(slot: int, registry: Path = REGISTRY) -> Path | None:
    """The folder of the lab that holds ``slot`` now (a live claim), None when it is free."""
    doc = _holder(registry, slot)
    if doc is None:
        return None
    folder = Path(str(doc.get("dir", "")))
    return folder if _alive(doc.get("pid")) or labid.running(folder) else None


def taken_slots(mine: Path) -> set[int]:
    """The slots a lab host of another lab than the one in ``mine`` runs in now (from the running nspawns)."""
    mine = mine.resolve()
    out = set()
    for machine, dirs in neighbours.running_labs().items():
        slot = labid.slot_of_machine(machine)
        if slot is not None and set(dirs) - {mine}:
            out.add(slot)
    return out


def for_up(state: Path, registry: Path = REGISTRY) -> Path:
    """The folder of the lab ``lab up`` without --id starts: KNOBFLEET_LAB's; the default lab when it runs here or
    its slot (127.0.1.N) is free; else a new lab named after the first free slot (``auto_id``)."""
    if os.environ.get(ENV, "").strip():
        return labid.selected(state)
    default = state / "lab"
    if labid.running(default):
        return default
    taken = taken_slots(default)
    other = holder(0, registry) if registry.is_dir() else None
    if 0 not in taken and other in (None, default.resolve()):
        return default
    for slot in range(1, MAX_SLOTS):
        other = holder(slot, registry) if registry.is_dir() else None
        if slot not in taken and other is None:
            return labid.lab_dir(state, labid.auto_id(slot))
    return default  # claim() says that every slot is taken


def claim(lab_folder: Path, lab_id: str, taken: set[int], registry: Path = REGISTRY) -> Identity:
    """Claim a slot for the lab in ``lab_folder`` (with id ``lab_id``) and record it there: the one it holds
    already, else slot 0 for the default id, else the first free slot from 1. ``taken``: slots a lab host of any
    checkout runs in now (from the running nspawns), busy whatever the registry says. LabError when none is free."""
    lab_folder = lab_folder.resolve()
    with locked(registry):
        mine = labid.read(lab_folder)
        if mine is not None and mine.id == lab_id:
            doc = _holder(registry, mine.slot)
            if doc is not None and Path(str(doc.get("dir"))) == lab_folder:
                _write_claim(registry, mine.slot, lab_folder, lab_id)
                return mine
        candidates = [0] if lab_id == DEFAULT_ID else list(range(1, MAX_SLOTS))
        for slot in candidates:
            other = holder(slot, registry)
            if slot in taken or (other is not None and other != lab_folder):
                continue
            _write_claim(registry, slot, lab_folder, lab_id)
            ident = Identity(lab_id, slot)
            lab_folder.mkdir(parents=True, exist_ok=True)
            (lab_folder / IDENTITY_FILE).write_text(json.dumps(ident.as_json()) + "\n", encoding="utf-8")
            return ident
    if lab_id == DEFAULT_ID:
        other = holder(0, registry)
        where = f"the lab in {other}" if other is not None else "another lab"
        raise LabError(f"lab up: the default lab's addresses (127.0.1.N) are taken by {where}; "
                       "start this one beside it with --id NAME, or stop that one first")  # fmt: skip
    raise LabError(f"lab up --id {lab_id}: all {MAX_SLOTS - 1} lab slots of this machine are taken; "
                   "stop a lab (`knobfleet lab down --id NAME`) first")  # fmt: skip


def _write_claim(registry: Path, slot: int, lab_folder: Path, lab_id: str) -> None:
    doc = {"dir": str(lab_folder), "id": lab_id, "pid": os.getpid()}
    tmp = registry / f".slot-{slot}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, _claim_file(registry, slot))


def release(lab_folder: Path, registry: Path = REGISTRY) -> None:
    """Give the lab's slot back (``lab down``, once none of its hosts runs): its claim, when it is still ours."""
    lab_folder = lab_folder.resolve()
    mine = labid.read(lab_folder)
    if mine is None or not registry.is_dir():
        return
    with locked(registry):
        doc = _holder(registry, mine.slot)
        if doc is not None and Path(str(doc.get("dir"))) == lab_folder:
            _claim_file(registry, mine.slot).unlink(missing_ok=True)
    (lab_folder / IDENTITY_FILE).unlink(missing_ok=True)


def put_limits_back(lab_folder: Path) -> list[str]:
    """The kernel limits ``lab up`` raised (``limits``), put back once no lab host of any checkout runs (the record
    is machine-wide, in ``REGISTRY``; a lab of 0.2.3 kept it in its own ``run/``). The notes to show."""
    with locked():
        if neighbours.running_labs():
            return []
        restored = limits.restore(REGISTRY) + limits.restore(lab_folder / "run")
    return [f"lab: put back {', '.join(restored)}"] if restored else []
