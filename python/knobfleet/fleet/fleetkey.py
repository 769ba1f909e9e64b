"""The fleet's key for secret markers: ``<secret hmac:…>`` is HMAC-SHA256(key, value), so a marker printed in a
plan, a ledger or a CI log cannot be tested against guesses by anyone without the key (an unsalted hash of a weak
password can). One random key per fleet, made on first use, kept owner-only in the project's state dir
(``.state/secret.key``, 0600); knobfleet hands it to the hosts with each module call (a no_log option), so host
and controller make the same markers. Copy the file to a second controller of the same fleet to get the same
markers there; a lost key only changes how markers read, never what is compared (both sides use one key per run).
"""

from __future__ import annotations

import os
import stat
from functools import cache

from knobfleet import paths
from knobfleet.errors import KnobfleetError

KEY_FILE = "secret.key"
KEY_BYTES = 32


@cache
def fleet_key() -> str:
    path = paths.state_dir() / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            import secrets  # only when a key is made

            fh.write(secrets.token_hex(KEY_BYTES) + "\n")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KnobfleetError(f"{paths.display(path)}: cannot read the fleet's secret key ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise KnobfleetError(
                f"{paths.display(path)}: the fleet's secret key must be a regular file owned by you and readable by "
                f"you only; fix it with chmod 600 (or delete it: a new key only changes how markers read)"
            )
        text = fh.read(256).decode("ascii", "replace").strip()
    if len(text) < 32:
        raise KnobfleetError(f"{paths.display(path)}: the fleet's secret key is too short; delete the file")
    return text
