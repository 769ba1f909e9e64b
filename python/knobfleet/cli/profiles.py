"""``profiles list|show|validate|lock|migrate|schema``."""

from __future__ import annotations

import argparse

from knobfleet.cli import types
from knobfleet.cli.common import Sub
from knobfleet.cli.common import err as _err
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK


def cmd_profiles_list(args: argparse.Namespace) -> int:
    from knobfleet import paths, report_knobs, report_text
    from knobfleet.ops import profiles as app
    from knobfleet.profiles.loader import load_doc

    st = app.store()
    docs = [load_doc(st.path_of(name)) for name in st.names()]
    if args.json:
        items = [
            {"name": d.name, "version": d.version, "extends": d.extends, "description": d.description, "path": str(p)}
            for d, p in zip(docs, (st.path_of(n) for n in st.names()), strict=True)
        ]
        _out(report_text.to_json({"directory": str(st.directory), "profiles": items}))
        return EXIT_OK
    rows = [(d.name, str(d.version), d.extends or "-", d.description[:60]) for d in docs]
    _out(report_knobs.profile_list(rows) if rows else f"no profiles in {paths.display(st.directory)}")
    return EXIT_OK


def cmd_profiles_show(args: argparse.Namespace) -> int:
    from knobfleet import report_knobs, report_text
    from knobfleet.ops import profiles as app

    st = app.store()
    profile = st.resolve(args.name)
    if args.json:
        _out(report_text.to_json({**profile.model_dump(mode="json"), "hash": profile.content_hash}))
    else:
        _out(report_knobs.profile_show(profile, st.read_lock().get(profile.ref)))
    return EXIT_OK


def cmd_profiles_validate(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.errors import EXIT_ERROR, ProfileError
    from knobfleet.ops import profiles as app

    if args.json:
        try:
            result = app.validate_profiles(args.names)
        except ProfileError as exc:
            _out(report_text.to_json({"ok": False, "problems": exc.problems, "profiles": []}))
            return EXIT_ERROR
        profiles = [
            {"ref": p.ref, "hash": p.content_hash, "chain": list(p.chain), "locked": p.ref not in result.unlocked}
            for p in result.ok
        ]
        _out(report_text.to_json({"ok": True, "problems": [], "profiles": profiles}))
        return EXIT_OK
    result = app.validate_profiles(args.names)
    for p in result.ok:
        _out(f"ok  {p.ref:<16} {p.content_hash[:19]}…  ({' -> '.join(p.chain)})")
    for ref in result.unlocked:
        _err(f"warning: {ref} is not in profiles/profiles.lock yet; run `knobfleet profiles lock` to publish it")
    return EXIT_OK


def cmd_profiles_lock(args: argparse.Namespace) -> int:
    from knobfleet.ops import profiles as app

    lock, added = app.store().write_lock()
    for ref in added:
        _out(f"locked {ref} {lock[ref]}")
    _out(f"{len(lock)} versions in profiles/profiles.lock ({len(added)} new)")
    return EXIT_OK


def cmd_profiles_schema(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.ops import profiles as app

    _out(report_text.to_json(app.profile_schema()))
    return EXIT_OK


def cmd_profiles_migrate(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.ops import profiles as app

    result = app.migrate(args.name, args.to, write=not args.dry_run, source=args.source)
    if args.json:
        _out(report_text.to_json(result.as_json()))
        return EXIT_OK
    for m in result.moves:
        where = " (inherited: overridden in this file)" if m.inherited else ""
        dashes = "--" if m.section == "args" else ""
        if m.new_name:
            _out(f"  {m.section}.{dashes}{m.name} -> {dashes}{m.new_name}{where}")
        else:
            _out(f"  {m.section}.{dashes}{m.name}: REMOVED in {result.target} ({m.note}); left out, with a comment "
                 f"in the file{where}")  # fmt: skip
    _out(result.summary)
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    prof = sub.add_parser("profiles", help="list, show, validate and lock profiles")
    psub = prof.add_subparsers(dest="profiles_command", metavar="SUBCOMMAND", required=True)
    p = psub.add_parser("list", help="every profile with version and parent")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_profiles_list)
    p = psub.add_parser("show", help="the resolved profile (inheritance applied)")
    p.add_argument("name", help="profile name or path")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_profiles_show)
    p = psub.add_parser("validate", help="validate profiles (all when none named)")
    p.add_argument("names", nargs="*", metavar="NAME|PATH", help="profiles to validate (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON document: ok, problems (one line each), profiles")
    p.set_defaults(func=cmd_profiles_validate)
    p = psub.add_parser("lock", help="record new profile versions in profiles/profiles.lock")
    p.set_defaults(func=cmd_profiles_lock)
    p = psub.add_parser(
        "migrate", help="write the next version of a profile for another engine version (renamed knobs mapped)"
    )
    p.add_argument("name", help="profile name or path")
    p.add_argument("--to", required=True, metavar="ENGINE@VERSION", help="the engine version, e.g. vllm@0.32.0")
    p.add_argument(
        "--from", dest="source", type=types.VERSION, default=None, metavar="VERSION",
        help="the engine version the profile is valid on (default: its fingerprint.engine_version, else pinned)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_profiles_migrate)
    p = psub.add_parser("schema", help="JSON Schema of a profile file, for editors")
    p.set_defaults(func=cmd_profiles_schema)
