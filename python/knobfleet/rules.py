"""knob_serve's input rules, read from the one file both sides check: ``roles/knob_serve/vars/rules.json``.

The role's preflight (``tasks/preflight.yml``) loads the same file with ``include_vars`` and matches every pattern
whole (``regex`` test, ``match_type='fullmatch'``); here ``check`` uses ``re.fullmatch``. So what plain
``ansible-playbook`` accepts and what knobfleet's controller accepts cannot drift apart.

Stdlib only (json, re, unicodedata): the model and host-var modules read these at import.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent
_RELATIVE = Path("roles") / "knob_serve" / "vars" / "rules.json"
# A checkout (and an editable install) keeps the role in roles/; a wheel ships it inside the collection.
CANDIDATES = (
    _PACKAGE.parent.parent / _RELATIVE,
    _PACKAGE / "_data" / "ansible" / "collections" / "ansible_collections" / "knobfleet" / "serving" / _RELATIVE,
)


def rules_file() -> Path:
    for candidate in CANDIDATES:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"knob_serve's rules file is missing (looked in {', '.join(map(str, CANDIDATES))})")


@cache
def data() -> dict[str, Any]:
    """The whole rules document."""
    doc: dict[str, Any] = json.loads(rules_file().read_text(encoding="utf-8"))
    return doc


def pattern(name: str) -> str:
    return str(data()["patterns"][name]["pattern"])


def what(name: str) -> str:
    return str(data()["patterns"][name]["what"])


@cache
def regex(name: str) -> re.Pattern[str]:
    """The compiled rule ``name``; use ``fullmatch`` (``check`` does)."""
    return re.compile(pattern(name))


# Unicode gives control characters no names; these are their usual ones.
CONTROL_NAMES = {
    0x00: "NUL",
    0x07: "BELL",
    0x08: "BACKSPACE",
    0x09: "CHARACTER TABULATION",
    0x0A: "LINE FEED",
    0x0B: "LINE TABULATION",
    0x0C: "FORM FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x85: "NEXT LINE",
}


def describe_char(ch: str) -> str:
    """``U+200B ZERO WIDTH SPACE``: a character as an operator can find it."""
    import unicodedata  # only an error message needs it: not loaded on every command's path

    name = CONTROL_NAMES.get(ord(ch)) or unicodedata.name(ch, "")
    if not name:
        name = {"Cc": "control character", "Cs": "lone surrogate (undecodable byte)"}.get(
            unicodedata.category(ch), "unnamed character"
        )
    return f"U+{ord(ch):04X} {name}"


def invisible(ch: str) -> bool:
    """A character that does not show, or changes how a terminal shows what follows (controls, format
    characters such as U+200B and U+202E, line/paragraph separators, odd spaces, surrogates, private use)."""
    return not ch.isprintable() and ch != " "


def first_invisible(text: str) -> tuple[int, str] | None:
    for i, ch in enumerate(text):
        if invisible(ch):
            return i, ch
    return None


def shown(text: str) -> str:
    """``text`` for a one-line message: as-is when every character shows, else Python's escaped repr."""
    return text if text.isprintable() else repr(text)


def check(name: str, value: object) -> str | None:
    """Why ``value`` breaks rule ``name`` (one phrase, naming an invisible character when there is one), or
    None when it is fine."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return f"must be {what(name)}, not {type(value).__name__}"
    text = str(value)
    if regex(name).fullmatch(text):
        return None
    hit = first_invisible(text)
    if hit is not None:
        at, ch = hit
        return f"contains {describe_char(ch)} at position {at} (invisible); remove it"
    return f"must be {what(name)}"


def is_loader_env(name: str) -> bool:
    """An env var that changes what a process loads or runs (LD_*, BASH_ENV, PATH, PYTHON*, …)."""
    loader = data()["loader_env"]
    if name in loader["names"] or name.startswith(tuple(loader["prefixes"])):
        return True
    # a plugin or injection variable a later NCCL or CUDA adds is one before it is listed (fullmatch, as the role)
    return any(re.fullmatch(p, name) for p in loader.get("patterns", ()))


def is_shell_reserved(name: str) -> bool:
    """A name bash refuses to assign (``UID``, ``EUID``, ``BASH_VERSINFO`` …): an export of it kills the script."""
    return name in data()["shell_reserved"]["names"]


def is_reserved_unit(name: str) -> bool:
    """A unit the host needs (sshd, systemd's own, the container runtime …): never knob_serve_service."""
    units = data()["reserved_units"]
    base = name.removesuffix(".service")
    return base in units["names"] or base.startswith(tuple(units["prefixes"]))
