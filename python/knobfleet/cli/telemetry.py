"""``load-profile`` (A/B weights measured from the live load in Prometheus) and ``canary`` (a profile judged on
live traffic through the router, then promoted or rolled back)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, via_opt, yes_opt
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, UsageError

DEFAULT_PROMETHEUS = "http://127.0.0.1:19090"  # the default lab's (`lab up --monitoring`); other labs move it


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
    from knobfleet import report_text
    from knobfleet.ops.telemetry import load_profile
    from knobfleet.telemetry.prom import Prometheus

    if args.step >= args.window:
        raise UsageError(f"--step {args.step:g}s: must be shorter than --window ({args.window:g}s)")
    host_regex = args.limit or ".+"
    result = load_profile(Prometheus(_prometheus(args)), args.buckets, args.window, args.step, host_regex)
    p = result.profile
    if args.json:
        _out(
            report_text.to_json(
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
        report_text.table(
            ["bucket", "weight", ""],
            [[b, f"{w:.3f}", "#" * round(w * 40)] for b, w in p.weights.items()],
            align="rrl",
        )
    )
    _out(f"--weights {p.weights_arg()}")
    return EXIT_OK


def progress_line(name: str, k: int, max_windows: int, verdict: object, window_s: float) -> str:
    """A canary's line after window ``k``: where it is, the running estimate per metric with its interval
    (positive: the canary better), what the judge says and does next, and when the last possible window ends."""
    import math

    running = " · ".join(
        f"{m} {math.expm1(iv.estimate):+.1%} ({math.expm1(iv.low):+.1%} to {math.expm1(iv.high):+.1%})"
        for m, iv in sorted((getattr(verdict, "intervals", None) or {}).items())
    )
    return (f"canary {name}: window {k} of at most {max_windows} · {running or 'no estimate yet'} · "
            f"{getattr(verdict, 'reason', '')} · next: {getattr(verdict, 'verdict', '')} · last possible window in "
            f"~{(max_windows - k) * window_s:.0f}s")  # fmt: skip


def _canary_settings(args: argparse.Namespace) -> Any:
    """The judge's settings from the command line; settings that cannot work are refused in one line."""
    from knobfleet.experiment.canary import Settings

    settings = Settings(
        max_regression=args.max_regression,
        max_windows=args.max_windows,
        min_windows=args.min_windows,
        pre_windows=args.pre_windows,
        window_s=args.window,
        design=args.design,
        swap_after=args.swap_after,
        probes=args.probes,
        hang_s=args.hang,
        warmup_windows=args.warmup_windows,
        warmup_tol=args.warmup_tol,
    )
    bad = settings.check()
    if bad is not None:
        raise UsageError(f"canary: {bad}")
    return settings


def _say_canary_cost(design: str, door: Any, profile: str, canaries: list[Any], baseline: list[Any]) -> None:
    import sys

    from knobfleet.ops.apply_cost import host_restarts
    from knobfleet.ops.restart_cost import canary_lines

    measured = host_restarts([*canaries, *baseline], door, profile)
    side = {name: {h.host: measured[h.host] for h in hosts} for name, hosts in (("c", canaries), ("b", baseline))}
    sys.stderr.write("\n".join(canary_lines(design, side["c"], side["b"])) + "\n")


