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


# Unicode categories that never show as themselves: controls (Cc), format characters (Cf: U+200B, the bidi controls
# U+202A..U+202E and U+2066..U+2069, U+FEFF …), surrogates (Cs: undecodable bytes), private use (Co), unassigned (Cn),
# line and paragraph separators (Zl, Zp) and every space but U+0020 (Zs: U+00A0, U+2000..U+200A, U+3000 …).
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
# What shows as nothing though its category says letter, mark or symbol (so ``str.isprintable`` passes it): Unicode's
# Default_Ignorable_Code_Point set (DerivedCoreProperties.txt), whole, and the blank letters and symbols that pass for
# a space. Ranges, both ends included.
BLANK_RANGES = (
    (0x00AD, 0x00AD),  # SOFT HYPHEN
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER
    (0x061C, 0x061C),  # ARABIC LETTER MARK
    (0x115F, 0x1160),  # HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),  # KHMER VOWEL INHERENT AQ, AA
    (0x180B, 0x180F),  # MONGOLIAN FREE VARIATION SELECTORS, MONGOLIAN VOWEL SEPARATOR
    (0x200B, 0x200F),  # ZERO WIDTH SPACE, ZWNJ, ZWJ, LRM, RLM
    (0x202A, 0x202E),  # bidi embeddings and overrides
    (0x2060, 0x206F),  # WORD JOINER, invisible operators, bidi isolates, deprecated format characters
    (0x2800, 0x2800),  # BRAILLE PATTERN BLANK
    (0x3164, 0x3164),  # HANGUL FILLER
    (0xFE00, 0xFE0F),  # VARIATION SELECTORS
    (0xFEFF, 0xFEFF),  # ZERO WIDTH NO-BREAK SPACE (BOM)
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),  # unassigned, reserved default-ignorable
    (0x16FE4, 0x16FE4),  # KHITAN SMALL SCRIPT FILLER
    (0x1BCA0, 0x1BCA3),  # SHORTHAND FORMAT CONTROLS
    (0x1D159, 0x1D159),  # MUSICAL SYMBOL NULL NOTEHEAD
    (0x1D173, 0x1D17A),  # MUSICAL SYMBOL BEGIN/END BEAM, TIE, SLUR, PHRASE
    (0xE0000, 0xE0FFF),  # TAGS, VARIATION SELECTORS SUPPLEMENT, reserved default-ignorable
)
BLANKS = frozenset(n for lo, hi in BLANK_RANGES for n in range(lo, hi + 1))


def invisible(ch: str) -> bool:
    """A character that does not show, or changes how a terminal shows what follows: one of the
    ``INVISIBLE_CATEGORIES`` (controls, format characters such as U+200B and U+202E, separators, spaces other than
    U+0020, surrogates, private use, unassigned) or one of the ``BLANKS`` (U+3164 HANGUL FILLER, U+2800 BRAILLE
    PATTERN BLANK, variation selectors …), which ``str.isprintable`` passes."""
    if " " <= ch <= "~":  # printable ASCII: most of what is ever checked
        return False
    import unicodedata

    return ord(ch) in BLANKS or unicodedata.category(ch) in INVISIBLE_CATEGORIES


def escaped(ch: str) -> str:
    """One character as a Python escape: ``\\r``, ``\\x1b``, ``\\u3164``, ``\\U000e0001``."""
    n = ord(ch)
    if ch == "\r":
        return "\\r"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def first_invisible(text: str) -> tuple[int, str] | None:
    for i, ch in enumerate(text):
        if invisible(ch):
            return i, ch
    return None


def shown(text: str) -> str:
    """``text`` for a one-line message: as-is when every character shows, else Python's escaped repr with what
    ``repr`` leaves raw (blank letters such as U+3164) escaped too."""
    if first_invisible(text) is None:
        return text
    return "".join(escaped(c) if invisible(c) else c for c in repr(text))


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
