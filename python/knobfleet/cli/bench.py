"""``bench`` and ``ab``: measure profiles on a host with the bench client."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts
from knobfleet.cli.parse import weights_option
from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, KnobfleetError, UsageError


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _one_host(args: argparse.Namespace, what: str):  # type: ignore[no-untyped-def]
    from knobfleet.ops import fleet

    inventory = common.inventory(args)
    hosts = fleet.hosts(inventory, args.limit)
    if len(hosts) != 1:
        names = ", ".join(h.host for h in hosts[:5])
        raise KnobfleetError(
            f"{what}: --limit must select exactly one host (selected {len(hosts)}: {names}…); e.g. --limit lab1"
        )
    return hosts[0], inventory


def _spec(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from knobfleet.cli.parse import parse_int_list
    from knobfleet.experiment.bench.run import BenchSpec

    return BenchSpec(
        conc=tuple(parse_int_list(args.conc, "--conc")),
        n_mult=args.n_mult,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        tool=args.tool,
        input_len=args.input_len,
        warmup_max=args.warmup_max,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.experiment import ab
    from knobfleet.ops import profiles as app
    from knobfleet.progress import Progress, Rounds

    hv, inventory = _one_host(args, "bench")
    profile = app.store().resolve(args.profile) if args.profile else None
    if args.repeats < 1:
        raise KnobfleetError(f"--repeats {args.repeats}: must be >= 1")
    if args.consistency:
        if args.tool != "builtin":
            raise UsageError("--consistency runs knobfleet's own check; drop --tool engine")
        with Progress(enabled=not args.json) as progress:
            if profile is not None:
                ab.activate(profile, hv, inventory, progress)
            result = ab.consistency(hv, inventory, _spec(args), progress)
        if args.json:
            _out(report_text.to_json(result))
        else:
            _out(
                f"consistency on {hv.host} ({profile.ref if profile else 'current profile'}): "
                f"{'PASS' if result['passed'] else 'FAIL'} — {result['compared']} outputs at concurrency "
                f"{result['concurrency']} compared with serial, {result['diverged']} diverged, "
                f"{result['loops']} loops, {result['errors']} errors, finish reasons {result['finish_reasons']}"
            )
            for d in result["divergences"][:5]:
                _out(
                    f"  prompt {d['prompt']}: first divergent token {d['first_divergent_token']}"
                    + (f", loops with period {d['loop_period']}" if d["loop_period"] else "")
                )
        return EXIT_OK if result["passed"] else EXIT_ERROR
    with Progress(enabled=not args.json) as progress:
        status = None
        if args.repeats > 1:
            what = f"bench {hv.host} {profile.name if profile else 'current profile'}"
            status = Rounds(what, args.repeats, "run", at_most=False, table=progress)
        doc = ab.bench(profile, hv, inventory, _spec(args), args.repeats, on_event=progress, status=status)
        if status is not None:
            status.close()
    from knobfleet.experiment.running import stamp

    doc = stamp(doc, [hv], inventory)  # the profile and generation the host ran, the engine's version
    if args.report is not None:
        from knobfleet.cli.report import write_html

        hashes = {profile.ref: profile.content_hash} if profile is not None else {}
        write_html({"kind": "bench", **doc, "profile_hashes": hashes}, args.report, "bench")
    if args.json:
        _out(report_text.to_json(doc))
    else:
        for i, lines in enumerate(doc["runs"], start=1):
            _out(f"run {i}:")
            for line in lines:
                _out("  " + line)
        rows = [
            [
                b["concurrency"],
                f"{b['mean']:.1f}",
                "-" if b["low"] is None else f"{b['low']:.1f} … {b['high']:.1f}",
                len(b["runs"]),
            ]
            for b in doc["buckets"]
        ]
        _out(report_text.table(["concurrency", "agg tok/s (mean)", "95% interval", "runs"], rows, "rrrr"))
        _out(f"{doc['host']}: {doc['profile'] or 'current profile'}; request errors: {doc['errors']}")
        if doc["tool"] != "knobfleet":
            _out(f"measured with {doc['tool']} against engine version {doc['engine_version'] or 'unknown'}")
            for key, value in _settings_shown(doc["settings"]):
                _out(f"  {key} = {value}")
        note = ab.time_scale_note(doc["time_scale"])
        if note:
            _out(note)
    return EXIT_OK if doc["errors"] == 0 else EXIT_ERROR


SHOWN_SETTINGS = (
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "enforce_eager",
    "dtype",
    "tensor_parallel_size",
    "tp_size",
    "max_running_requests",
    "chunked_prefill_size",
)


def _settings_shown(settings: object) -> list[tuple[str, object]]:
    """A few resolved settings worth a line under the results (the whole document is in --json)."""
    found: dict[str, object] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in SHOWN_SETTINGS and not isinstance(v, (dict, list)) and k not in found:
                    found[k] = v
                else:
                    walk(v)

    walk(settings)
    return [(k, found[k]) for k in SHOWN_SETTINGS if k in found]


def _err(text: str) -> None:
    import sys

    sys.stderr.write(text + "\n")


def _say_ab_cost(args: argparse.Namespace, hv: Any, inventory: Any, profile: str) -> None:
    from knobfleet.ops import fleet
    from knobfleet.ops.apply_cost import host_restarts
    from knobfleet.ops.restart_cost import experiment_lines

    why = f"at most {args.max_rounds} rounds of AB/BA, 2 applies a round, +1 to leave the winner applied"
    restarts = host_restarts([hv], fleet.door(inventory), profile)
    _err("\n".join(experiment_lines(f"ab on {hv.host}", restarts, 2 * args.max_rounds + 1, why)))


def cmd_ab(args: argparse.Namespace) -> int:
    from knobfleet import paths, report_text
    from knobfleet.cli.parse import parse_weights
    from knobfleet.experiment import ab
    from knobfleet.experiment.design import Settings
    from knobfleet.ops import profiles as app
    from knobfleet.progress import Progress, Rounds

    hv, inventory = _one_host(args, "ab")
    st = app.store()
    a, b = st.resolve(args.a), st.resolve(args.b)
    if common.will_ask(args):  # what the design costs in restarts, before the question (a refusal stays one line)
        _say_ab_cost(args, hv, inventory, b.name)
    common.confirm("ab", f"Run an A/B experiment on {hv.host} (switches its profile back and forth)?", 1, args)
    weights = parse_weights(args.weights)
    spec = _spec(args)
    missing = sorted(set(spec.conc) - set(weights))
    if missing:
        raise KnobfleetError(
            f"--weights {args.weights!r}: no weight for concurrency {missing}; give every --conc "
            "bucket a weight (0 to ignore it)"
        )
    if not 0 <= args.futility < 1:
        raise UsageError(f"--futility {args.futility}: must be in [0, 1) (0 turns the futility stop off)")
    settings = Settings(
        weights=weights,
        min_effect=args.min_effect,
        max_regression=args.max_regression,
        max_rounds=args.max_rounds,
        min_rounds=min(3, args.max_rounds),
        futility=args.futility,
    )
    html_out, report_dir = _ab_report_paths(args.report, f"{a.name}-vs-{b.name}")
    with Progress(enabled=not args.json) as progress:
        status = Rounds(f"ab {a.name} vs {b.name} on {hv.host}", settings.max_rounds, table=progress)
        doc = ab.ab(
            a,
            b,
            hv,
            inventory,
            settings,
            spec,
            report_dir,
            check_consistency=not args.no_consistency,
            on_event=progress,
            status=status,
        )
        status.close()
    doc = _what_ran(doc, hv, inventory, report_dir)
    _ab_pages(doc, {a.ref: a.content_hash, b.ref: b.content_hash}, html_out, report_dir)
    plotted = (report_dir / "report.png").is_file()
    if args.json:
        _out(report_text.to_json(doc))
    else:
        verdict = {"promote": f"promote {b.name}", "keep": f"keep {a.name}", "inconclusive": "inconclusive"}
        _out(f"verdict: {verdict[doc['verdict']]} — {doc['reason']}")
        rows = [
            [
                x["concurrency"],
                f"{x['a_mean']:.1f}",
                f"{x['b_mean']:.1f}",
                f"{x['ratio'] * 100:+.1f}%",
                f"{x['low'] * 100:+.1f}% … {x['high'] * 100:+.1f}%",
                x["class"],
            ]
            for x in doc["buckets"]
        ]
        _out(report_text.table(["conc", "A tok/s", "B tok/s", "B/A", "interval", "class"], rows, "rrrrrl"))
        _out(
            f"consistency: A {doc['consistency']['A']}, B {doc['consistency']['B']}; live now: {doc['winner']}; "
            f"reports in {paths.display(report_dir)}/report.{{json,md{',png' if plotted else ''}}}"
        )
        if not plotted:
            _out("report.png not written: plots need the optional extra (pip install 'knobfleet[plots]')")
        note = ab.time_scale_note(doc.get("time_scale"))
        if note:
            _out(note)
    # The verdict is the exit status: decided (promote or keep) 0, inconclusive 2.
    return EXIT_OK if doc["verdict"] in ("promote", "keep") else EXIT_DRIFT


def _ab_report_paths(report: Path | None, name: str) -> tuple[Path | None, Path]:
    """``ab --report``: (the HTML page asked for, or None; the folder of report.{json,md,png,html}). A FILE.html
    puts the folder in the default place, under the state folder."""
    from knobfleet import paths

    html_out = Path(report) if report and str(report).lower().endswith((".html", ".htm")) else None
    if report and html_out is None:
        return None, Path(report)
    return html_out, paths.state_dir() / "experiments" / f"{time.strftime('%Y%m%dT%H%M%S')}-{name}"


def _ab_pages(doc: dict[str, Any], hashes: dict[str, str], html_out: Path | None, report_dir: Path) -> None:
    """The A/B page with the content hashes of the two profiles that ran: at ``--report FILE.html``, and again over
    the folder's report.html that the experiment wrote (its report.json stays as the experiment wrote it)."""
    from knobfleet.cli.report import write_html

    page = {**doc, "profile_hashes": hashes}
    if html_out is not None:
        write_html(page, html_out, "ab")
    if (report_dir / "report.html").is_file():
        write_html(page, report_dir / "report.html", "ab")


