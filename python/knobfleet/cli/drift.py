"""``verify`` and ``drift``: read-only checks of live state against what knobfleet applied.

Each host's result is printed as it answers (a row and its findings; ``--json-lines``: one JSON object per host,
then a summary object), at most ``--forks`` hosts probed at once; ``--json`` prints one document at the end, hosts
in inventory order. The read path imports neither pydantic nor ansible when its cached view of the inventory is
current (fleet/readhost.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, via_opt
from knobfleet.cli.common import out as _out

if TYPE_CHECKING:
    from knobfleet.fleet.hosts import Hosts


def cmd_check(args: argparse.Namespace) -> int:
    from knobfleet.errors import UsageError
    from knobfleet.ops import fleet

    watch = getattr(args, "watch", None)
    if getattr(args, "rounds", None) is not None and watch is None:
        raise UsageError(f"{args.command}: --rounds counts the rounds of --watch; add --watch SECONDS")
    if watch is not None and args.json:
        raise UsageError(f"{args.command} --watch prints each round as it comes: use --json-lines, not --json")
    if watch is not None and getattr(args, "testinfra", False):
        raise UsageError(f"{args.command} --watch: --testinfra runs once; run it without --watch")
    inventory = common.inventory(args)
    forks = fleet.fork_count(args.forks)
    door = fleet.door(inventory, args.via, forks, keep=watch is not None)
    if watch is None:
        door.warm_up(args.limit)  # probes start now, while the rest of the command loads
        return _check_once(args, inventory, door, forks)
    import time

    done = 0
    while True:
        started = time.monotonic()
        done += 1
        code = _check_once(args, inventory, door, forks, done)
        if args.rounds is not None and done >= args.rounds:
            return code
        time.sleep(max(0.0, watch - (time.monotonic() - started)))


def _check_once(
    args: argparse.Namespace, inventory: Path, door: Hosts, forks: int, watch_round: int | None = None
) -> int:
    """One round: probe, judge, print as hosts answer; the exit code. ``watch_round``: its number under --watch
    (the inventory is read again each round; each host's probe interpreter is kept between rounds)."""
    from knobfleet import paths, report, report_prom, report_text
    from knobfleet.live import verify
    from knobfleet.ops import drift, fleet
    from knobfleet.progress import StatusLine

    plan = fleet.read_plan(inventory, args.limit)
    names = [h.host for h in plan.hosts]
    order = {name: i for i, name in enumerate(names)}
    text = not args.json and not args.json_lines
    verdicts = []
    head = f"{args.command}: {paths.display(inventory)}"
    if watch_round is not None:
        import time

        head += f" · round {watch_round} at {time.strftime('%H:%M:%S')}"
    routers: dict[str, str] = {}  # routers that could not be read: URL -> why
    with StatusLine(enabled=text, what=args.command, total=len(names), forks=forks) as status:
        if text:
            status.write(("\n" if watch_round and watch_round > 1 else "") + report.drift_head(head, names))
        for v in drift.stream(
            plan,
            door,
            on_event=status.event,
            save_probes=Path(args.save_probes) if args.save_probes else None,
            liveness=args.command == "verify",
            routers=routers,
        ):
            verdicts.append(v)
            status.done(v.status)
            if args.json_lines:
                status.write(report_text.json_line(v.as_json()))
            elif text:
                status.write(report.drift_rows(v, names))
    verdicts.sort(key=lambda v: order[v.host])
    summary = verify.summary(verdicts)
    if routers:
        summary = {**summary, "routers_unreadable": routers}
        for url, why in sorted(routers.items()):
            common.err(f"warning: router {url} could not be read ({why}): whether its hosts are in it is unknown")
    if watch_round is not None:
        summary = {**summary, "round": watch_round}
    code = verify.exit_code(verdicts)
    if getattr(args, "prom", None):
        import time

        drift.write_atomic(Path(args.prom), report_prom.prometheus(verdicts, now=time.time()))
    testinfra_rc = None
    if getattr(args, "testinfra", False):
        testinfra_rc = drift.run_testinfra(inventory, args.limit, quiet=not text)
        if testinfra_rc != 0 and code == 0:
            code = 2
    testinfra = {"exit_code": testinfra_rc, "passed": testinfra_rc == 0} if testinfra_rc is not None else None
    doc: dict[str, Any] = {"hosts": [v.as_json() for v in verdicts], "summary": summary}
    if getattr(args, "report", None) is not None:
        from knobfleet.cli.report import write_fleet

        write_fleet(doc, args.report, f"{args.command}: {paths.display(inventory)}")
    if args.json:
        if testinfra is not None:
            doc["testinfra"] = testinfra
        _out(report_text.to_json(doc))
    elif args.json_lines:
        _out(report_text.json_line({"summary": summary, **({"testinfra": testinfra} if testinfra else {})}))
    else:
        _out(report.drift_tail(summary))
        if testinfra_rc is not None:
            _out(f"testinfra: {'passed' if testinfra_rc == 0 else f'FAILED (exit {testinfra_rc})'}")
    return code


def _opts(p: argparse.ArgumentParser) -> None:
    inventory_opts(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document and nothing else (at the end)")
    fmt.add_argument(
        "--json-lines",
        action="store_true",
        help="print one JSON object per host as it answers, then one with the summary (JSON Lines)",
    )
    p.add_argument(
        "--report", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="also write the fleet as one self-contained HTML page: each host's profile, generation and findings",
    )  # fmt: skip
    p.add_argument("--save-probes", type=argtypes.output_dir, default=None, metavar="DIR",
                   help="also save each host's raw probe JSON in DIR")  # fmt: skip
    p.add_argument(
        "--forks",
        type=argtypes.POSITIVE,
        default=os.environ.get("KNOBFLEET_FORKS") or None,
        metavar="N",
        help="probe at most N hosts at once (default: $KNOBFLEET_FORKS, else ansible.cfg's forks, else 32)",
    )
    via_opt(p, "the probe")
    p.add_argument(
        "--watch",
        type=argtypes.SECONDS,
        default=None,
        metavar="SECONDS",
        help="check again every SECONDS until Ctrl-C (or --rounds): each host's probe interpreter is kept between "
        "rounds, so a round costs a host one request, not an ssh session and a python start; --prom is rewritten "
        "each round",
    )
    p.add_argument(
        "--rounds", type=argtypes.POSITIVE, default=None, metavar="N", help="with --watch: stop after N rounds"
    )


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help="check that live state matches what knobfleet applied (exit 0 / 2)")
    _opts(p)
    p.add_argument("--testinfra", action="store_true", help="also run tests/testinfra against the hosts")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("drift", help="find drift across the fleet (exit 0 / 2 / 4 / 6)")
    _opts(p)
    p.add_argument(
        "--prom", type=argtypes.output_file, default=None, metavar="FILE", help="also write a Prometheus textfile"
    )
    p.set_defaults(func=cmd_check)
