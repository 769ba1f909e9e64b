"""``init DIR``: make a fleet repository of one's own (knobfleet.toml, profiles/, inventories/, ansible.cfg)."""

from __future__ import annotations

import argparse
from pathlib import Path

from knobfleet.cli.common import Sub
from knobfleet.cli.common import out as _out
from knobfleet.errors import EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    from knobfleet import paths, project
    from knobfleet.errors import UsageError
    from knobfleet.module_utils.knob_redact import secret_shape

    shape = secret_shape(args.name)
    if shape:  # the name goes into knobfleet.toml and README.md, in git
        raise UsageError(f"--name: the value looks like a secret ({shape}); name the project (nothing was written)")
    written = project.init(Path(args.directory), args.name, args.force)
    root = written[0].parent
    for path in written:
        _out(f"wrote {paths.display(path)}")
    _out(
        f"knobfleet project {args.name or root.name!r} in {paths.display(root)}: edit inventories/hosts.yml, then "
        f"`cd {paths.display(root)} && knobfleet profiles validate && knobfleet plan mybase`"
    )
    return EXIT_OK


def register(sub: Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("init", help="create a fleet repository of your own (knobfleet.toml, profiles, inventory)")
    p.add_argument("directory", metavar="DIR", help="folder to create the project in (made when missing)")
    p.add_argument("--name", default=None, help="project name (default: the folder's name)")
    p.add_argument("--force", action="store_true", help="overwrite files knobfleet init would write")
    p.set_defaults(func=cmd_init)
