"""``report RECORD``: a stored experiment (a canary record, an A/B report.json, a tune record, a bench document) as
one self-contained HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from knobfleet import argtypes
from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, KnobfleetError


def write_page(text: str, out: Path) -> None:
    """Replace ``out`` with the page ``text`` (safefile: never through a symlink, FIFO or device)."""
    from knobfleet import safefile

    try:
        safefile.check_output(out)
        safefile.write_text(out, text)
    except (safefile.FileRefused, OSError) as exc:
        raise KnobfleetError(f"{out}: cannot write the report: {exc}") from None


def with_locked_hashes(doc: dict[str, Any]) -> dict[str, Any]:
    """The record with ``locked_hashes``: the content hash from profiles/profiles.lock of each published profile
    version (``name@version``) it names but does not hash itself (empty: the lock was read and has none of them).
    A published version's content never changes (a changed one fails to resolve), so the lock's hash is the
    content that ran. No lock to read (no project here, or an unreadable one): the record as it is."""
    from knobfleet.experiment.html_core import profile_roles
    from knobfleet.ops import profiles as app

    got = doc.get("profile_hashes")
    recorded: dict[str, Any] = got if isinstance(got, dict) else {}
    wanted = [ref for _, ref in profile_roles(doc) if "@" in ref and ref not in recorded]
    if not wanted:
        return doc
    try:
        lock = app.store().read_lock()
    except (KnobfleetError, OSError):
        return doc
    return {**doc, "locked_hashes": {ref: lock[ref] for ref in wanted if ref in lock}}


def write_html(doc: dict[str, Any], out: Path, where: str) -> None:
    """The page of a record (experiment.html.render, tune.report.tune_page) at ``out``, with the content hashes of
    the published profiles it names (``with_locked_hashes``)."""
    from knobfleet.experiment import html

    doc = with_locked_hashes(doc)
    if doc.get("kind") == "tune":  # a campaign's page is the tune wing's (experiment may not import it)
        from knobfleet.tune.report import tune_page

        write_page(tune_page(dict(doc)), out)
        return
    write_page(html.render(dict(doc), where), out)


def write_fleet(doc: dict[str, Any], out: Path, title: str) -> None:
    """``drift --report``: the fleet page (experiment.html.fleet_page) at ``out``."""
    from knobfleet.experiment import html

    write_page(html.fleet_page(dict(doc), title), out)


def without_secrets(data: Any) -> Any:
    """``data`` with every string shaped like a secret (``knob_redact.secret_shape``: a URL with a password, a
    token) replaced by ``<secret>``: a record knobfleet did not write may hold one, and the page is made to be
    shared."""
    from knobfleet.module_utils.knob_redact import redact_value, secret_shape

    if isinstance(data, str):
        return redact_value(data) if secret_shape(data) else data
    if isinstance(data, dict):
        return {without_secrets(k): without_secrets(v) for k, v in data.items()}
    if isinstance(data, list):
        return [without_secrets(v) for v in data]
    return data


def cmd_report(args: argparse.Namespace) -> int:
    from knobfleet import paths
    from knobfleet.experiment import html

    source = Path(args.record)
    doc = without_secrets(html.load(source))
    out = args.out or source.with_suffix(".html")
    if args.out is None:
        argtypes.html_file(str(out))  # the default path next to the record, under the same rules as --out
    write_html(doc, out, paths.display(source))
    from knobfleet.report_text import visible

    _out(f"report: {visible(paths.display(out))}")
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="a stored canary or tune record, an A/B report.json or a bench --json document as one self-contained "
        "HTML page (no URL loaded)",
    )
    p.add_argument(
        "record",
        help="the record: .state/canaries/*.json (knobfleet history --canaries), .state/tune/*.json, an A/B "
        "report.json, or what bench --json printed",
    )
    p.add_argument(
        "--out", "-o", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="where to write it (default: the record's path with .html)",
    )  # fmt: skip
    p.set_defaults(func=cmd_report)
