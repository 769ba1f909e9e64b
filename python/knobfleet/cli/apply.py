"""``apply`` / ``plan`` (and the ``apply-profile`` console script)."""

from __future__ import annotations

import argparse
from typing import Any

from knobfleet import argtypes
from knobfleet.cli import common
from knobfleet.cli.common import Sub, inventory_opts, via_opt
from knobfleet.cli.common import out as _out
from knobfleet.errors import LockHeld, UsageError


def cmd_apply(args: argparse.Namespace) -> int:
    from knobfleet.ops import fleet

    inventory = common.inventory(args)
    door = fleet.door(inventory, args.via)
    door.warm_up(args.limit)  # the pre-check's probes start now, while the rest loads
    from knobfleet import report_rollout, report_text
    from knobfleet.ops import apply as apply_uc
    from knobfleet.ops import interrupts
    from knobfleet.ops import profiles as app
    from knobfleet.ops.precheck import Options
    from knobfleet.ops.transaction import RestoreFailed
    from knobfleet.progress import Progress

    profile = app.store().resolve(args.profile)
    check_gate_options(args, profile)  # before any host is touched
    hosts = fleet.hosts(inventory, args.limit)
    overrides: dict[str, int] = {}
    if getattr(args, "readiness_timeout", None) is not None:
        overrides["knob_serve_readiness_timeout_s"] = args.readiness_timeout
    if getattr(args, "grace", None) is not None:
        overrides["knob_serve_readiness_grace_s"] = args.grace
    opts = Options(
        check=args.check,
        serial=getattr(args, "serial", None),
        canary=getattr(args, "canary", False),
        max_fail_percent=getattr(args, "max_fail_percent", 0.0),
        break_lock=args.break_lock,
        rollback_fleet=getattr(args, "rollback_fleet", False),
        via=args.via,
        foreign_dropins=args.foreign_dropins,
        overrides=overrides,
        force_restart=getattr(args, "force_restart", False),
        gate=None,
        announce=None if args.json or args.check else _say,
    )
    if not args.check:
        if common.will_ask(args):  # the restarts and their cost, from a plan, before the question
            from dataclasses import replace

            _say(apply_uc.apply(profile, hosts, door, replace(opts, check=True, announce=None)).cost.lines())
        common.confirm("apply", f"Apply {profile.ref} to {len(hosts)} host(s)?", len(hosts), args)
        opts = replace_gate(opts, _gate_judge(args, profile, inventory))
    try:
        with interrupts.handled(), Progress(enabled=not args.json) as progress:
            result = apply_uc.apply(profile, hosts, door, opts, on_event=progress)
    except (LockHeld, RestoreFailed, interrupts.Interrupted) as exc:
        if exc.report is not None:
            doc = exc.report  # an ApplyReport
            _out(report_text.to_json(doc.as_json()) if args.json else report_rollout.apply_summary(doc))
        raise
    if args.json:
        _out(report_text.to_json(result.as_json()))
    else:
        _out(report_rollout.apply_summary(result))
        if args.check and result.cost is not None:
            _out("\n".join(result.cost.lines()))
        for g in result.gates:
            _out(f"gate {g.host}: {'PASS' if g.passed else 'REJECT'} — {g.reason}")
    return interrupts.late(result.exit_code)


GATE_OPTIONS = ("baseline", "gate_conc")


def _say(lines: list[str]) -> None:
    """The rollout's restarts and their cost, on stderr (stdout is the report)."""
    import sys

    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def replace_gate(opts: Any, gate: Any) -> Any:
    from dataclasses import replace

    return replace(opts, gate=gate)


def check_gate_options(args: argparse.Namespace, profile: Any) -> None:
    """Gate settings are validated (and the baseline resolved) before anything changes: a gate that cannot run
    must not be found out after the fleet was changed."""
    from knobfleet.ops import profiles as app

    if not getattr(args, "gate", False):
        given = [f"--{o.replace('_', '-')}" for o in GATE_OPTIONS if getattr(args, o, None) is not None]
        if given:
            raise UsageError(f"{given[0]}: a gate option without --gate; add --gate or drop it")
        return
    base_name = args.baseline or profile.gate.baseline
    if not base_name:
        raise UsageError(f"--gate: {profile.ref} names no gate baseline; pass --baseline PROFILE (nothing was changed)")
    app.store().resolve(base_name)  # a missing or invalid baseline is refused here, not after the apply


