"""The comment block above a line of Python source, as the registry readers take a knob's description from it.

Standard library only: the catalog dumps (``vllm_dump.py``, ``sglang_dump.py``) import it by its plain name when
they run standalone under an engine's venv (their folder is ``sys.path[0]``; knobfleet is not importable there),
and ``sglang_source.py`` as ``knobfleet.engines.sync.source_comments``."""

from __future__ import annotations


def comment_above(lines: list[str], lineno: int) -> str:
    """The comment block right above source line ``lineno`` (1-based), joined; stops at a section banner."""
    out: list[str] = []
    i = lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if not text.startswith("#"):
            break
        body = text.lstrip("#").strip()
        if body.startswith(("===", "---", "~~~")):
            break
        if body:
            out.append(body)
        i -= 1
    return " ".join(reversed(out))
