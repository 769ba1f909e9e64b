"""The console script's entry (``knobfleet``, ``python -m knobfleet``): for the read-only commands, the probes the
same command line started last time are launched before argparse and the heavy imports (headstart.py), then the
command runs as usual. Standard library only up to that point.

The cyclic garbage collector is off while the command line's modules load: an import builds thousands of objects
and frees none of them, so every collection it triggers is wasted (~10% of a one-shot ``drift``'s controller CPU,
docs/PERFORMANCE.md). A one-shot read (the command lines the head start serves: ``drift``/``verify`` without
``--watch``) keeps it off to its end, its garbage bounded by the hosts' answers; every other command turns it back
on before it runs.

SIGTERM is Ctrl-C from the first line on: a SIGTERM that arrives while the command line's modules load, before a
command installs its own handling (``ops/interrupts.py``), ends the run as an interrupt (exit 130, "interrupted"),
never as a process killed by the signal with nothing said."""

from __future__ import annotations

import gc
import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, kept here so nothing but the standard library loads first


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return _main()
    except KeyboardInterrupt:  # before the command's own boundary (cli.run) was reached
        sys.stderr.write("knobfleet: interrupted\n")
        return EXIT_INTERRUPTED


def _main() -> int:
    gc.disable()
    one_shot = False
    try:
        from knobfleet import headstart

        headstart.start(sys.argv[1:])
        one_shot = headstart.INVOCATION[0] is not None
    except Exception:  # a head start that fails costs only the head start
        pass
    from knobfleet.cli import main as cli_main

    if not one_shot:  # a long command collects as usual
        gc.enable()
    return cli_main()