def _gate_judge(args: argparse.Namespace, profile: Any, inventory: Any) -> Any:
    """``--gate``: the judge the rollout runs as a step of each batch (experiment/gate.py), or None."""
    if args.check or not getattr(args, "gate", False):
        return None
    from knobfleet.cli.parse import parse_int_list
    from knobfleet.experiment.bench.run import BenchSpec
    from knobfleet.experiment.gate import gate_judge
    from knobfleet.ops import profiles as app

    base_name = args.baseline or profile.gate.baseline
    if not base_name:
        raise UsageError(f"--gate: {profile.ref} names no gate baseline; pass --baseline PROFILE")
    spec = BenchSpec(
        conc=tuple(parse_int_list(args.gate_conc, "--gate-conc"))
        if args.gate_conc
        else tuple(profile.gate.concurrency),
        n_mult=args.gate_n_mult,
        max_tokens=args.gate_max_tokens,
    )
    return gate_judge(
        profile, app.store().resolve(base_name), inventory, spec, args.gate_repeats, progress=not args.json
    )


def cmd_plan(args: argparse.Namespace) -> int:
    args.check = True
    return cmd_apply(args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="profile name (profiles/NAME.yaml) or path")
    inventory_opts(p)
    via_opt(p, "the pre-check (ansible: no pre-check, the playbook decides on every host)")
    p.add_argument(
        "--foreign-dropins",
        choices=("fail", "remove"),
        default=None,
        help="a drop-in knobfleet did not write: fail = refuse the host, change nothing (default, or the host's "
        "knob_serve_foreign_dropins); remove = move it into the new generation's backup (rollback puts it back)",
    )
    common.json_opt(p)
    p.add_argument("--break-lock", action="store_true", help="break a lock left by a killed applier")


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "apply", aliases=["apply-profile"], help="apply a profile to hosts (also the apply-profile command)"
    )
    _common(p)
    p.add_argument("--check", action="store_true", help="plan only: change nothing (exit 2 when changes pending)")
    p.add_argument("--diff", action="store_true", help="with --check: show file diffs")
    p.add_argument("--serial", type=argtypes.serial, default=None, help="batch size: N hosts or N%% at a time")
    p.add_argument("--canary", action="store_true", help="one host first, then the rest")
    p.add_argument(
        "--force-restart",
        action="store_true",
        help="behind a router: when a drain times out, restart anyway and count the requests dropped "
        "(default: the host fails and stays in service on its old generation)",
    )
    p.add_argument(
        "--max-fail-percent",
        type=argtypes.PERCENT,
        default=0.0,
        help="failed hosts tolerated before the rollout stops (default 0)",
    )
    common.yes_opt(p)
    p.add_argument(
        "--gate",
        action="store_true",
        help="after applying, run the consistency check and a benchmark against the baseline; "
        "a rejected host goes back to its previous generation",
    )
    p.add_argument("--baseline", default=None, help="gate baseline profile (default: the profile's gate.baseline)")
    p.add_argument(
        "--gate-conc",
        type=argtypes.checked(argtypes.int_list),
        default=None,
        help="gate buckets (default: the profile's gate.concurrency)",
    )
    p.add_argument(
        "--gate-n-mult", type=argtypes.POSITIVE, default=4, help="gate: requests per bucket = N x concurrency (4)"
    )
    p.add_argument("--gate-max-tokens", type=argtypes.POSITIVE, default=256, help="gate: tokens per request (256)")
    p.add_argument("--gate-repeats", type=argtypes.POSITIVE, default=2, help="gate: bench runs per profile (2)")
    p.add_argument(
        "--rollback-fleet", action="store_true", help="when a batch fails, also restore the hosts of earlier batches"
    )
    p.add_argument("--readiness-timeout", type=argtypes.POSITIVE, default=None, metavar="S",
                   help="readiness deadline in seconds (default: knob_serve_readiness_timeout_s)")  # fmt: skip
    p.add_argument("--grace", type=argtypes.NON_NEGATIVE, default=None, metavar="S",
                   help="after readiness, watch S seconds that the engine stays up (default: "
                   "knob_serve_readiness_grace_s)")  # fmt: skip
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("plan", help="what `apply` would change (= apply --check --diff) and what its restarts cost")
    _common(p)
    p.add_argument(
        "--serial", type=argtypes.serial, default=None, help="price the rollout in batches of N hosts or N%%"
    )
    p.add_argument("--canary", action="store_true", help="price the rollout with one host first")
    p.set_defaults(func=cmd_plan, diff=True, max_fail_percent=0.0, yes=True)
