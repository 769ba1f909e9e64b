"""The one rule for secret *values* on the controller (issue 56, item 1): a value is secret when it came from the
vault (an inline ``!vault``, or any value of a vault-encrypted file: the inventory read says which, see
``fleet/ansible_inventory``), or when its shape is a credential's (``knob_redact.SHAPES``: a URL with a password,
a JWT, a GitHub/GitLab/Hugging Face/Slack token, an ``sk-`` key, an AWS key, a private key).

Names are ``knob_redact.is_secret``'s business (hosts and controller share it); this module is what every exit of
the process applies to free text it did not build from redacted parts: the one-line errors on stderr, the
internal-error line and its crash file (``cli``), and the inventory read's messages (``fleet/vaultvars.scrub``).

The vault values are remembered for the life of the process, as Ansible decrypts them: an error raised three
layers later still cannot quote one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from knobfleet.module_utils.knob_redact import SHAPES, URL_SHAPE, URL_START

VAULT_MARK = "<a vault value>"
SHAPE_MARK = "<a secret>"
MIN_LEN = 4  # shorter vault values (a port, "true") are not replaced in text: they would hide every such word
# A secret-shaped match runs on to the end of its token; never over what closes a quoted string or a JSON value,
# so the text around it keeps its shape.
TAIL = r"[^\s\"'\\,;)\]}>]*"

_VAULT: set[str] = set()


def remember(values: Iterable[str]) -> None:
    """Vault values this process decrypted: from now on no exit shows them."""
    _VAULT.update(v for v in values if isinstance(v, str) and len(v) >= MIN_LEN)


def forget() -> None:
    """Tests (and long-lived callers reading another project): nothing remembered."""
    _VAULT.clear()


def scrub(text: str, vaulted: Iterable[str] = ()) -> str:
    """``text`` with every vault value (remembered, and ``vaulted``; 4 characters or more, the longest first) and
    every credential-shaped span replaced by a placeholder. Pure but for the remembered values."""
    import json

    for v in sorted({*_VAULT, *(v for v in vaulted if len(v) >= MIN_LEN)}, key=len, reverse=True):
        for form in {v, repr(v)[1:-1], json.dumps(v)[1:-1]}:  # as written, and as a repr or a JSON string quotes it
            text = text.replace(form, VAULT_MARK)
    text = _urls(text)
    for what, pattern in SHAPES:
        if what != URL_SHAPE:
            text = re.sub(pattern + TAIL, SHAPE_MARK, text)
    return text


# knob_redact's URL shape without its run to the line's last "@": that run, tried from every scheme in a line, is
# quadratic (a 100 KB line of "a://b:" took seconds); here each line's last "@" is found once.
_URL_START = re.compile(URL_START)
_TAIL = re.compile(TAIL)


def _urls(text: str) -> str:
    """Every line's URL with a password, from its scheme through the line's last ``@`` and the host after it, as
    ``knob_redact.SHAPES``' URL shape reads it (the password runs to the last ``@``), in time linear in the text."""
    parts = re.split(r"([\r\n])", text)
    for i in range(0, len(parts), 2):
        line = parts[i]
        last = line.rfind("@")
        m = _URL_START.search(line, 0, last) if last > 0 else None
        if m is not None and m.end() <= last:
            end = _TAIL.match(line, last + 1)
            parts[i] = line[: m.start()] + SHAPE_MARK + line[end.end() if end else last + 1 :]
    return "".join(parts)
