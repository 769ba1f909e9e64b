"""Shared helpers for perf scripts: boot a lab of N hosts, run commands, summarise timings."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from knobfleet.lab.nspawn import Lab  # noqa: E402

KNOBFLEET = [sys.executable, "-m", "knobfleet"]


BOOTED: list[int] = []  # the sizes booted, in order: the last one is what stays up


def boot(n: int) -> tuple[Lab, Path]:
    """A lab of exactly n hosts (other lab hosts are stopped first), engines ready."""
    lab = Lab()
    lab.down()
    lab.up(n)
    sys.path.insert(0, str(REPO))
    from tests.integration.conftest import wait_engines

    wait_engines([lab.host(i).address for i in range(1, n + 1)], timeout=120)
    if not BOOTED:
        import atexit

        atexit.register(lambda: print(f"perf: the {BOOTED[-1]}-host lab stays up for the next run; `knobfleet lab "
                                      "down` stops it", file=sys.stderr))  # fmt: skip
    BOOTED.append(n)
    return lab, lab.dir / "inventory"


CPU: list[float] = []  # controller CPU seconds (user + sys of the command and its children) per run()


def run(cmd: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> float:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return took


def interleave(paths: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each path once per round, in rotating order, ``repeats`` rounds."""
    names = list(paths)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            out[name].append(paths[name]())
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
