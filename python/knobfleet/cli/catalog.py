"""``catalog sync ENGINE``: regenerate an engine's catalog from the engine's own registry (pinned version)."""

from __future__ import annotations

import argparse

from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK


def cmd_catalog_sync(args: argparse.Namespace) -> int:
    from knobfleet import paths
    from knobfleet.engines import sync

    path = sync.sync(args.engine, paths.catalogs_dir() / "generated", version=args.version)
    _out(f"{paths.display(path)}: regenerated from {args.engine} {args.version or sync.pinned_version(args.engine)}")
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
    p.add_argument("--version", default=None, help="engine version (default: the pinned one)")
    p.set_defaults(func=cmd_catalog_sync)