def _bench_opts(p: argparse.ArgumentParser) -> None:
    inventory_opts(p, limit=False)
    p.add_argument("--limit", "-l", default=None, help="exactly one host")
    p.add_argument(
        "--conc",
        type=argtypes.checked(argtypes.int_list),
        default="48,64,80,96",
        help="concurrency buckets, comma-separated (48,64,80,96)",
    )
    p.add_argument("--n-mult", type=argtypes.POSITIVE, default=4, help="requests per bucket = N x concurrency (4)")
    p.add_argument(
        "--warmup-max",
        type=argtypes.NON_NEGATIVE,
        default=128,
        metavar="N",
        help="after C warm-up requests per bucket, warm up on until the engine's median ITL and TTFT stop improving "
        "by more than 3%% a chunk, at most N requests (128; 0: C only). What was set aside is in the record",
    )
    p.add_argument("--max-tokens", type=argtypes.POSITIVE, default=256, help="tokens generated per request (256)")
    p.add_argument("--timeout", type=argtypes.POSITIVE, default=1800, help="bound per bench run, seconds")
    p.add_argument(
        "--tool",
        choices=("builtin", "engine"),
        default="builtin",
        help="builtin: knobfleet's client (default); engine: the engine's own benchmark (vllm bench serve, "
        "sglang.bench_serving), from the catalog's serve.bench",
    )
    p.add_argument(
        "--input-len", type=argtypes.POSITIVE, default=128, help="prompt tokens per request with --tool engine (128)"
    )
    common.json_opt(p)


