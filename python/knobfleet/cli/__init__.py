"""Thin command layer: parse, call one ``app`` function, print via ``report``, return the exit code.

Heavy imports (ansible, pydantic models, rich) happen inside the commands that need them, so
``knobfleet --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from knobfleet import __version__
from knobfleet.errors import EXIT_DRIFT, EXIT_OK, KnobfleetError

Handler = Callable[[argparse.Namespace], int]


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


# --- profiles -------------------------------------------------------------------------------


def cmd_profiles_list(args: argparse.Namespace) -> int:
    from knobfleet import app, report
    from knobfleet.profiles.loader import load_doc

    st = app.store()
    rows = []
    for name in st.names():
        doc = load_doc(st.path_of(name))
        rows.append((doc.name, str(doc.version), doc.extends or "-", doc.description[:60]))
    _out(report.profile_list(rows))
    return EXIT_OK


def cmd_profiles_show(args: argparse.Namespace) -> int:
    from knobfleet import app, report

    st = app.store()
    profile = st.resolve(args.name)
    if args.json:
        _out(report.to_json({**profile.model_dump(mode="json"), "hash": profile.content_hash}))
    else:
        _out(report.profile_show(profile, st.read_lock().get(profile.ref)))
    return EXIT_OK


def cmd_profiles_validate(args: argparse.Namespace) -> int:
    from knobfleet import app

    result = app.validate_profiles(args.names)
    for p in result.ok:
        _out(f"ok  {p.ref:<16} {p.content_hash[:19]}…  ({' -> '.join(p.chain)})")
    for ref in result.unlocked:
        _err(f"warning: {ref} is not in profiles/profiles.lock yet; run `knobfleet profiles lock` to publish it")
    return EXIT_OK


def cmd_profiles_lock(args: argparse.Namespace) -> int:
    from knobfleet import app

    lock, added = app.store().write_lock()
    for ref in added:
        _out(f"locked {ref} {lock[ref]}")
    _out(f"{len(lock)} versions in profiles/profiles.lock ({len(added)} new)")
    return EXIT_OK


def cmd_profiles_schema(args: argparse.Namespace) -> int:
    from knobfleet import app, report

    _out(report.to_json(app.profile_schema()))
    return EXIT_OK


# --- render / waves -------------------------------------------------------------------------


def cmd_render(args: argparse.Namespace) -> int:
    from knobfleet import app, report

    if args.what == "vars":
        from knobfleet.render import profile_vars
        from knobfleet.runner import dump_vars

        sys.stdout.write(dump_vars({}, {"knob_serve_profile": profile_vars(app.store().resolve(args.profile))}))
        return EXIT_OK
    rendered = app.render(args.profile, args.inventory, args.host)
    if args.json:
        _out(report.to_json([app.rendered_json(r) for r in rendered]))
        return EXIT_OK
    for r in rendered:
        if len(rendered) > 1:
            _out(f"# ---- {r.host} ----")
        if args.what == "script":
            sys.stdout.write(r.script)
        elif args.what == "unit":
            sys.stdout.write(r.unit)
        elif args.what == "env":
            _out("\n".join(f"{k}={v}" for k, v in r.env.items()))
        else:
            _out("\n".join(r.argv))
    return EXIT_OK


def cmd_waves(args: argparse.Namespace) -> int:
    from knobfleet import app, report

    if not args.profile and not args.knob:
        raise KnobfleetError(
            "waves: name a PROFILE or give --knob NAME=VALUE (e.g. --knob SGLANG_SM120_MMA_TARGET_CTAS=512)"
        )
    batches = app.parse_int_list(args.batch, "--batch")
    plan, profile = app.wave_plan(args.profile, args.knob, args.gpu, args.sms, args.heads, batches, args.context)
    if args.suggest:
        weights = app.parse_weights(args.weights)
        picks = app.suggest_ctas(plan, profile, weights, args.top, write=profile is not None and not args.no_write)
        if args.json:
            _out(
                report.to_json(
                    {
                        **plan.as_json(),
                        "suggestions": [s.__dict__ for s in picks],
                        "note": "wave-model prediction, not a measurement; validate with knobfleet ab",
                    }
                )
            )
            return EXIT_OK
        _out(report.waves_table(plan.rows, plan.sms, plan.heads, app.knob_dict(plan.knobs), plan.cliffs))
        _out("\nThis is a prediction from the wave model, not a measurement: validate each pick with `knobfleet ab`.")
        rows = [[s.target_ctas, f"{s.weighted_cost:.5f}", f"{s.relative:+.1%}", s.written or "-"] for s in picks]
        _out(report.table(["TARGET_CTAS", "weighted cost/req", "vs current", "profile written"], rows, "rrrl"))
        return EXIT_OK
    if args.json:
        _out(report.to_json(plan.as_json()))
    else:
        _out(report.waves_table(plan.rows, plan.sms, plan.heads, app.knob_dict(plan.knobs), plan.cliffs))
    return EXIT_OK


# --- parser -----------------------------------------------------------------------------------


def _inventory_opts(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument("-i", "--inventory", type=Path, default=None, help="Ansible inventory (default: inventories/lab)")
    if limit:
        p.add_argument("--limit", "-l", default=None, help="Ansible host pattern to restrict the run to")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="knobfleet", description="Deploy and verify GPU engine knob profiles.")
    parser.add_argument("--version", action="version", version=f"knobfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    prof = sub.add_parser("profiles", help="list, show, validate and lock profiles")
    psub = prof.add_subparsers(dest="profiles_command", metavar="SUBCOMMAND", required=True)
    p = psub.add_parser("list", help="every profile with version and parent")
    p.set_defaults(func=cmd_profiles_list)
    p = psub.add_parser("show", help="the resolved profile (inheritance applied)")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles_show)
    p = psub.add_parser("validate", help="validate profiles (all when none named)")
    p.add_argument("names", nargs="*", metavar="NAME|PATH")
    p.set_defaults(func=cmd_profiles_validate)
    p = psub.add_parser("lock", help="record new profile versions in profiles/profiles.lock")
    p.set_defaults(func=cmd_profiles_lock)
    p = psub.add_parser("schema", help="JSON Schema of a profile file, for editors")
    p.set_defaults(func=cmd_profiles_schema)

    p = sub.add_parser("render", help="print what a profile renders to on a host")
    p.add_argument("profile")
    _inventory_opts(p, limit=False)
    p.add_argument("--host", default=None, help="one host (default: every host)")
    p.add_argument(
        "--what",
        choices=["script", "unit", "env", "argv", "vars"],
        default="script",
        help="vars: the profile as extra vars (tagged !unsafe) for plain ansible-playbook",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("waves", help="predict split-K wave quantization per batch size")
    p.add_argument("profile", nargs="?")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--gpu", default=None, help="GPU name from the catalog (default: the profile's fingerprint)")
    p.add_argument("--sms", type=int, default=None, help="SM count for a GPU not in the catalog")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--batch", default="1,8,48,64,80,96")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--suggest", action="store_true", help="rank TARGET_CTAS values for --weights")
    p.add_argument("--weights", default="48=0.3,64=0.3,80=0.3,96=0.1")
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--no-write", action="store_true", help="with --suggest: do not write candidate profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_waves)

    _register_more(sub)
    return parser


def _register_more(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that live in their own modules (lab, apply, …)."""
    from knobfleet import cli_fleet

    cli_fleet.register(sub)


def run(argv: Sequence[str] | None, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_DRIFT
    try:
        return func(args)
    except KnobfleetError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _err("knobfleet: interrupted")
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv)


def apply_profile_main(argv: Sequence[str] | None = None) -> int:
    """``apply-profile PROFILE …`` is ``knobfleet apply PROFILE …``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return run(["apply", *args])
