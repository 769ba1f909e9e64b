"""The console script's entry (``knobfleet``, ``python -m knobfleet``): for the read-only commands, the probes the
same command line started last time are launched before argparse and the heavy imports
(headstart.py), then the command runs as usual. Standard library only up to that point."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from knobfleet import headstart

        headstart.start(sys.argv[1:])
    except Exception:  # a head start that fails costs only the head start
        pass
    from knobfleet.cli import main as cli_main

    return cli_main()
