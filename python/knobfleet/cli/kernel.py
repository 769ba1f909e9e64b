"""``kernel bench`` (the split-K decode attention microbenchmark on a host's GPU, through roles/knob_kernel)
and ``waves calibrate`` (fit the wave planner's GPU terms from such a sweep)."""

from __future__ import annotations

import argparse

from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK


def cmd_kernel_bench(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.kernel import commands
    from knobfleet.progress import Progress

    inventory = common.inventory(args)
    with Progress(enabled=not args.json) as progress:
        summary = commands.kernel_bench(
            inventory,
            args.host,
            commands.grid_from_args(args),
            args.budget,
            args.out,
            python=args.python,
            on_event=progress,
        )
    _out(report.to_json(summary) if args.json else commands.render_bench(summary))
    return EXIT_OK


def cmd_waves_calibrate(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.kernel import commands

    res = commands.calibrate(args.sweeps, args.gpu, args.holdout, write=not args.dry_run, store_path=args.store)
    _out(report.to_json(res) if args.json else commands.render_calibrate(res))
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    from knobfleet.kernel import commands

    kernel = sub.add_parser("kernel", help="the attention kernel itself on a host's GPU")
    ksub = kernel.add_subparsers(dest="kernel_command", metavar="SUBCOMMAND", required=True)
    p = ksub.add_parser("bench", help="sweep the split-K decode attention kernel on one host's GPU (skips without one)")
    inventory_opts(p, limit=False)
    commands.add_bench_arguments(p)
    p.set_defaults(func=cmd_kernel_bench)
    # `knobfleet waves calibrate …` (cli.run routes it here: `waves PROFILE` takes a positional argument).
    p = sub.add_parser(
        "waves-calibrate", help="run as `knobfleet waves calibrate SWEEP…`: fit the planner's GPU terms from sweeps"
    )
    commands.add_calibrate_arguments(p)
    p.set_defaults(func=cmd_waves_calibrate)
