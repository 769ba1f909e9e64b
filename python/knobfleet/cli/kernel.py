"""``kernel bench`` (the split-K decode attention microbenchmark on a host's GPU, through roles/knob_kernel)
and ``waves calibrate`` (fit the wave planner's GPU terms from such a sweep)."""

from __future__ import annotations

import argparse
from typing import Any

from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, KnobfleetError


def cmd_kernel_bench(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.kernel import commands
    from knobfleet.progress import Progress

    inventory = common.inventory(args)
    _known_host(inventory, args.host)
    _plain("kernel bench", "--python", args.python)
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
    # names in it come from the host or the sweep file: escaped as every terminal line is
    _out(report_text.to_json(summary) if args.json else report_text.visible(commands.render_bench(summary)))
    return EXIT_OK


def _known_host(inventory: Any, host: str) -> None:
    """--host names one host of the inventory: anything else (a pattern, a name Ansible does not know) is one line
    here, not ansible-playbook's error after it started."""
    from knobfleet import paths
    from knobfleet.ops import fleet
    from knobfleet.rules import shown

    names = [h.host for h in fleet.hosts(inventory, None)]
    if host not in names:
        raise KnobfleetError(
            f"kernel bench: --host {shown(host)[:200]} is not a host of {paths.display(inventory)} "
            f"({', '.join(names[:5])}{', …' if len(names) > 5 else ''}); name one"
        )


def _plain(command: str, option: str, value: str | None) -> None:
    """A name this command prints and keeps (the run's knob_vars.yml, the calibrations file): nothing a terminal would
    not show, nothing shaped like a secret; refused in one line before anything runs."""
    from knobfleet.errors import UsageError
    from knobfleet.module_utils.knob_redact import secret_shape
    from knobfleet.rules import describe_char, first_invisible, shown

    if value is None:
        return
    hit = first_invisible(value)
    if hit is not None:
        raise UsageError(f"{command}: {option} {shown(value)[:200]} contains {describe_char(hit[1])} (invisible)")
    shape = secret_shape(value)
    if shape:
        raise UsageError(f"{command}: {option}: the value looks like a secret ({shape}); give a name")


def cmd_waves_calibrate(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.kernel import commands

    _plain("waves calibrate", "--gpu", args.gpu)
    try:
        res = commands.calibrate(args.sweeps, args.gpu, args.holdout, write=not args.dry_run, store_path=args.store)
    except ValueError as exc:  # the fit's own refusal of too few launches, raised past calibrate's load checks
        raise KnobfleetError(f"waves calibrate: {exc}") from None
    _out(report_text.to_json(res) if args.json else report_text.visible(commands.render_calibrate(res)))
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
