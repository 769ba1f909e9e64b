"""argparse types of the command line that only the CLI has: ``-i``, whose check reads the inventory's files and so
goes through ``ops.fleet`` (the CLI reaches the fleet package only through ops), and the engine name and version
words. The shared ones (``POSITIVE``, ``html_file``, ...) are imported from ``knobfleet.argtypes``."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from knobfleet.argtypes import path_arg, refuse
from knobfleet.rules import shown

__all__ = ["ENGINE", "VERSION", "inventory", "word"]


def inventory(value: str) -> Path:
    """-i: an inventory file or folder; every file in it a regular file of bounded size."""
    path = path_arg(value)
    from knobfleet.ops.fleet import check_sources

    why = check_sources(path)
    if why:
        raise refuse(f"{shown(value)}: {why}")
    return path


def word(what: str) -> Callable[[str], str]:
    """An engine name or version: part of a catalog's file name (``generated/ENGINE@VERSION.yaml``), so a plain word
    (letters, digits, ``._+-``): a ``/``, a newline or a NUL is refused while the line is parsed."""

    def check(value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", value):
            raise refuse(f"{shown(value)[:200]}: not {what} (letters, digits and ._+- only)")
        return value

    check.__name__ = what
    return check


ENGINE = word("an engine name")
VERSION = word("an engine version")
