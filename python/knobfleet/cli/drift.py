"""``verify`` and ``drift``: read-only checks of live state against what knobfleet applied."""

from __future__ import annotations

import argparse
from pathlib import Path

from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, via_opt
from knobfleet.cli.common import out as _out


def cmd_check(args: argparse.Namespace) -> int:
    from knobfleet import paths
    from knobfleet.ops import drift

    inventory = common.inventory(args)
    from knobfleet.fleet import probe

    probe.warm_up(inventory, args.limit, args.via)  # probes start now, while the rest of the command loads
    from knobfleet import report
    from knobfleet.live import verify
    from knobfleet.ops import workspace as app
    from knobfleet.progress import Progress

    hosts = app.hosts(inventory, args.limit)
    with Progress(enabled=not args.json) as progress:
        verdicts = drift.check(
            hosts,
            inventory,
            on_event=progress,
            save_probes=Path(args.save_probes) if args.save_probes else None,
            via=args.via,
        )
    summary = verify.summary(verdicts)
    code = verify.exit_code(verdicts)
    if getattr(args, "prom", None):
        drift.write_atomic(Path(args.prom), report.prometheus(verdicts))
    testinfra_rc = None
    if getattr(args, "testinfra", False):
        testinfra_rc = drift.run_testinfra(inventory, args.limit, quiet=args.json)
        if testinfra_rc != 0 and code == 0:
            code = 2
    if args.json:
        doc = {"hosts": [v.as_json() for v in verdicts], "summary": summary}
        if testinfra_rc is not None:
            doc["testinfra"] = {"exit_code": testinfra_rc, "passed": testinfra_rc == 0}
        _out(report.to_json(doc))
    else:
        _out(report.drift_report(verdicts, summary, f"{args.command}: {paths.display(inventory)}"))
        if testinfra_rc is not None:
            _out(f"testinfra: {'passed' if testinfra_rc == 0 else f'FAILED (exit {testinfra_rc})'}")
    return code


def _opts(p: argparse.ArgumentParser) -> None:
    inventory_opts(p)
    common.json_opt(p)
    p.add_argument("--save-probes", default=None, metavar="DIR", help="also save each host's raw probe JSON in DIR")
    via_opt(p, "the probe")


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help="check that live state matches what knobfleet applied (exit 0 / 2)")
    _opts(p)
    p.add_argument("--testinfra", action="store_true", help="also run tests/testinfra against the hosts")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("drift", help="find drift across the fleet (exit 0 / 2 / 4 / 6)")
    _opts(p)
    p.add_argument("--prom", default=None, metavar="FILE", help="also write a Prometheus textfile")
    p.set_defaults(func=cmd_check)
