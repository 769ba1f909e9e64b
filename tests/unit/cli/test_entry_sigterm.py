"""SIGTERM is Ctrl-C from the console script's first line (knobfleet/_entry.py): one that arrives while the modules
load, before a command's own handling, ends the run as an interrupt (exit 130, one line), not as a process the
signal killed with nothing said (a routed apply's controller SIGTERMed 3 s after its start exited -15 under load)."""

from __future__ import annotations

import subprocess
import sys

from knobfleet import __version__

EARLY = (
    "import os, signal, sys\n"
    "from knobfleet import _entry\n"
    "def loading():\n"
    "    os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` or systemd's stop would, mid-import\n"
    "    import time\n"
    "    time.sleep(5)\n"
    "    return 0\n"
    "_entry._main = loading\n"
    "sys.exit(_entry.main())\n"
)


def test_a_sigterm_before_the_command_runs_is_an_interrupt() -> None:
    proc = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stderr) == (130, "knobfleet: interrupted\n")


def test_a_command_still_runs_and_exits_as_it_says() -> None:
    proc = subprocess.run([sys.executable, "-m", "knobfleet", "--version"], capture_output=True, text=True, timeout=60)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 0 and proc.stdout.strip().startswith(f"knobfleet {__version__}"), shown