def cmd_canary(args: argparse.Namespace) -> int:
    import sys
    import time

    from knobfleet import report_prom, report_text
    from knobfleet.experiment import canary_probe, records
    from knobfleet.experiment.canary_hosts import split
    from knobfleet.experiment.canary_run import CanaryOptions, RecordKeeper, canary
    from knobfleet.ops import fleet, interrupts
    from knobfleet.ops import profiles as app
    from knobfleet.telemetry.prom import Prometheus

    inventory = common.inventory(args)
    door = fleet.door(inventory, args.via)
    profile = app.store().resolve(args.profile)
    hosts = fleet.hosts(inventory, args.limit)
    settings = _canary_settings(args)
    opts = CanaryOptions(
        hosts=args.hosts, fraction=args.fraction, window_s=args.window, settings=settings, advisory=args.advisory,
        prober=canary_probe.start,
    )  # fmt: skip
    prom = Prometheus(_prometheus(args))  # a URL that is not http(s): one line, before the question
    canaries, baseline, _rest = split(hosts, opts)  # bad sizes and unrouted hosts: one line, before the question
    then = "report what it would do and leave them there" if args.advisory else "promote or roll back"
    swap = (f", then swap them after {settings.swap_after} window(s) (the baseline takes {profile.ref}, the canaries "
            "go back)" if settings.crossover else "")  # fmt: skip
    if common.will_ask(args):  # what the design costs in restarts (and the other design), before the question
        _say_canary_cost(args.design, door, profile.name, canaries, baseline)
    common.confirm(
        "canary",
        f"Measure {settings.pre_windows} pre-period window(s), then apply {profile.ref} to {len(canaries)} canary "
        f"host(s), restart {len(baseline)} baseline host(s){swap}, judge, and {then}?",
        len(canaries) + len(baseline),
        args,
    )
    keep = RecordKeeper()

    def textfile(verdict: str, windows: int, intervals: Any) -> None:
        if args.prom is not None:
            from knobfleet import safefile

            text = report_prom.canary_prometheus(
                profile.name, verdict, windows, intervals, time.time(), [h.host for h in canaries],
                [h.host for h in baseline],
            )  # fmt: skip
            safefile.write_text(args.prom, text)

    def progress(k: int, verdict: Any, row: dict[str, Any]) -> None:
        textfile(verdict.verdict, verdict.windows, row.get("interval") or {})
        if args.json:
            return
        sys.stderr.write(progress_line(profile.name, k, settings.max_windows, verdict, args.window) + "\n")

    try:
        with interrupts.handled():
            result = canary(profile, hosts, door, prom, opts, on_window=progress, keep=keep)
        doc = result.as_json()
        textfile(doc["verdict"], doc["windows_counted"], doc["intervals"])
    finally:  # the page of what was measured, also when the canary ended early (interrupted, refused)
        if args.report is not None and keep.path is not None:
            from knobfleet.cli.report import write_html

            write_html(records.read(keep.path), args.report, "canary")
            if not args.json:
                _out(f"report: {args.report}")
    if args.json:
        _out(report_text.to_json(result.as_json()))
    else:
        _out(f"canary {profile.ref}: {', '.join(result.canaries)} against {', '.join(result.baseline)}")
        for note in result.notes:
            _out(f"note: {note}")
        _out(f"verdict: {result.verdict.verdict} — {result.verdict.reason}")
        if result.followup:
            _out(result.followup)
        if result.record:
            from knobfleet.paths import display

            _out(f"record: {display(Path(result.record))}")
    return result.exit_code


PRE_WINDOWS = 3  # experiment.canary.Settings.pre_windows (a unit test holds them equal; no stats import at parse)
PROBES, MAX_PROBES, HANG_S = 8, 32, 20.0  # Settings.probes, canary.MAX_PROBES, Settings.hang_s (held equal too)


def _prometheus(args: argparse.Namespace) -> str:
    """--prometheus, else $KNOBFLEET_PROMETHEUS, else the running lab's (its port moves with the lab's slot)."""
    if args.prometheus:
        return str(args.prometheus)
    from knobfleet.tune.stages import default_prometheus

    return default_prometheus()


def _prometheus_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prometheus",
        default=None,
        metavar="URL",
        help=f"Prometheus to read (default: $KNOBFLEET_PROMETHEUS, else the running lab's: {DEFAULT_PROMETHEUS} for "
        "the default lab)",
    )


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "load-profile",
        help="A/B weights per concurrency bucket from the live load (running requests in Prometheus)",
    )
    _prometheus_opt(p)
    p.add_argument("--window", type=duration, default=600.0, help="how far back to look (default 10m)")
    p.add_argument("--step", type=duration, default=5.0, help="sample spacing (default 5s)")
    p.add_argument(
        "--buckets", type=buckets, default=[48, 64, 80, 96], help="concurrency buckets (default 48,64,80,96)"
    )
    p.add_argument("--limit", "-l", default=None, metavar="REGEX", help="only engines whose host label matches")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_load_profile)
    _register_canary(sub)


