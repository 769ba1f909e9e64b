"""``apply`` / ``plan`` (and the ``apply-profile`` console script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
    from knobfleet import drift, paths

    inventory = args.inventory or paths.default_inventory()
    # The in-sync pre-check's probes start now (read-only), while the rest of the command loads.
    early, plan_key = drift.start_early(inventory, args.limit, args.via) if inventory.exists() else ({}, None)
    try:
        return _apply(args, inventory, early, plan_key)
    finally:
        drift.stop_unused(early)


def _apply(args: argparse.Namespace, inventory: Path, early: Any, plan_key: str | None) -> int:
    from knobfleet import app, report
    from knobfleet import apply as apply_uc
    from knobfleet.progress import Progress
    from knobfleet.transaction import RestoreFailed

    profile = app.store().resolve(args.profile)
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
                via=args.via,
                early=early,
                plan_key=plan_key,
            )
    except (LockHeld, RestoreFailed) as exc:
        if exc.report is not None:
            doc = exc.report  # an ApplyReport
            _out(report.to_json(doc.as_json()) if args.json else report.apply_summary(doc))
        raise
    gates = _run_gate(args, profile, hosts, inventory, result) if getattr(args, "gate", False) else []
    if args.json:
        doc = result.as_json()
        if gates:
            doc["gate"] = [g.as_json() for g in gates]
            doc["exit_code"] = result.exit_code if all(g.passed for g in gates) else 1
        _out(report.to_json(doc))
    else:
        _out(report.apply_summary(result))
        for g in gates:
            _out(f"gate {g.host}: {'PASS' if g.passed else 'REJECT'} — {g.reason}")
    if any(not g.passed for g in gates):
        return 1
    return result.exit_code


def _run_gate(args: argparse.Namespace, profile, hosts, inventory, result):  # type: ignore[no-untyped-def]
    """Benchmark gate after a successful apply; a rejected host is restored to its previous generation."""
    from knobfleet import app
    from knobfleet.bench.run import BenchSpec
    from knobfleet.gate import gate_host
    from knobfleet.transaction import RestoreFailed, RestoreTarget, restore

    if args.check or result.exit_code != 0:
        return []
    base_name = args.baseline or profile.gate.baseline
    if not base_name:
        raise KnobfleetError(f"--gate: {profile.ref} names no gate baseline; pass --baseline PROFILE")
    baseline = app.store().resolve(base_name)
    spec = BenchSpec(
        conc=tuple(app.parse_int_list(args.gate_conc, "--gate-conc"))
        if args.gate_conc
        else tuple(profile.gate.concurrency),
        n_mult=args.gate_n_mult,
        max_tokens=args.gate_max_tokens,
    )
    by_name = {hv.host: hv for hv in hosts}
    gates, targets = [], {}
    for o in result.hosts:
        if o.status not in ("applied", "unchanged"):
            continue
        g = gate_host(profile, baseline, by_name[o.host], inventory, spec, args.gate_repeats)
        gates.append(g)
        if not g.passed:
            new_gen = o.generation is not None and o.generation != o.previous
            targets[o.host] = RestoreTarget(o.previous if new_gen else None, f"gate: {g.reason}", "failed", "restore")
    if targets:
        outcomes = restore(hosts, inventory, targets)
        broken = [r for r in outcomes if not r.ok]
        if broken:
            raise RestoreFailed(
                "\n".join(f"{r.host}: gate rejected the profile and the restore failed: {r.message}" for r in broken),
                broken,
            )
        restored = {r.host: r for r in outcomes}
        for o in result.hosts:
            if o.host in restored:
                o.status, o.restored = "failed", restored[o.host]
                o.message = "gate rejected: " + next(g.reason for g in gates if g.host == o.host)
    return gates


def cmd_plan(args: argparse.Namespace) -> int:
    args.check = True
    return cmd_apply(args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="profile name (profiles/NAME.yaml) or path")
    p.add_argument("-i", "--inventory", type=Path, default=None, help="Ansible inventory (default: inventories/lab)")
    p.add_argument("--limit", "-l", default=None, help="Ansible host pattern")
    p.add_argument(
        "--via",
        choices=("auto", "ansible"),
        default="auto",
        help="auto (default): first probe every host over SSH and leave hosts already in sync alone; "
        "ansible: run the playbook on every host",
    )
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
        "--gate",
        action="store_true",
        help="after applying, run the consistency check and a benchmark against the baseline; "
        "a rejected host goes back to its previous generation",
    )
    p.add_argument("--baseline", default=None, help="gate baseline profile (default: the profile's gate.baseline)")
    p.add_argument("--gate-conc", default=None, help="gate buckets (default: the profile's gate.concurrency)")
    p.add_argument("--gate-n-mult", type=int, default=4)
    p.add_argument("--gate-max-tokens", type=int, default=256)
    p.add_argument("--gate-repeats", type=int, default=2)
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
