"""``render`` and ``waves``: what a profile becomes on a host, and the wave planner."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from knobfleet import argtypes
from knobfleet.cli.common import Sub, inventory_opts
from knobfleet.cli.common import out as _out
from knobfleet.cli.parse import weights_option
from knobfleet.errors import EXIT_OK, KnobfleetError


def cmd_render(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.cli.common import inventory
    from knobfleet.ops import profiles as app

    if args.what == "vars":
        sys.stdout.write(app.render_vars(args.profile, inventory(args)))
        return EXIT_OK

    rendered = app.render(args.profile, inventory(args), args.host)
    if args.json:
        _out(report_text.to_json([app.rendered_json(r) for r in rendered]))
        return EXIT_OK
    for r in rendered:
        if len(rendered) > 1:
            _out(f"# ---- {r.host} ----")
        if args.what == "script":
            sys.stdout.write(r.script_shown)  # secret values as their hashes
        elif args.what == "unit":
            sys.stdout.write(r.unit_shown)
        elif args.what == "env":
            _out("\n".join(f"{k}={v}" for k, v in r.env_shown.items()))
        else:
            _out("\n".join(r.argv_shown))
    return EXIT_OK


def _waves_table(plan: Any) -> str:
    from knobfleet import report_knobs
    from knobfleet.kernel import advisor as app

    return report_knobs.waves_table(
        plan.rows, plan.sms, plan.heads, app.knob_dict(plan.knobs), plan.cliffs, plan.calibration_note
    )


def cmd_waves(args: argparse.Namespace) -> int:
    from knobfleet import report_knobs, report_text
    from knobfleet.cli.parse import parse_int_list, parse_weights
    from knobfleet.kernel import advisor as app

    if not args.profile and not args.knob:
        raise KnobfleetError(f"waves: name a PROFILE or give --knob NAME=VALUE (e.g. --knob {app.TARGET_KNOB}=512)")
    batches = parse_int_list(args.batch, "--batch")
    plan, profile = app.wave_plan(
        args.profile, args.knob, args.gpu, args.sms, args.heads, batches, args.context, not args.no_calibration
    )
    if args.suggest:
        weights = parse_weights(args.weights)
        picks = app.suggest_ctas(plan, profile, weights, args.top, write=profile is not None and not args.no_write)
        if args.json:
            _out(
                report_text.to_json(
                    {
                        **plan.as_json(),
                        "suggestions": [s.__dict__ for s in picks],
                        "note": "wave-model prediction, not a measurement; validate with knobfleet ab",
                    }
                )
            )
            return EXIT_OK
        _out(
            report_knobs.waves_table(
                plan.rows, plan.sms, plan.heads, app.knob_dict(plan.knobs), plan.cliffs, plan.calibration_note
            )
        )
        _out("\nThis is a prediction from the wave model, not a measurement: validate each pick with `knobfleet ab`.")
        rows = [[s.target_ctas, f"{s.weighted_cost:.5f}", f"{s.relative:+.1%}", s.written or "-"] for s in picks]
        _out(report_text.table(["TARGET_CTAS", "weighted cost/req", "vs current", "profile written"], rows, "rrrl"))
        return EXIT_OK
    if args.json:
        _out(report_text.to_json(plan.as_json()))
    else:
        _out(
            report_knobs.waves_table(
                plan.rows, plan.sms, plan.heads, app.knob_dict(plan.knobs), plan.cliffs, plan.calibration_note
            )
        )
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("render", help="print what a profile renders to on a host")
    p.add_argument("profile", help="profile name or path")
    inventory_opts(p, limit=False)
    p.add_argument("--host", default=None, help="one host (default: every host)")
    p.add_argument(
        "--what",
        choices=["script", "unit", "env", "argv", "vars"],
        default="script",
        help="what to print: script, unit, env, argv, or vars: the profile, its engine and the inventory's engine "
        "groups (knob_serve_groups) as extra vars (tagged !unsafe) for plain ansible-playbook (-e @FILE)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("waves", help="predict split-K wave quantization per batch size")
    p.add_argument("profile", nargs="?", help="profile whose kernel knobs to plan (or give --knob)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="a kernel knob (repeatable)")
    p.add_argument("--gpu", default=None, help="GPU name from the catalog (default: the profile's fingerprint)")
    p.add_argument("--sms", type=argtypes.POSITIVE, default=None, help="SM count for a GPU not in the catalog")
    p.add_argument("--heads", type=argtypes.POSITIVE, default=64, help="attention heads (64)")
    p.add_argument("--batch", default="1,8,48,64,80,96", help="batch sizes, comma-separated")
    p.add_argument("--context", type=argtypes.POSITIVE, default=4096, help="context length in tokens (4096)")
    p.add_argument("--suggest", action="store_true", help="rank TARGET_CTAS values for --weights")
    p.add_argument(
        "--weights", type=weights_option, default="48=0.3,64=0.3,80=0.3,96=0.1", help="traffic share per batch size"
    )
    p.add_argument("--top", type=argtypes.POSITIVE, default=3, help="with --suggest: how many values to keep (3)")
    p.add_argument("--no-write", action="store_true", help="with --suggest: do not write candidate profiles")
    p.add_argument("--no-calibration", action="store_true", help="use the uncalibrated wave model")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_waves)
