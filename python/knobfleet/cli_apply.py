"""``apply`` / ``plan`` (and the ``apply-profile`` console script)."""

from __future__ import annotations

import argparse
import sys

from knobfleet.errors import KnobfleetError, LockHeld


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _confirm(n_hosts: int, profile: str, args: argparse.Namespace) -> None:
    if args.yes or args.check or args.json or n_hosts <= 1 or not sys.stdin.isatty():
        return
    answer = input(f"Apply {profile} to {n_hosts} hosts? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise KnobfleetError("apply: cancelled; nothing was changed")


def cmd_apply(args: argparse.Namespace) -> int:
    from knobfleet import app, paths, report
    from knobfleet import apply as apply_uc
    from knobfleet.progress import Progress
    from knobfleet.transaction import RestoreFailed

    profile = app.store().resolve(args.profile)
    inventory = args.inventory or paths.default_inventory()
    hosts = app.hosts(inventory, args.limit)
    _confirm(len(hosts), profile.ref, args)
    overrides: dict[str, int] = {}
    if getattr(args, "readiness_timeout", None) is not None:
        overrides["knob_serve_readiness_timeout_s"] = args.readiness_timeout
    if getattr(args, "grace", None) is not None:
        overrides["knob_serve_readiness_grace_s"] = args.grace
    try:
        with Progress(enabled=not args.json) as progress:
            result = apply_uc.apply(
                profile,
                hosts,
                inventory,
                check=args.check,
                serial=args.serial,
                canary=args.canary,
                max_fail_percent=args.max_fail_percent,
                break_lock=args.break_lock,
                on_event=progress,
                overrides=overrides,
                rollback_fleet=getattr(args, "rollback_fleet", False),
            )
    except (LockHeld, RestoreFailed) as exc:
        if exc.report is not None:
            doc = exc.report  # an ApplyReport
            _out(report.to_json(doc.as_json()) if args.json else report.apply_summary(doc))
        raise
    if args.json:
        _out(report.to_json(result.as_json()))
    else:
        _out(report.apply_summary(result))
    return result.exit_code


def cmd_plan(args: argparse.Namespace) -> int:
    args.check = True
    return cmd_apply(args)


def _common(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("profile", help="profile name (profiles/NAME.yaml) or path")
    p.add_argument("-i", "--inventory", type=Path, default=None, help="Ansible inventory (default: inventories/lab)")
    p.add_argument("--limit", "-l", default=None, help="Ansible host pattern")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.add_argument("--break-lock", action="store_true", help="break a lock left by a killed applier")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("apply", help="apply a profile to hosts (alias: apply-profile)")
    _common(p)
    p.add_argument("--check", action="store_true", help="plan only: change nothing (exit 2 when changes pending)")
    p.add_argument("--diff", action="store_true", help="with --check: show file diffs")
    p.add_argument("--serial", default=None, help="batch size: N hosts or N%% at a time")
    p.add_argument("--canary", action="store_true", help="one host first, then the rest")
    p.add_argument(
        "--max-fail-percent",
        type=float,
        default=0.0,
        help="failed hosts tolerated before the rollout stops (default 0)",
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--rollback-fleet", action="store_true", help="when a batch fails, also restore the hosts of earlier batches"
    )
    p.add_argument(
        "--readiness-timeout",
        type=int,
        default=None,
        metavar="S",
        help="readiness deadline in seconds (default: knob_serve_readiness_timeout_s)",
    )
    p.add_argument(
        "--grace",
        type=int,
        default=None,
        metavar="S",
        help="after readiness, watch S seconds that the engine stays up (default: knob_serve_readiness_grace_s)",
    )
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("plan", help="what `apply` would change (= apply --check --diff)")
    _common(p)
    p.set_defaults(func=cmd_plan, diff=True, serial=None, canary=False, max_fail_percent=0.0, yes=True)
