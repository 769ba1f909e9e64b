"""What every rendering of ``report`` shares (pure: returns strings, prints nothing): ``visible`` (human text with
terminal escapes, control and format characters shown escaped), the ``human`` decorator that passes a rendering
through it, JSON without NaN or infinities (``finite``, ``to_json``, ``json_line``) and the aligned ``table``.

``knobfleet.report`` re-exports every name here; the renderings live there and in its siblings (report_rollout,
report_knobs, report_prom).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

from knobfleet.rules import escaped, invisible

P = ParamSpec("P")


def visible(text: str) -> str:
    """Human output as it will show: raw terminal escapes, CR, other control and format characters (U+200B,
    U+202E…), separators, odd spaces, undecodable bytes and the blank letters ``isprintable`` passes (U+3164
    HANGUL FILLER, U+2800 BRAILLE PATTERN BLANK, variation selectors …: ``rules.invisible``) are written as escapes
    (\\x1b, \\r, \\u200b, \\udcff, \\u3164), so a value can neither hide itself nor rewrite the screen. Newlines
    and tabs stay."""
    if text.isascii():  # only the C0 controls and DEL can hide in ASCII: one pass of a regex
        return _ASCII_CONTROL.sub(lambda m: escaped(m.group()), text)
    return "".join(ch if ch in "\n\t" or not invisible(ch) else escaped(ch) for ch in text)


_ASCII_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def human(render: Callable[P, str]) -> Callable[P, str]:
    """Decorator: the human rendering's text passes through ``visible``."""
    import functools

    @functools.wraps(render)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> str:
        return visible(render(*args, **kwargs))

    return wrapper


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: JSON has neither (``Infinity`` breaks strict parsers)."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def to_json(data: Any) -> str:
    return json.dumps(finite(data), indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False)


def json_line(data: Any) -> str:
    """One JSON document on one line (``--json-lines``)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def terminal_width() -> int | None:
    """Columns to fit tables into: $COLUMNS, else the terminal's width when stdout is one; None (no limit) when
    writing to a pipe or file, so scripts and saved outputs get one line per row."""
    import os
    import shutil
    import sys

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((120, 24)).columns
    return None


@human
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "", width: int | None = None) -> str:
    """A plain aligned text table. ``align`` holds one 'l'/'r' per column (default: left). Wider than ``width``
    (default: ``terminal_width()``), the last column (notes, messages) wraps onto continuation lines."""
    import textwrap

    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    aligns = (align or "l" * len(headers)).ljust(len(headers), "l")
    limit = terminal_width() if width is None else width
    wrap_at = 0
    if limit and len(headers) > 1 and aligns[-1] == "l":
        lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
        if lead + widths[-1] > limit and limit - lead >= 20:
            wrap_at = limit - lead
            widths[-1] = max(len(cells[0][-1]), min(widths[-1], wrap_at))
    lines = []
    for n, r in enumerate(cells):
        tail = textwrap.wrap(r[-1], wrap_at, break_long_words=True) if wrap_at and n and len(r[-1]) > wrap_at else []
        row = [*r[:-1], tail[0]] if tail else r
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, aligns, strict=True)]
        lines.append("  ".join(parts).rstrip())
        pad = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))
        lines += [pad + more for more in tail[1:]]
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