def _what_ran(doc: dict[str, Any], hv: Any, inventory: Path, report_dir: Path) -> dict[str, Any]:
    """The A/B's document with the winner's generation and the engine's version read from the host
    (``experiment.running``), in its report.json too, which ``report`` re-renders later."""
    import json

    from knobfleet.experiment.running import stamp
    from knobfleet.ops.drift import write_atomic

    doc = stamp(doc, [hv], inventory)
    if (report_dir / "report.json").is_file():
        write_atomic(report_dir / "report.json", json.dumps(doc, indent=2))
    return doc


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="throughput sweep on one host (current profile, or apply PROFILE first)")
    p.add_argument("profile", nargs="?", help="apply this profile first (default: measure what runs)")
    _bench_opts(p)
    p.add_argument(
        "--repeats", type=argtypes.POSITIVE, default=1, help="runs per bucket; 2+ gives a 95%% Student-t interval"
    )
    p.add_argument(
        "--consistency", action="store_true", help="run the output-consistency check instead (exit 1 on fail)"
    )
    p.add_argument(
        "--report", type=argtypes.html_file, default=None, metavar="FILE.html",
        help="also write the sweep as one self-contained HTML page (checked before anything runs)",
    )  # fmt: skip
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser(
        "ab",
        help="interleaved A/B experiment with a statistical verdict (exit 0 decided, 2 inconclusive)",
    )
    p.add_argument("a", help="profile A (the incumbent)")
    p.add_argument("b", help="profile B (the candidate)")
    _bench_opts(p)
    p.add_argument(
        "--weights",
        type=weights_option,
        default="48=0.3,64=0.3,80=0.3,96=0.1",
        help="traffic share per concurrency bucket (C=W,…)",
    )
    p.add_argument("--max-rounds", type=argtypes.POSITIVE, default=15, help="stop after N AB/BA rounds at most (15)")
    p.add_argument(
        "--min-effect", type=argtypes.FRACTION, default=0.01, help="smallest gain worth promoting (0.01 = 1%%)"
    )
    p.add_argument(
        "--max-regression", type=argtypes.FRACTION, default=0.03, help="guardrail: no bucket may lose more (0.03 = 3%%)"
    )
    p.add_argument("--futility", type=argtypes.FRACTION, default=0.05,
                   help="keep A once B's chance of being promoted by --max-rounds is below this (0.05; 0 = never "
                   "stop early)")  # fmt: skip
    p.add_argument(
        "--report", type=argtypes.report_target, default=None, metavar="DIR|FILE.html",
        help="where report.{json,md,png,html} go; FILE.html: the HTML page there, the rest in the default folder",
    )  # fmt: skip
    p.add_argument("--no-consistency", action="store_true", help="skip the output-consistency check")
    common.yes_opt(p)
    p.set_defaults(func=cmd_ab)
