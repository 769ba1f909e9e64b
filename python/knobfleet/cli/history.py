"""``history`` and ``rollback``: generations as stored on the hosts."""

from __future__ import annotations

import argparse
import sys

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, via_opt
from knobfleet.errors import EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def cmd_history(args: argparse.Namespace) -> int:
    from knobfleet import report_rollout, report_text
    from knobfleet.ops import fleet
    from knobfleet.ops.history import history

    if args.canaries:
        return _canaries(args)
    inventory = common.inventory(args)
    result = history(fleet.hosts(inventory, args.limit), fleet.door(inventory, args.via))
    doc = {"hosts": [h.as_json() for h in result]}
    if args.report is not None:  # every measured restart, plotted (docs/RESTARTS.md)
        from knobfleet.cli.report import write_page
        from knobfleet.experiment.html import restarts_page

        write_page(restarts_page(doc), args.report)
    if args.json:
        _out(report_text.to_json(doc))
    else:
        _out(report_rollout.history_report(result, args.ledger))
        if args.report is not None:
            _out(f"report: {args.report}")
    return EXIT_UNREACHABLE if any(h.unreachable for h in result) else EXIT_OK


def _canaries(args: argparse.Namespace) -> int:
    """``history --canaries``: the canary records kept on this controller, newest first."""
    from knobfleet import report_rollout, report_text
    from knobfleet.experiment import records

    listed = records.list_canaries()
    if args.json:
        rows = [{"record": str(x.path), **(x.doc or {"error": x.error})} for x in listed]
        _out(report_text.to_json({"canaries": rows}))
    else:
        _out(report_rollout.canary_records(listed))
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    from knobfleet import report_rollout, report_text
    from knobfleet.errors import KnobfleetError
    from knobfleet.ops import fleet, interrupts
    from knobfleet.ops.history import rollback
    from knobfleet.progress import Progress

    inventory = common.inventory(args)
    hosts = fleet.hosts(inventory, args.limit)
    if args.to is not None and args.to < 0:
        raise KnobfleetError(f"--to {args.to}: generation numbers start at 0")
    target = "the previous good generation" if args.to is None else f"generation {args.to:04d}"
    common.confirm("rollback", f"Roll {len(hosts)} host(s) back to {target}?", len(hosts), args)
    try:
        with interrupts.handled(), Progress(enabled=not args.json) as progress:
            outcomes = rollback(
                hosts, fleet.door(inventory, args.via), args.to, break_lock=args.break_lock, on_event=progress
            )
    except interrupts.Interrupted as exc:  # what each host runs now, then the one line and exit 130
        if exc.report is not None:
            _out(report_text.to_json({"hosts": [o.as_json() for o in exc.report]}) if args.json
                 else report_rollout.rollback_report(exc.report))  # fmt: skip
        raise
    if args.json:
        _out(report_text.to_json({"hosts": [o.as_json() for o in outcomes]}))
    else:
        _out(report_rollout.rollback_report(outcomes))
    return interrupts.late(EXIT_OK if all(o.ok for o in outcomes) else EXIT_ERROR)


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("history", help="generations and ledger of each host")
    inventory_opts(p)
    via_opt(p, "the probe")
    p.add_argument(
        "--ledger", type=argtypes.NON_NEGATIVE, default=0, metavar="N", help="also show the last N ledger entries"
    )
    p.add_argument(
        "--canaries", action="store_true", help="the canaries judged from this controller (their kept records)"
    )
    p.add_argument(
        "--report", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="also write every measured restart as one self-contained HTML page: a bar each from stop to "
        "API-ready, split into the engine's phases, and the median per host",
    )  # fmt: skip
    common.json_opt(p)
    p.set_defaults(func=cmd_history)
    p = sub.add_parser("rollback", help="switch hosts back to the previous good generation (or --to N)")
    inventory_opts(p)
    via_opt(p, "the verify after the restore (local: the playbook runs with ansible_connection=local)")
    p.add_argument(
        "--to",
        type=argtypes.NON_NEGATIVE,
        default=None,
        metavar="N",
        help="generation number (0 = pre-knobfleet files)",
    )
    p.add_argument("--break-lock", action="store_true", help="break a lock left by a killed applier")
    common.yes_opt(p)
    common.json_opt(p)
    p.set_defaults(func=cmd_rollback)
