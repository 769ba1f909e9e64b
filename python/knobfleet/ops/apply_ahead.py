"""apply's head start: whether to start ansible-playbook before the pre-check has decided (``speculative``, with
its hint, the profile each host was last left on: ``last_applied``, ``remember_applied``), and the gated run
itself (``run_ahead``: the pre-check in a thread, the playbook waiting at its gate for the decision)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from knobfleet.fleet.hosts import Hosts
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import RunResult
from knobfleet.ops import interrupts
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.precheck import Options


def speculative(
    hosts: list[HostVars], opts: Options, profile_hash: str, last: dict[str, str], via: Hosts | None = None
) -> bool:
    """Whether apply starts ansible-playbook before its pre-check has decided: a real change (not --check) in one
    batch, on hosts the SSH fast path reaches (so the pre-check probes them and can gate the run), unless this
    controller's last apply left every host on this very profile (``last``: host -> profile hash): then the apply
    is most likely a no-change one, which needs no playbook at all, and the probe goes first. A wrong guess costs
    time only: the pre-check decides either way."""
    return (
        bool(hosts)
        and any(last.get(hv.host) != profile_hash for hv in hosts)
        and not opts.check
        and opts.serial is None
        and not opts.canary
        and (via or Hosts(Path("."), opts.via)).quick(hosts)
    )


def last_applied_file(inventory: Path) -> Path:
    import hashlib

    from knobfleet import paths

    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return paths.state_dir() / "cache" / "last-applied" / f"{key}.json"


def last_applied(inventory: Path) -> dict[str, str]:
    """Host -> the profile hash this controller's last apply left it on (a hint for ``speculative``, never trusted
    for a decision)."""
    import json

    try:
        data = json.loads(last_applied_file(inventory).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def remember_applied(inventory: Path, last: dict[str, str], profile_hash: str, outcomes: list[HostOutcome]) -> None:
    import json
    import os

    seen = dict(last)
    for o in outcomes:
        if o.status in ("applied", "unchanged"):
            seen[o.host] = profile_hash
        else:
            seen.pop(o.host, None)
    path = last_applied_file(inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(seen, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a hint only: apply works the same without it


def run_ahead(
    start: Callable[[Path, Callable[[], bool]], RunResult],
    run_id: str,
    n_hosts: int,
    decide: Callable[[], dict[str, HostOutcome]],
) -> tuple[dict[str, HostOutcome], RunResult | None]:
    """Run ``decide`` (the pre-check) in a thread while ``start`` runs the playbook here, gated: the role waits
    until the decision is in the gate file — the hosts decided (left alone or refused) end before anything runs
    on them; an error in the pre-check stops every host before any change and is raised here. When the pre-check
    decided every host, the playbook is cancelled: nothing can have run on any host before the gate. Returns the
    decisions and the run (None when every host was decided)."""
    import json
    import threading

    from knobfleet import paths

    gate = paths.state_dir() / "tmp" / f"gate-{run_id}.json"
    gate.parent.mkdir(parents=True, exist_ok=True)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["decided"] = decide()
            doc: dict[str, Any] = {"skip": sorted(box["decided"])}
            if interrupts.pending():  # Ctrl-C while the pre-check ran: stop every host before any change
                doc = {"abort": "knobfleet was interrupted during its pre-check; nothing was changed"}
                box["interrupted"] = True
        except BaseException as exc:  # raised below, in the caller's thread
            box["error"] = exc
            doc = {"abort": "knobfleet's pre-check failed; nothing was changed"}
        # decided before the gate appears: whoever reads the gate sees the cancel that goes with it
        box["cancel"] = "error" in box or "interrupted" in box or len(box.get("decided") or ()) == n_hosts
        tmp = gate.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(gate)  # whole or absent: the role reads it once it is non-empty

    thread = threading.Thread(target=work, name="pre-check", daemon=True)
    thread.start()
    try:
        result = start(gate, lambda: bool(box.get("cancel")))
    finally:
        thread.join()
        gate.unlink(missing_ok=True)
    if "error" in box:
        raise box["error"]
    decided: dict[str, HostOutcome] = box["decided"]
    return decided, (None if box["cancel"] else result)
