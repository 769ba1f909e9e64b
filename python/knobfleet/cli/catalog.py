"""``catalog sync ENGINE``: regenerate an engine's catalog from the engine's own registry (pinned version, or
``--version V``: kept next to it as ``generated/ENGINE@V.yaml``); ``catalog versions ENGINE``: the synced ones;
``catalog diff ENGINE V1 V2``: what an upgrade changes.

SGLang's catalog comes from its wheel's source by default; ``--from-install [VENV_PYTHON]`` reads it from an
installed SGLang instead, by import (default: the lab's install, ``knobfleet.lab.sglang_install``). The two are
compared in docs/sglang-catalog-diff.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from knobfleet import argtypes
from knobfleet.cli import types
from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK, KnobfleetError, UsageError

# --from-install given without a value: the lab's SGLang install (resolved only then).
LAB_INSTALL = "lab"


def lab_sglang_python(version: str | None = None) -> Path:
    """The python of the lab's SGLang install of ``version`` (default: its pinned one), whether or not built."""
    from knobfleet.lab import sglang_install

    return sglang_install.layout(version or sglang_install.SGLANG_VERSION).python


def cmd_catalog_sync(args: argparse.Namespace) -> int:
    from knobfleet import paths
    from knobfleet.engines import sync

    out_dir = Path(args.out_dir) if args.out_dir else paths.catalogs_dir() / "generated"
    from_install = getattr(args, "from_install", None)
    if from_install is None:
        path = sync.sync(args.engine, out_dir, version=args.version)
        origin = f"{args.engine} {args.version or sync.pinned_version(args.engine)}"
    else:
        if args.engine != "sglang":
            raise UsageError(
                f"--from-install is for sglang only ({args.engine}'s catalog always comes from its install)"
            )
        python = lab_sglang_python(args.version) if from_install == LAB_INSTALL else Path(from_install)
        if from_install == LAB_INSTALL and not python.exists():
            raise KnobfleetError(
                f"no SGLang install at {python.parent.parent}: build it with python -m knobfleet.lab.sglang_install, "
                "or name a venv's python: --from-install VENV/bin/python"
            )
        path = sync.sync(args.engine, out_dir, version=args.version, from_install=python)
        origin = f"sglang {args.version or sync.pinned_version('sglang')} installed for {python}"
    _out(f"{paths.display(path)}: regenerated from {origin}")
    return EXIT_OK


def cmd_catalog_versions(args: argparse.Namespace) -> int:
    from knobfleet import report_text
    from knobfleet.ops import profiles as app
    from knobfleet.profiles import catalog as catalogs

    st = app.store()
    have = catalogs.synced_versions(args.engine, st.catalog_dir)
    pinned = catalogs.catalog_for(args.engine, st.catalog_dir).version
    if args.json:
        _out(report_text.to_json({"engine": args.engine, "pinned": pinned, "versions": have}))
    else:
        _out("\n".join(f"{v}{'  (pinned)' if v == pinned else ''}" for v in have) or f"no synced {args.engine} catalog")
    return EXIT_OK


def cmd_catalog_diff(args: argparse.Namespace) -> int:
    from knobfleet import report_knobs, report_text
    from knobfleet.ops import profiles as app
    from knobfleet.profiles import catalog as catalogs
    from knobfleet.profiles import versions

    st = app.store()
    old = catalogs.catalog_for(args.engine, st.catalog_dir, args.old)
    new = catalogs.catalog_for(args.engine, st.catalog_dir, args.new)
    d = versions.diff(old, new)
    if args.json:
        _out(report_text.to_json(d.as_json()))
        return EXIT_OK
    _out(report_knobs.catalog_diff(d))
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    cat = sub.add_parser("catalog", help="engine catalogs: which knobs an engine reads")
    csub = cat.add_subparsers(dest="catalog_command", metavar="SUBCOMMAND", required=True)
    p = csub.add_parser(
        "sync", help="regenerate profiles/catalogs/generated/ENGINE.yaml from the engine's own registry"
    )
    p.add_argument(
        "engine", choices=("vllm", "sglang"), help="vllm: from an installed vLLM; sglang: its wheel's source"
    )
    p.add_argument("--version", type=types.VERSION, default=None, help="engine version (default: the pinned one)")
    p.add_argument(
        "--from-install",
        nargs="?",
        const=LAB_INSTALL,
        default=None,
        metavar="VENV_PYTHON",
        help="sglang: read the registry from an installed SGLang by importing it, under VENV_PYTHON (default: the "
        "lab's install, python -m knobfleet.lab.sglang_install builds it), instead of from its wheel's source",
    )
    p.add_argument(
        "--out-dir",
        type=argtypes.output_dir,
        default=None,
        metavar="DIR",
        help="write DIR/ENGINE.yaml instead (default: the shipped profiles/catalogs/generated)",
    )
    p.set_defaults(func=cmd_catalog_sync)
    p = csub.add_parser("versions", help="the engine versions with a synced catalog")
    p.add_argument("engine", type=types.ENGINE, help="engine name (vllm, sglang)")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_catalog_versions)
    p = csub.add_parser(
        "diff", help="knobs added, removed, renamed and changed between two engine versions, and metric renames"
    )
    p.add_argument("engine", type=types.ENGINE, help="engine name (vllm, sglang)")
    p.add_argument("old", type=types.VERSION, metavar="V1", help="the version upgraded from (a synced catalog)")
    p.add_argument("new", type=types.VERSION, metavar="V2", help="the version upgraded to")
    p.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    p.set_defaults(func=cmd_catalog_diff)
