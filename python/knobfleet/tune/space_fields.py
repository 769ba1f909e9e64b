"""The field readers of a SPACE file's sections (pure): each takes the section, the key, the default and the
``bad(key, what)`` callback of ``space.parse``, says a problem once with the fix, and returns the default then."""

from __future__ import annotations

import math
import re
from typing import Any

DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*")


def duration(value: object) -> float | None:
    """``90s``, ``10m``, ``2h`` or a number of seconds; None when it is none of them (or not > 0)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value > 0 else None
    m = DURATION_RE.fullmatch(str(value))
    if not m or float(m.group(1)) <= 0:
        return None
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def int_field(sec: dict[str, Any], key: str, default: int, lo: int, where: str, bad: Any) -> int:
    v = sec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        bad(f"{where}.{key}", f"{v!r}: expected an integer >= {lo}")
        return default
    return v


def frac_field(sec: dict[str, Any], key: str, default: float, where: str, bad: Any) -> float:
    v = sec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        bad(f"{where}.{key}", f"{v!r}: expected a fraction in [0, 1), e.g. 0.05")
        return default
    return float(v)


def skip_reason(sec: dict[str, Any], where: str, bad: Any) -> str | None:
    if "skip" not in sec:
        return None
    v = sec["skip"]
    if not isinstance(v, str) or not v.strip():
        bad(f"{where}.skip", 'expected the reason, e.g. skip: "no GPU host in this fleet"')
        return "skipped"
    return v.strip()