def _register_canary(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "canary", help="apply a profile to a canary subset, judge it on live traffic, promote or roll back"
    )
    p.add_argument("profile", help="profile name")
    inventory_opts(p)
    via_opt(p, "the applies and restarts")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--hosts", type=argtypes.POSITIVE, default=None, metavar="N", help="canary hosts (and as many baseline)"
    )
    size.add_argument("--fraction", type=argtypes.FRACTION, default=None, help="share of the hosts as canaries (0.25)")
    p.add_argument("--window", type=duration, default=60.0, help="length of one judged window (default 60s)")
    p.add_argument("--max-windows", type=argtypes.POSITIVE, default=16, help="windows at most before inconclusive (16)")
    p.add_argument(
        "--min-windows", type=argtypes.POSITIVE, default=3, help="windows before any verdict but rollback (3)"
    )
    p.add_argument(
        "--pre-windows",
        type=argtypes.POSITIVE,
        default=PRE_WINDOWS,
        help=f"windows measured before the change, both sides on the current profile ({PRE_WINDOWS}): the "
        "traffic check, and what the first period's looks for a rollback are judged against",
    )
    p.add_argument(
        "--design",
        choices=("crossover", "did"),
        default="crossover",
        help="crossover (default): the subsets swap roles after --swap-after windows, so each host's own speed "
        "cancels; did: the change against the pre-period only",
    )
    p.add_argument(
        "--swap-after",
        type=argtypes.POSITIVE,
        default=6,
        metavar="N",
        help="crossover: judged windows before the subsets swap roles (6); the rest of --max-windows follow it",
    )
    p.add_argument(
        "--advisory",
        action="store_true",
        help="judge and report the decision without acting on it: the canaries stay on the profile",
    )
    p.add_argument(
        "--probes", type=argtypes.integer(0, MAX_PROBES), default=PROBES, metavar="N",
        help=f"streamed probe requests per host and window, sent straight to each engine to catch hung streams "
        f"({PROBES}; 0: none): a canary side with significantly more hung streams than the baseline rolls back",
    )  # fmt: skip
    p.add_argument(
        "--hang", type=duration, default=HANG_S, metavar="DURATION",
        help=f"a probe stream with no token (the first included) for this long counts hung and is closed "
        f"({HANG_S:g}s; at most 10m)",
    )  # fmt: skip
    p.add_argument(
        "--warmup-windows", type=argtypes.integer(0, 8), default=2, metavar="N",
        help="after each restart, a window counts only once the next agrees with it (every host's throughput and "
        "ITL within --warmup-tol): at most N windows set aside per period, then judged anyway (2; 0: judge from "
        "the first window)",
    )  # fmt: skip
    p.add_argument("--warmup-tol", type=argtypes.FRACTION, default=0.05, metavar="FRACTION",
                   help="how far a host's figures may move from one window to the next for both to count as warm "
                   "(0.05)")  # fmt: skip
    p.add_argument("--max-regression", type=argtypes.FRACTION, default=0.05,
                   help="the regression a canary must catch: promotion needs every metric shown better than minus "
                   "this (0.05)")  # fmt: skip
    _prometheus_opt(p)
    p.add_argument(
        "--report", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="also write the canary as one self-contained HTML page (checked before anything changes)",
    )  # fmt: skip
    p.add_argument(
        "--prom", type=argtypes.output_file, default=None, metavar="FILE",
        help="also write the running estimate, interval and verdict as a Prometheus textfile, after every window",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    yes_opt(p)
    p.set_defaults(func=cmd_canary)
