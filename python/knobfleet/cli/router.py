"""``router status`` and ``router readd``: the routed hosts as their routers list them, and putting back the
workers an interrupted rollout left out (what drift's ``out_of_router`` finding and the shipped
``KnobfleetWorkerOutOfRouter`` alert point to)."""

from __future__ import annotations

import argparse

from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, json_opt, yes_opt
from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE


def _one_line(text: str) -> str:
    """A host name, URL or router message for the terminal: every invisible character escaped (``report_text.visible``),
    and newlines and tabs too, so a router's text can neither rewrite the screen nor pass for another line."""
    from knobfleet import report_text

    return report_text.visible(text).replace("\n", "\\n").replace("\t", "\\t")


def cmd_status(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.ops import fleet
    from knobfleet.ops.routing import worker_states

    states = worker_states(fleet.hosts(common.inventory(args), args.limit))
    if args.json:
        common.out(report_text.to_json({"workers": [s.as_json() for s in states]}))
    elif not states:
        common.out("no host of this inventory names a router (knob_router_url)")
    else:
        rows = [[_one_line(c) for c in (s.host, s.worker, s.router, s.error or ("healthy" if s.healthy else
                 "listed, not healthy" if s.listed else "OUT: not listed"))] for s in states]  # fmt: skip
        common.out(report_text.table(["host", "worker", "router", "state"], rows))  # cells escaped first: columns align
    if any(s.error for s in states):
        return EXIT_UNREACHABLE
    return EXIT_DRIFT if any(not s.listed for s in states) else EXIT_OK


def cmd_readd(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.ops import fleet
    from knobfleet.ops.routing import readd

    hosts = fleet.hosts(common.inventory(args), args.limit)
    common.confirm("router readd", f"Put back the workers of {len(hosts)} host(s) their routers do not list?",
                   len(hosts), args)  # fmt: skip
    done = readd(hosts)
    if args.json:
        common.out(report_text.to_json({"readded": [{"host": h, "ok": ok, "message": m} for h, ok, m in done]}))
    elif not done:
        common.out("every routed host is listed by its router: nothing to put back")
    else:
        for h, ok, m in done:  # a host name or a router's message is the router's text: never raw to the terminal
            common.out(_one_line(f"{h}: {m}" if ok else f"error: {h}: {m}"))
    return EXIT_OK if all(ok for _, ok, _ in done) else EXIT_ERROR


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("router", help="routed hosts as their routers list them; put back workers left out")
    rs = p.add_subparsers(dest="router_command", metavar="{status,readd}", required=True)
    s = rs.add_parser("status", help="each routed host: listed and healthy in its router, or out (exit 0 / 2 / 4)")
    inventory_opts(s)
    json_opt(s)
    s.set_defaults(func=cmd_status)
    r = rs.add_parser("readd", help="put back the workers their routers do not list, each once its engine is ready")
    inventory_opts(r)
    json_opt(r)
    yes_opt(r)
    r.set_defaults(func=cmd_readd)
