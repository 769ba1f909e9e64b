"""A stand-in scheduler / detokenizer process: renames itself like SGLang's (``setproctitle``), then holds
the inherited environment until its parent exits."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from .proctitle import set_proctitle

PR_SET_PDEATHSIG = 1


def main() -> int:
    name = sys.argv[-1] if len(sys.argv) > 1 else "sglang::worker"
    # The launcher passes its PID: one that died before this process set PDEATHSIG is not waited for.
    parent = int(sys.argv[-2]) if len(sys.argv) > 2 and sys.argv[-2].isdigit() else os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent:
        return 0
    set_proctitle(name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while os.getppid() == parent:
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
