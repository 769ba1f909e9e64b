"""``profiles list|show|validate|lock|schema``."""

from __future__ import annotations

import argparse

from knobfleet.cli.common import Sub
from knobfleet.cli.common import err as _err
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK


def cmd_profiles_list(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.ops import workspace as app
    from knobfleet.profiles.loader import load_doc

    st = app.store()
    rows = []
    for name in st.names():
        doc = load_doc(st.path_of(name))
        rows.append((doc.name, str(doc.version), doc.extends or "-", doc.description[:60]))
    _out(report.profile_list(rows))
    return EXIT_OK


def cmd_profiles_show(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.ops import workspace as app

    st = app.store()
    profile = st.resolve(args.name)
    if args.json:
        _out(report.to_json({**profile.model_dump(mode="json"), "hash": profile.content_hash}))
    else:
        _out(report.profile_show(profile, st.read_lock().get(profile.ref)))
    return EXIT_OK


def cmd_profiles_validate(args: argparse.Namespace) -> int:
    from knobfleet.ops import workspace as app

    result = app.validate_profiles(args.names)
    for p in result.ok:
        _out(f"ok  {p.ref:<16} {p.content_hash[:19]}…  ({' -> '.join(p.chain)})")
    for ref in result.unlocked:
        _err(f"warning: {ref} is not in profiles/profiles.lock yet; run `knobfleet profiles lock` to publish it")
    return EXIT_OK


def cmd_profiles_lock(args: argparse.Namespace) -> int:
    from knobfleet.ops import workspace as app

    lock, added = app.store().write_lock()
    for ref in added:
        _out(f"locked {ref} {lock[ref]}")
    _out(f"{len(lock)} versions in profiles/profiles.lock ({len(added)} new)")
    return EXIT_OK


def cmd_profiles_schema(args: argparse.Namespace) -> int:
    from knobfleet import report
    from knobfleet.ops import workspace as app

    _out(report.to_json(app.profile_schema()))
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
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
