"""``report RECORD``: a stored experiment (a canary record, an A/B report.json) as one self-contained HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from knobfleet.cli import types
from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, KnobfleetError


def write_html(doc: dict[str, Any], out: Path, where: str) -> None:
    """Render ``doc`` and replace ``out`` with it (safefile: never through a symlink, FIFO or device)."""
    from knobfleet import safefile
    from knobfleet.experiment import html

    text = html.render(dict(doc), where)
    try:
        safefile.check_output(out)
        safefile.write_text(out, text)
    except (safefile.FileRefused, OSError) as exc:
        raise KnobfleetError(f"{out}: cannot write the report: {exc}") from None


def write_fleet(doc: dict[str, Any], out: Path, title: str) -> None:
    """``drift --report``: the fleet page (experiment.html.fleet_page) at ``out``, under the same rules."""
    from knobfleet import safefile
    from knobfleet.experiment import html

    try:
        safefile.check_output(out)
        safefile.write_text(out, html.fleet_page(dict(doc), title))
    except (safefile.FileRefused, OSError) as exc:
        raise KnobfleetError(f"{out}: cannot write the report: {exc}") from None


def cmd_report(args: argparse.Namespace) -> int:
    from knobfleet import paths
    from knobfleet.experiment import html

    source = Path(args.record)
    doc = html.load(source)
    out = args.out or source.with_suffix(".html")
    if args.out is None:
        types.html_file(str(out))  # the default path next to the record, under the same rules as --out
    write_html(doc, out, paths.display(source))
    _out(f"report: {paths.display(out)}")
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report", help="a stored canary record or A/B report.json as one self-contained HTML page (no URL loaded)"
    )
    p.add_argument("record", help="the record: .state/canaries/*.json (knobfleet history --canaries), or report.json")
    p.add_argument(
        "--out", "-o", type=types.html_file, default=None, metavar="FILE.html",
        help="where to write it (default: the record's path with .html)",
    )  # fmt: skip
    p.set_defaults(func=cmd_report)
