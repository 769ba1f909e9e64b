"""An apply that changes nothing (the idempotent path) on 3 and on 16 hosts, interleaved per size.

Prints medians and the 16-host / 3-host ratio (target <= 1.5x: cost must not grow linearly with hosts).
Usage: python perf/no_change_apply.py [--sizes 3,16] [--repeats 5]
"""

from __future__ import annotations

import argparse

from _lab import CPU, KNOBFLEET, boot, med, run, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    _lab, inv = boot(max(sizes))
    cmd = [*KNOBFLEET, "apply", "ctas512", "-i", str(inv), "--yes"]
    run(cmd)  # first apply: adopt and change everything
    times: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(args.repeats):
        for n in sizes if r % 2 == 0 else reversed(sizes):
            limit = ",".join(f"lab{i}" for i in range(1, n + 1))
            times[n].append(run([*cmd, "--limit", limit]))
            cpu[n].append(CPU[-1])
    first = sizes[0]
    rows = [
        [
            n,
            len(times[n]),
            f"{med(times[n]):.2f}",
            f"{med(times[n]) / med(times[first]):.2f}x",
            f"{med(cpu[n]):.2f}",
            f"{med(cpu[n]) / med(cpu[first]):.2f}x",
        ]
        for n in sizes
    ]
    print("no-change apply (changed=0, no restart); lab hosts run on the controller's own cores")
    print(table(["hosts", "runs", "wall median s", f"wall vs {first}", "controller CPU s", f"CPU vs {first}"], rows))


if __name__ == "__main__":
    main()
