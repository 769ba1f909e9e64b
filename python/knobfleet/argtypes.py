"""argparse types: every option value is checked while the command line is parsed, before anything is read from
or changed on a host. A refused value is one line (``knobfleet CMD: error: argument --opt: VALUE: why; fix``),
exit 64, without the usage text (``REFUSED`` tells the parser which errors are value refusals).

Path options: inputs must be regular files of bounded size (a FIFO or /dev/zero is refused without blocking);
outputs must be a regular file or a new path (never a device, FIFO, socket, directory or symlink).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from knobfleet import safefile
from knobfleet.rules import shown

# Messages of the refusals raised here: the parser prints these alone (one line), without the usage text.
REFUSED: list[str] = []

INVENTORY_MAX = 16 * safefile.MIB
VAULT_PASSWORD_MAX = 64 * safefile.KIB
SWEEP_MAX = 64 * safefile.MIB
CALIBRATIONS_MAX = 16 * safefile.MIB


def refuse(text: str) -> argparse.ArgumentTypeError:
    REFUSED.append(text)
    return argparse.ArgumentTypeError(text)


def path_arg(value: str) -> Path:
    if not value or "\0" in value:
        raise refuse(f"{shown(value)}: not a path")
    return Path(value).expanduser()


def input_file(max_bytes: int, what: str) -> Callable[[str], Path]:
    def check(value: str) -> Path:
        path = path_arg(value)
        try:
            safefile.check_input(path, max_bytes, what)
        except safefile.FileRefused as exc:
            raise refuse(f"{shown(value)}: {exc}") from None
        return path

    check.__name__ = what  # argparse names the type in some messages
    return check


def vault_id(value: str) -> str:
    """--vault-id ID@SOURCE: SOURCE is `prompt` or a password file (or script), which must be a regular file."""
    source = value.split("@", 1)[-1]
    if source not in ("prompt", "prompt_ask_vault_pass"):
        input_file(VAULT_PASSWORD_MAX, "vault password file")(source)
    return value


def _checked(value: str, check: Callable[[Path], object]) -> Path:
    """``value`` as a path ``check`` (one of safefile's) accepts; its refusal as the argument's error."""
    path = path_arg(value)
    try:
        check(path)
    except safefile.FileRefused as exc:
        raise refuse(f"{shown(value)}: {exc}") from None
    return path


def output_file(value: str) -> Path:
    return _checked(value, safefile.check_output)


def html_file(value: str) -> Path:
    """--report FILE.html: a new path or a regular file to replace, named .html (never a folder, device, FIFO or
    symlink: safefile's rules), checked before the experiment starts."""
    if not value.lower().endswith((".html", ".htm")):
        raise refuse(f"{shown(value)}: name an .html file (the report is one self-contained HTML page)")
    return output_file(value)


def report_target(value: str) -> Path:
    """ab --report: FILE.html (the HTML report there, the rest in the default folder) or a folder for
    report.{json,md,png,html}."""
    return html_file(value) if value.lower().endswith((".html", ".htm")) else output_dir(value)


def output_dir(value: str) -> Path:
    return _checked(value, safefile.check_output_dir)


def calibrations_file(value: str) -> Path:
    """--store: read (when present) and replaced: a regular file of bounded size, or a new path."""
    path = output_file(value)
    if path.exists():
        input_file(CALIBRATIONS_MAX, "calibrations file")(value)
    return path


def integer(lo: int, hi: int | None = None) -> Callable[[str], int]:
    def check(value: str) -> int:
        text = value.strip()
        if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit() and len(text) <= 19):
            raise refuse(f"{shown(value)}: not a whole number")
        n = int(text)
        if n < lo or (hi is not None and n > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise refuse(f"{n}: must be {bound}")
        return n

    check.__name__ = "integer"
    return check


def number(lo: float, hi: float) -> Callable[[str], float]:
    """A finite float in [lo, hi] (nan and inf are refused: they compare false with everything)."""

    def check(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise refuse(f"{shown(value)}: not a number") from None
        if not math.isfinite(x):
            raise refuse(f"{shown(value)}: not a finite number; give a value in {lo:g}..{hi:g}")
        if not lo <= x <= hi:
            raise refuse(f"{x:g}: must be in {lo:g}..{hi:g}")
        return x

    check.__name__ = "number"
    return check


def serial(value: str) -> str:
    """--serial N (hosts) or N% (of the fleet): N >= 1, a percentage 1..100."""
    text = value.strip()
    if text.endswith("%"):
        integer(1, 100)(text[:-1])
    else:
        integer(1)(text)
    return text


def int_list(value: str) -> tuple[int, ...]:
    """Comma-separated positive integers (concurrency buckets)."""
    parts = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in parts):
        raise refuse(f"{shown(value)}: give comma-separated whole numbers, e.g. 48,64")
    out = tuple(integer(1, 1_000_000)(p) for p in parts)
    if len(set(out)) != len(out):
        raise refuse(f"{shown(value)}: a value is repeated")
    return out


def checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """Validate with ``check`` while parsing, keep the text (the command parses it later)."""

    def keep(value: str) -> str:
        check(value)
        return value

    keep.__name__ = getattr(check, "__name__", "value")
    return keep


POSITIVE = integer(1)
NON_NEGATIVE = integer(0)
PERCENT = number(0.0, 100.0)
FRACTION = number(0.0, 1.0)
SECONDS = number(0.0, 86400.0)  # an interval: up to a day
