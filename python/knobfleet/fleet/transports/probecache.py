"""The controller's half of the probe cache (issue 29): which entry each host holds, the command that runs it, and
what the host said about it. The host's half is ``probeboot`` (sent as text, never imported there).

A host's first fast-path call sends the bundle (the module and its module_utils, ``base.bundle``) with a bootstrap
that compiles it, runs it and stores the code under ``<state root>/.probe/<sha256 of the entry>``; the host names
that digest on stderr and the controller keeps it under ``<state>/cache/probecode/<host key>.json`` with the
bundle's own digest. Every later call sends only the digest (a ~6 KB command, ~50 bytes of stdin): one round trip,
nothing compiled. The trust anchor is the controller: a host runs an entry only when its bytes hash to the digest
the controller sent. When the host has no usable entry the bootstrap says ``miss`` (exit 75) and the controller
sends the bundle at once: two round trips, only after the host lost or refused its entry.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from knobfleet.fleet.transports.probeboot import EXIT_MISS, MARK
from knobfleet.module_utils.knob_lean import sha256  # hashlib's digest without loading OpenSSL (~4 ms)

CACHE_DIR = ".probe"  # under the hosts' state root


FUTURE = "from __future__ import annotations\n"


@cache
def boot_text() -> str:
    """The program a host runs: module_utils/knob_lean.py (json's and hashlib's answers without their imports),
    then the bootstrap, as one ``-c`` text under the one ``__future__`` line both files start with."""
    here = Path(__file__)
    parts = [here.parents[2] / "module_utils" / "knob_lean.py", here.with_name("probeboot.py")]
    texts = [p.read_text(encoding="utf-8") for p in parts]
    assert all(FUTURE in t for t in texts), "knob_lean.py and probeboot.py each start with the __future__ import"
    return FUTURE + "\n".join(t.replace(FUTURE, "", 1) for t in texts)


def root_of(args: dict[str, Any]) -> str | None:
    """The host's cache directory for a call whose options name a service state dir (``<state root>/<service>``):
    ``<state root>/.probe``; None for other calls (they run uncached, as before)."""
    state_dir = str(args.get("state_dir") or "").rstrip("/")
    parent = state_dir.rpartition("/")[0]
    if not state_dir.startswith("/") or not parent or ".." in state_dir.split("/"):
        return None
    return f"{parent}/{CACHE_DIR}"


def bundle_digest(payload: bytes) -> str:
    """The digest of a bundle's code (module and module_utils; its private options left out)."""
    body = json.loads(payload)
    return str(sha256(json.dumps([body["utils"], body["module"]]).encode()).hexdigest())


def short_payload(payload: bytes) -> bytes:
    """What a host with a cached entry reads on stdin: the private options only."""
    private = json.loads(payload).get("args")
    return json.dumps({"args": private} if private else {}).encode()


SESSION_IDLE_S = 600.0  # a host's session interpreter ends after this long without a request


def command(
    python: str,
    root: str,
    digest: str | None,
    name: str,
    func: str,
    args: dict[str, Any],
    session: bool = False,
) -> str:
    """The shell command for the host: the bootstrap under ``python3 -I -S``, told the entry to run (or none);
    ``session``: it then keeps answering one line per call (probeboot.serve)."""
    words = [root, digest or "-", name, func, json.dumps(args, sort_keys=True)]
    if session:
        words += ["serve", f"{SESSION_IDLE_S:g}"]
    return " ".join([shlex.quote(python), "-I", "-S", "-c", shlex.quote(boot_text()), *map(shlex.quote, words)])


@dataclass(frozen=True)
class Event:
    """What the host's bootstrap said about its cache: hit, stored, replaced, miss or nocache."""

    kind: str
    digest: str = ""
    why: str = ""

    def __str__(self) -> str:
        return " ".join(x for x in (self.kind, self.why) if x)


def event(stderr: bytes) -> Event | None:
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith(MARK):
            kind, _, rest = line[len(MARK) :].strip().partition(" ")
            if kind in ("hit", "stored", "replaced"):
                digest, _, why = rest.partition(" ")
                return Event(kind, digest, why)
            return Event(kind, "", rest)
    return None


def is_miss(rc: int, ev: Event | None) -> bool:
    return rc == EXIT_MISS and ev is not None and ev.kind == "miss"


class Known:
    """Which entry each host holds for each bundle, as the host last said: one small file per host and bundle under
    ``where`` (0700). Per bundle, so two knobfleet versions run against the same hosts from one controller (an
    upgrade under way, a comparison) do not make each other resend: each host keeps several entries (``KEEP``)."""

    def __init__(self, where: Path) -> None:
        self.where = where

    @staticmethod
    def key(reach: list[str], python: str, root: str) -> str:
        """A host as the controller reaches it (its ssh argv, python and cache directory)."""
        return str(sha256(json.dumps([reach, python, root]).encode()).hexdigest())

    def _path(self, key: str, bundle: str) -> Path:
        return self.where / f"{key}.{bundle[:16]}.json"

    def get(self, key: str, bundle: str) -> str | None:
        try:
            from knobfleet import safefile

            got = json.loads(safefile.read_cache(self._path(key, bundle)) or "null")
        except (OSError, ValueError, RecursionError):
            return None
        code = got.get("code") if isinstance(got, dict) and got.get("bundle") == bundle else None
        return code if isinstance(code, str) and len(code) == 64 else None

    def put(self, key: str, bundle: str, code: str) -> None:
        if self.get(key, bundle) == code:
            return
        from knobfleet import safefile

        safefile.write_cache(self._path(key, bundle), json.dumps({"bundle": bundle, "code": code}))

    def drop(self, key: str, bundle: str) -> None:
        with contextlib.suppress(OSError):
            self._path(key, bundle).unlink()
