"""The owner of a tune campaign: one run of a campaign at a time.

``knobfleet tune`` takes ``<state>/tune/<name>.lock``, next to the campaign's record, with ``fcntl.flock``
(non-blocking) for its whole run, and writes its PID, host and start time into it. A second run of the same
campaign (``--resume`` from another shell, or the same command again) while the first holds it is refused in one
line naming the holder and the fix; it would otherwise run the same stages again on the same hosts and each rewrite
the other's record. A lock file left by a run that ended without letting go (killed, host rebooted) has no holder:
the kernel dropped its lock with the process, and the next run takes it over without a word.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from knobfleet import paths, rules, safefile
from knobfleet.tune.run import TuneError

HOLDER_MAX_BYTES = 4096


class CampaignBusy(TuneError):
    """Another process runs this campaign now (it holds the campaign's lock)."""


def lock_path(record: Path) -> Path:
    return record.with_suffix(".lock")


@contextlib.contextmanager
def owned(record: Path, name: str) -> Iterator[None]:
    """Hold campaign ``name``'s lock (next to its ``record``) while the block runs; CampaignBusy when another
    process holds it, TuneError when the lock file cannot be one (a FIFO, a symlink, a folder there)."""
    import fcntl

    path = lock_path(record)
    where = rules.shown(paths.display_node(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = safefile.open_lock(path, "campaign lock")
    except safefile.FileRefused as exc:
        raise TuneError(f"{where}: {exc}; it only holds the PID of the run in progress") from None
    except OSError as exc:
        raise TuneError(f"{where}: cannot make its folder ({exc.strerror or exc}); nothing was run") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise TuneError(f"{where}: cannot lock ({exc.strerror or exc}); nothing was run") from None
            raise CampaignBusy(busy_line(record, name, holder(fd))) from None
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        safefile.rewrite(fd, (json.dumps(mine) + "\n").encode("utf-8"))
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                safefile.rewrite(fd, b"")  # let go: no holder named any more (closing drops the lock itself)
    finally:
        os.close(fd)


def holder(fd: int) -> dict[str, Any] | None:
    """What the lock's holder wrote of itself (PID, host, start time), or None: not written yet, or not ours."""
    try:
        doc = json.loads(os.pread(fd, HOLDER_MAX_BYTES, 0) or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    pid, host, started = doc.get("pid"), doc.get("host"), doc.get("started")
    if isinstance(pid, bool) or not isinstance(pid, int) or not isinstance(host, str):
        return None
    if isinstance(started, bool) or not isinstance(started, int | float):
        started = None
    return {"pid": pid, "host": host, "started": started}


def busy_line(record: Path, name: str, who: dict[str, Any] | None) -> str:
    """The one line that refuses a second run: the holder's PID, host and start time, and what to do."""
    where = rules.shown(paths.display(record))
    if who is None:
        return (
            f"{where}: campaign {name} is being run by another process (it has not written its PID yet); wait for "
            "it, or find it with `fuser` on the campaign's .lock file and stop it, then rerun with --resume"
        )
    pid, host = who["pid"], rules.shown(who["host"][:255])
    since = ""
    if who["started"] is not None:
        with contextlib.suppress(OverflowError, OSError, ValueError):
            since = " since " + time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(who["started"]))
    on = "" if host == socket.gethostname() else f" on {host}"
    return (
        f"{where}: campaign {name} is being run by PID {pid} on host {host}{since}; wait for it or stop PID "
        f"{pid}{on} (kill {pid}), then continue it with `knobfleet tune SPACE --resume`"
    )
