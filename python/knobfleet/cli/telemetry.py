"""``load-profile``: A/B weights measured from the live load in Prometheus."""

from __future__ import annotations

import argparse
import os
import re

from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, UsageError

DEFAULT_PROMETHEUS = "http://127.0.0.1:19090"  # the lab's (`lab up --monitoring`)


def duration(text: str) -> float:
    """``90s``, ``10m``, ``2h`` or plain seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive duration like 90s, 10m or 2h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def buckets(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected concurrencies like 48,64,80,96")
    return values


def cmd_load_profile(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.ops.telemetry import load_profile
    from knobfleet.telemetry.prom import Prometheus

    if args.step >= args.window:
        raise UsageError(f"--step {args.step:g}s: must be shorter than --window ({args.window:g}s)")
    host_regex = args.limit or ".+"
    result = load_profile(Prometheus(args.prometheus), args.buckets, args.window, args.step, host_regex)
    p = result.profile
    if args.json:
        _out(
            report.to_json(
                {
                    "prometheus": result.url,
                    "window_s": result.window_s,
                    "step_s": result.step_s,
                    "engines": result.engines,
                    "weights": {str(b): w for b, w in p.weights.items()},
                    "weights_arg": p.weights_arg(),
                    "samples": {
                        "total": p.samples,
                        "in_range": p.in_range,
                        "idle": p.idle,
                        "below": p.below,
                        "above": p.above,
                    },
                    "mean_running": p.mean_running,
                }
            )
        )
        return EXIT_OK
    _out(
        f"load profile: {len(result.engines)} engine(s) over {result.window_s:g}s from {result.url} "
        f"({p.samples} samples every {result.step_s:g}s; {p.idle} idle, {p.below} below, {p.above} above the "
        f"buckets; mean {p.mean_running:.1f} running)"
    )
    _out(
        report.table(
            ["bucket", "weight", ""],
            [[b, f"{w:.3f}", "#" * round(w * 40)] for b, w in p.weights.items()],
            align="rrl",
        )
    )
    _out(f"--weights {p.weights_arg()}")
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load-profile",
        help="A/B weights per concurrency bucket from the live load (running requests in Prometheus)",
    )
    p.add_argument(
        "--prometheus",
        default=os.environ.get("KNOBFLEET_PROMETHEUS") or DEFAULT_PROMETHEUS,
        metavar="URL",
        help=f"Prometheus to read (default: $KNOBFLEET_PROMETHEUS, else the lab's {DEFAULT_PROMETHEUS})",
    )
    p.add_argument("--window", type=duration, default=600.0, help="how far back to look (default 10m)")
    p.add_argument("--step", type=duration, default=5.0, help="sample spacing (default 5s)")
    p.add_argument(
        "--buckets", type=buckets, default=[48, 64, 80, 96], help="concurrency buckets (default 48,64,80,96)"
    )
    p.add_argument("--limit", "-l", default=None, metavar="REGEX", help="only engines whose host label matches")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_load_profile)
